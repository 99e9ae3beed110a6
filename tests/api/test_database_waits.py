"""A request never waits on the database much longer than `COLDBENCH_DB_REQUEST_TIMEOUT_S`
(1 s): a table locked by another transaction (as a migration locks it), a PostgreSQL that stops
answering, a SQLite file another writer holds. Each request is answered 503 with one line and
Retry-After, writes nothing, and goes through once the database is back.

Real databases: the lock is a real PostgreSQL or SQLite lock held by another connection; the
hung server is the real PostgreSQL behind a loopback TCP relay that stops relaying."""

from __future__ import annotations

import contextlib
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from coldbench.api.app import create_app
from coldbench.api.database import make_engine, make_sessionmaker, upgrade_database
from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import SentTasks, bearer
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_api_key,
    make_host,
    make_job,
    manifest_for,
    provenance_json,
    records_jsonl,
)

# How long the test holds the database locked or frozen: a request without a bound would wait
# this long, one with it about a second.
HELD_S = 10.0
# The bound a request must keep, with room for a loaded 2-core machine.
ANSWERED_WITHIN_S = 4.0


class FreezingRelay:
    """A loopback TCP relay to a real server that can stop relaying: while frozen it accepts
    new connections and answers none, and holds every byte either side sends (a database
    server that hangs, or a network path that stopped delivering)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self.frozen.is_set():
                continue  # accepted, never answered
            upstream = socket.create_connection(self.target)
            self._sockets.append(upstream)
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while not self._closing.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.05)
                if self.frozen.is_set():
                    continue
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    (upstream if source is client else client).sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closing.set()
        self.listener.close()
        for sock in self._sockets:
            sock.close()


@contextmanager
def tables_locked(url: str, tables: str) -> Iterator[None]:
    """`tables` locked by another connection, as a migration locks them, until the block ends
    (or HELD_S has passed: what a request without a bound waits)."""
    engine = sa.create_engine(url)
    holder = engine.connect()
    holder.exec_driver_sql(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
    pid = holder.exec_driver_sql("select pg_backend_pid()").scalar()

    def release() -> None:
        with engine.connect() as other:
            other.execute(sa.text("select pg_terminate_backend(:pid)"), {"pid": pid})

    timer = threading.Timer(HELD_S, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with contextlib.suppress(sa.exc.DBAPIError):  # terminated by the timer
            holder.rollback()
        holder.close()
        engine.dispose()


def _app_settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        max_artifact_bytes=64 * 1024,
        rehearse_at_start=False,
        db_request_timeout_s=1.0,
    )


def _seed(database_url: str, settings: Settings, prefix: str) -> tuple[str, str, str]:
    """Two hosts (`<prefix>-1`, `<prefix>-2`), an API key and two queued jobs, written
    directly; the hosts' secrets and the key."""
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as db_session:
            _, secret_1 = make_host(db_session, f"{prefix}-1")
            _, secret_2 = make_host(db_session, f"{prefix}-2")
            key = make_api_key(db_session)
            for _ in range(2):
                make_job(db_session, settings)
    finally:
        engine.dispose()
    return secret_1, secret_2, key


def _timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def _all_at_once(
    calls: dict[str, Callable[[], httpx.Response]],
) -> dict[str, tuple[httpx.Response, float]]:
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(_timed, call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def _assert_unavailable(answers: dict[str, tuple[httpx.Response, float]], reason: str) -> None:
    for name, (response, waited) in answers.items():
        assert response.status_code == 503, f"{name}: {response.status_code} {response.text}"
        detail = response.json()["detail"]
        assert detail.startswith("the database is unavailable ("), f"{name}: {detail}"
        assert reason in detail and "\n" not in detail, f"{name}: {detail}"
        assert response.headers["Retry-After"] == "1"
        assert waited < ANSWERED_WITHIN_S, f"{name} waited {waited:.1f} s for the database"


class Agent:
    """One enrolled host's requests through a TestClient."""

    def __init__(self, client: TestClient, secret: str) -> None:
        self.client = client
        self.secret = secret

    def lease(self) -> httpx.Response:
        return self.client.post(
            "/api/v1/leases",
            json={"fingerprint": fingerprint(), "wait_s": 0},
            headers=bearer(self.secret),
        )

    def heartbeat(self, run_id: str) -> httpx.Response:
        return self.client.post(
            "/api/v1/workers/heartbeat",
            json={"run_id": run_id, "attempt": 1},
            headers=bearer(self.secret),
        )

    def upload(self, run_id: str, name: str, content: bytes) -> httpx.Response:
        return self.client.put(
            f"/api/v1/runs/{run_id}/artifacts/{name}?attempt=1",
            content=content,
            headers={**bearer(self.secret), "X-Content-SHA256": sha256_hex(content)},
        )

    def complete(self, run_id: str, files: dict[str, bytes]) -> httpx.Response:
        return self.client.post(
            f"/api/v1/runs/{run_id}/complete",
            json={"attempt": 1, "status": "succeeded", "manifest": manifest_for(files)},
            headers=bearer(self.secret),
        )


def _submit(client: TestClient, key: str) -> httpx.Response:
    return client.post("/api/v1/jobs", json=job_payload(), headers=bearer(key))


@pytest.fixture
def live_app(
    live_db: str, tmp_path: Path, sent_tasks: SentTasks
) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    """The app on its own engines (the request path's timeouts) over the live database, with
    two hosts, an API key and two queued jobs."""
    settings = _app_settings(live_db, tmp_path)
    secret_1, secret_2, key = _seed(live_db, settings, "waits")
    with TestClient(create_app(settings)) as client:
        yield client, {"secrets": (secret_1, secret_2), "key": key}


@pytest.mark.postgres
def test_a_locked_table_answers_503_within_about_a_second_and_loses_nothing(
    live_app: tuple[TestClient, dict[str, Any]], live_db: str
) -> None:
    client, made = live_app
    first, second = (Agent(client, secret) for secret in made["secrets"])
    leased = first.lease()
    assert leased.status_code == 200, leased.text
    run_id = leased.json()["run_id"]
    files = {"records.jsonl": records_jsonl(run_id), "provenance.json": provenance_json(run_id)}
    assert first.upload(run_id, "records.jsonl", files["records.jsonl"]).status_code == 201

    with tables_locked(live_db, "hosts, runs, jobs, api_keys"):
        answers = _all_at_once(
            {
                "lease": second.lease,
                "heartbeat": lambda: first.heartbeat(run_id),
                "upload": lambda: first.upload(run_id, "provenance.json", files["provenance.json"]),
                "submission": lambda: _submit(client, made["key"]),
                "job list (sync session)": lambda: client.get(
                    "/api/v1/jobs", headers=bearer(made["key"])
                ),
            }
        )
        # The completion needs the upload refused above: after it.
        answers["completion"] = _timed(lambda: first.complete(run_id, files))
    _assert_unavailable(answers, "timeout")

    # Nothing was written by the refused requests; each goes through once the lock is gone.
    engine = sa.create_engine(live_db)
    with engine.connect() as connection:
        assert connection.execute(sa.text("select count(*) from jobs")).scalar() == 2
        leased_runs = connection.execute(
            sa.text("select count(*) from runs where state != 'queued'")
        ).scalar()
        assert leased_runs == 1
    assert first.heartbeat(run_id).status_code == 200
    assert first.upload(run_id, "provenance.json", files["provenance.json"]).status_code == 201
    completed = first.complete(run_id, files)
    assert completed.status_code == 200, completed.text
    assert second.lease().status_code == 200
    assert _submit(client, made["key"]).status_code == 201
    with engine.connect() as connection:
        assert connection.execute(sa.text("select count(*) from jobs")).scalar() == 3
        assert connection.execute(sa.text("select count(*) from run_attempts")).scalar() == 2
        assert connection.execute(sa.text("select count(*) from artifacts")).scalar() == 2
    engine.dispose()


@pytest.mark.postgres
def test_a_database_that_stops_answering_costs_a_request_about_a_second(
    live_db: str, tmp_path: Path, sent_tasks: SentTasks
) -> None:
    url = sa.engine.make_url(live_db)
    relay = FreezingRelay((url.host or "127.0.0.1", url.port or 5432))
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    settings = _app_settings(relayed, tmp_path)
    secret_1, secret_2, key = _seed(live_db, settings, "hung")
    engine = make_engine(live_db)
    try:
        with TestClient(create_app(settings)) as client:
            first, second = Agent(client, secret_1), Agent(client, secret_2)
            leased = first.lease()
            assert leased.status_code == 200, leased.text
            run_id = leased.json()["run_id"]
            relay.frozen.set()
            # On the async engine: connections of the pool whose server stopped answering, and
            # new ones it accepts and never answers.
            thaw = threading.Timer(HELD_S, relay.frozen.clear)  # a request without a bound
            thaw.start()
            answers = _all_at_once(
                {
                    "heartbeat": lambda: first.heartbeat(run_id),
                    "lease": second.lease,
                    "submission": lambda: _submit(client, key),
                }
            )
            answers["lease again"] = _timed(second.lease)
            thaw.cancel()
            relay.frozen.clear()
            _assert_unavailable(answers, "")
            # The connections the server stopped answering were thrown away, not reused.
            assert first.heartbeat(run_id).status_code == 200
            assert second.lease().status_code == 200
            assert _submit(client, key).status_code == 201
        with engine.connect() as connection:
            assert connection.execute(sa.text("select count(*) from jobs")).scalar() == 3
            assert connection.execute(sa.text("select count(*) from run_attempts")).scalar() == 2
    finally:
        relay.close()
        engine.dispose()


def test_a_sqlite_file_held_by_another_writer_answers_503_within_about_a_second(
    tmp_path: Path, sent_tasks: SentTasks
) -> None:
    path = tmp_path / "coldbench.db"
    url = f"sqlite:///{path}"
    upgrade_database(url)
    settings = _app_settings(url, tmp_path)
    engine = make_engine(url)
    with make_sessionmaker(engine)() as db_session:
        _, secret = make_host(db_session, "sqlite-1")
        key = make_api_key(db_session)
        make_job(db_session, settings)
    engine.dispose()
    with TestClient(create_app(settings)) as client:
        agent = Agent(client, secret)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the one writer SQLite allows
        locked_at = time.monotonic()
        answers = {"lease": _timed(agent.lease), "submission": _timed(lambda: _submit(client, key))}
        assert time.monotonic() - locked_at < HELD_S
        holder.rollback()
        holder.close()
        _assert_unavailable(answers, "locked")
        assert agent.lease().status_code == 200
        assert _submit(client, key).status_code == 201
