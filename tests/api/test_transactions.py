"""The async engine's path (api/transactions.py) on real databases, SQLite and PostgreSQL.

The `client` fixture runs every program on the test's rolled-back sync session; these tests
run the same programs the way `coldbench server` does: on `AsyncDatabase` (aiosqlite,
asyncpg) with real commits.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from api.artifacts import service as artifact_service
from api.artifacts.store import LocalArtifactStore
from api.auth import service as auth_service
from api.database import make_engine, make_sessionmaker, upgrade_database
from api.errors import NotAuthenticated
from api.jobs import service as job_service
from api.runs import service as run_service
from api.runs.wakeup import WorkSignal, register_local
from api.settings import Settings
from api.transactions import AsyncDatabase, Execute, Program, make_async_engine
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_host,
    manifest_for,
    provenance_json,
    records_jsonl,
)


@dataclass
class Live:
    url: str
    settings: Settings
    sessions: sessionmaker[Session]

    def run(self, scenario: Callable[[AsyncDatabase], Awaitable[Any]]) -> Any:
        """`scenario` on a fresh AsyncDatabase and event loop (an async engine's connections
        belong to the loop that opened them)."""

        async def main() -> Any:
            database = AsyncDatabase(make_async_engine(self.url), self.sessions)
            try:
                return await scenario(database)
            finally:
                await database.engine.dispose()

        return asyncio.run(main())

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.sessions() as db_session:
            return db_session.execute(sa.text(sql), params).scalar()


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'coldbench.db'}"
        upgrade_database(url)
    else:
        url = request.getfixturevalue("live_db")
    engine = make_engine(url)
    try:
        yield Live(
            url, Settings(database_url=url, artifact_dir=tmp_path), make_sessionmaker(engine)
        )
    finally:
        engine.dispose()


def test_a_run_from_submission_to_completion_on_the_async_engine(
    live: Live, tmp_path: Path
) -> None:
    with live.sessions() as db_session:
        host, secret = make_host(db_session, "async-1")
        key = auth_service.create_api_key(db_session=db_session, name="k")
    key_id = key.split("_")[1]
    signal = WorkSignal()
    register_local(signal)
    store = LocalArtifactStore(tmp_path / "store")

    async def scenario(db: AsyncDatabase) -> dict[str, Any]:
        # Authentication reads without a transaction (`read`); the rest are transactions.
        assert await db.read(partial(auth_service.submitter_id_program, key)) == key_id
        assert await db.read(partial(auth_service.submitter_id_program, key + "x")) is None
        generation = signal.generation
        submitted = await db.run_grouped(
            job_service.submit_group_program,
            job_service.Submission(live.settings, job_payload(), key_id),
        )
        assert isinstance(submitted, job_service.Submitted)
        woken = signal.generation > generation
        # The claim authenticates the token on the host's row it locks.
        request = run_service.ClaimRequest(
            host_id=host.id,
            report=run_service.HostReport(fingerprint=fingerprint(hostname="async-1")),
            settings=live.settings,
            dialect=db.dialect_name,
            token=secret + "x",
        )
        with pytest.raises(NotAuthenticated):
            await db.run_grouped(run_service.claim_group_program, request)
        claimed = await db.run_grouped(
            run_service.claim_group_program, dataclasses.replace(request, token=secret)
        )
        lease = claimed.lease
        assert lease is not None and lease.job_id == submitted.job.id
        worker_id = await db.run(partial(auth_service.worker_id_program, secret))
        assert worker_id == host.id
        cancel = await db.run(
            partial(
                run_service.heartbeat_program,
                settings=live.settings,
                host_id=host.id,
                run_id=lease.run_id,
                attempt=lease.attempt,
                progress=None,
            )
        )
        assert cancel is False
        files = {
            "records.jsonl": records_jsonl(lease.run_id),
            "provenance.json": provenance_json(lease.run_id),
        }
        upload = {"host_id": host.id, "run_id": lease.run_id, "attempt": lease.attempt}
        for name, content in files.items():
            blob = store.put_bytes(content)
            assert (
                await db.read(
                    partial(
                        artifact_service.upload_check_program,
                        **upload,
                        name=name,
                        sha256=blob.sha256,
                    )
                )
                is None
            )
            for created in (True, False):  # the same upload again: the row already stored
                row, was_created = await db.run(
                    partial(artifact_service.record_upload_program, **upload, name=name, blob=blob)
                )
                assert was_created is created and row.sha256 == blob.sha256
        written = await db.run(
            partial(
                run_service.complete_program,
                **upload,
                status="succeeded",
                reason=None,
                manifest=manifest_for(files),
            )
        )
        assert isinstance(written, run_service.CompletionWritten)
        again = await db.run(
            partial(
                run_service.complete_program,
                **upload,
                status="succeeded",
                reason=None,
                manifest=manifest_for(files),
            )
        )
        assert again is run_service.LATE  # a retry is judged on the ORM path
        return {"run_id": lease.run_id, "job_id": submitted.job.id, "woken": woken}

    done = live.run(scenario)
    run_id = done["run_id"]
    assert live.scalar("select state from runs where id = :r", r=run_id) == "completed"
    assert live.scalar("select state from run_attempts where run_id = :r", r=run_id) == "completed"
    assert live.scalar("select state from jobs where id = :j", j=done["job_id"]) == "running"
    assert live.scalar("select count(*) from artifacts where run_id = :r", r=run_id) == 2
    assert live.scalar("select health from hosts where id = :h", h=host.id) == "ready"
    assert live.scalar("select count(*) from audit_events where subject_id = :r", r=run_id) == 2
    if not live.url.startswith("postgresql"):
        # PostgreSQL's waiters are woken by NOTIFY through a listener (tests/api/test_leases.py).
        assert done["woken"]


def test_a_program_that_fails_writes_nothing(live: Live) -> None:
    with live.sessions() as db_session:
        host, _ = make_host(db_session, "async-2")

    def program() -> Program[None]:
        yield Execute(sa.text("UPDATE hosts SET health = 'busy' WHERE id = :h"), {"h": host.id})
        raise RuntimeError("after a write")

    async def scenario(db: AsyncDatabase) -> None:
        with pytest.raises(RuntimeError):
            await db.run(program)

    live.run(scenario)
    assert live.scalar("select health from hosts where id = :h", h=host.id) == "ready"


@pytest.mark.postgres
def test_dropped_connections_are_replaced_and_the_program_runs_once_more(live_db: str) -> None:
    engine = make_engine(live_db)
    sessions = make_sessionmaker(engine)
    with sessions() as db_session:
        host, secret = make_host(db_session, "async-3")
    starts: list[int] = []

    def program() -> Program[str | None]:
        starts.append(1)
        return (yield from auth_service.worker_id_program(secret))

    async def scenario() -> None:
        database = AsyncDatabase(make_async_engine(live_db), sessions)
        try:
            # Open several pooled connections, then drop every one of them.
            await asyncio.gather(*(database.run(program) for _ in range(4)))
            with engine.connect() as connection:
                dropped = connection.execute(
                    sa.text(
                        "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                        "where datname = current_database() and pid != pg_backend_pid()"
                    )
                ).scalar()
            assert dropped and dropped >= 1
            starts.clear()
            assert await database.run(program) == host.id
            assert len(starts) == 2  # the first try found its connection dropped
            starts.clear()
            assert await database.run(program) == host.id
            assert len(starts) == 1  # the pool holds fresh connections again
            # The same for a read without a transaction.
            await asyncio.gather(*(database.read(program) for _ in range(4)))
            with engine.connect() as connection:
                connection.execute(
                    sa.text(
                        "select pg_terminate_backend(pid) from pg_stat_activity "
                        "where datname = current_database() and pid != pg_backend_pid()"
                    )
                )
            starts.clear()
            assert await database.read(program) == host.id
            assert len(starts) == 2
        finally:
            await database.engine.dispose()

    asyncio.run(scenario())
    engine.dispose()
