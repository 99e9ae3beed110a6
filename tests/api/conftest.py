"""Databases for API tests: a fresh PostgreSQL database per session and a SQLite file.

A test runs on PostgreSQL; marked `both_dialects` (where the SQL differs by dialect: the
programs of api/transactions.py with dialect branches, notifications, ingest's inserts,
migrations, the rehearsal), it runs on SQLite too (tests/conftest.py).

Most tests run inside a transaction rolled back at the end (services' commits release
savepoints). Tests that need several real connections (long-poll, concurrent claimers, Celery)
use `live_db`, whose tables are emptied afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.app import create_app
from coldbench.api.database import Base, make_engine, make_sessionmaker, upgrade_database
from coldbench.api.deps import get_database, get_db
from coldbench.api.settings import Settings
from coldbench.api.transactions import SessionDatabase
from tests.conftest import POSTGRES_URL


def _server_url(url: str, database: str) -> str:
    return sa.engine.make_url(url).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A new empty database on the test server, dropped at the end of the session."""
    name = f"coldbench_test_{secrets.token_hex(4)}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield _server_url(POSTGRES_URL, name)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_migrated(postgres_url: str) -> str:
    upgrade_database(postgres_url)
    return postgres_url


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'coldbench.db'}"
    upgrade_database(url)
    return url


@pytest.fixture(scope="session")
def db_url(request: pytest.FixtureRequest) -> str:
    """The migrated database of the dialect tests/conftest.py's pytest_generate_tests chose."""
    fixture = "sqlite_migrated" if request.param == "sqlite" else "postgres_migrated"
    return request.getfixturevalue(fixture)


def _test_engine(url: str) -> sa.Engine:
    engine = make_engine(url)
    if url.startswith("sqlite"):
        # pysqlite starts transactions lazily and breaks SAVEPOINT; take over BEGIN.
        @sa.event.listens_for(engine, "connect")
        def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin(connection: sa.Connection) -> None:
            connection.exec_driver_sql("BEGIN")

    return engine


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, sa.Engine]]:
    cache: dict[str, sa.Engine] = {}
    yield cache
    for engine in cache.values():
        engine.dispose()


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=db_url,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        max_artifact_bytes=64 * 1024,
        # The client fixture runs every program on the test's rolled-back session; rehearsing
        # on the app's own engine at each test's start would only cost time
        # (tests/api/test_rehearsal.py tests the rehearsal).
        rehearse_at_start=False,
    )


@pytest.fixture
def db_session(db_url: str, engines: dict[str, sa.Engine]) -> Iterator[Session]:
    """A session whose every commit is undone at the end of the test."""
    engine = engines.setdefault(db_url, _test_engine(db_url))
    connection = engine.connect()
    transaction = connection.begin()
    session = Session(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    try:
        yield session
    finally:
        session.close()
        transaction.rollback()
        connection.close()


@dataclass
class SentTasks:
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def __call__(self, name: str, args: tuple[object, ...]) -> None:
        self.calls.append((name, args))

    def named(self, name: str) -> list[tuple[object, ...]]:
        return [args for task, args in self.calls if task == name]


@pytest.fixture
def sent_tasks() -> Iterator[SentTasks]:
    recorder = SentTasks()
    with dispatch.use_sender(recorder):
        yield recorder


@pytest.fixture
def client(settings: Settings, db_session: Session, sent_tasks: SentTasks) -> Iterator[TestClient]:
    """The app on the rolled-back session; tasks it sends are recorded, not delivered."""
    app = create_app(settings)

    def _db() -> Iterator[Session]:
        yield db_session

    app.dependency_overrides[get_db] = _db
    # The requests written as programs of statements (api/transactions.py) run on the same
    # rolled-back session.
    app.dependency_overrides[get_database] = lambda: SessionDatabase(db_session)
    with TestClient(app) as test_client:
        yield test_client
    app.state.engine.dispose()


@pytest.fixture
def live_db(postgres_migrated: str) -> Iterator[str]:
    """The PostgreSQL database with real commits; emptied after the test."""
    yield postgres_migrated
    engine = sa.create_engine(postgres_migrated)
    others = " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    try:
        with engine.begin() as connection:
            # A connection the test left inside a transaction (an app's engine whose requests
            # were cut short) holds locks that TRUNCATE would wait on for ever: the test is
            # over, so its open transactions are ended first.
            connection.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid){others} AND state LIKE 'idle in transaction%%'"
            )
            # Anything else still holding a lock fails the teardown, naming itself, instead of
            # hanging the worker until the suite's timeout.
            connection.exec_driver_sql("SET LOCAL lock_timeout = '30s'")
            names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
            connection.exec_driver_sql(f"TRUNCATE {names} CASCADE")
    except sa.exc.OperationalError as error:
        with engine.connect() as connection:
            holders = connection.exec_driver_sql(
                f"SELECT pid, application_name, state, left(query, 200){others}"
            ).all()
        raise AssertionError(
            f"live_db: tables not emptied ({error.orig}); holders: {holders}"
        ) from error
    finally:
        engine.dispose()


@pytest.fixture
def live_sessionmaker(live_db: str) -> Iterator[Any]:
    engine = make_engine(live_db, pool_size=25, max_overflow=5)
    yield make_sessionmaker(engine)
    engine.dispose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class S3Server:
    """`python -m moto.server` on loopback: a real S3-protocol server in its own process."""

    endpoint_url: str
    env: dict[str, str]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def new_bucket(self) -> str:
        name = f"coldbench-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto.server did not start") from None
                time.sleep(0.2)
        yield S3Server(
            url,
            {
                "COLDBENCH_S3_ENDPOINT_URL": url,
                "COLDBENCH_S3_REGION": "us-east-1",
                "COLDBENCH_S3_ACCESS_KEY_ID": "test",
                "COLDBENCH_S3_SECRET_ACCESS_KEY": "test",
            },
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
        log.close()
