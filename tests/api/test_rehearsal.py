"""The server's rehearsal at start (api/rehearsal.py), on real databases, SQLite and PostgreSQL:
it leaves nothing behind, announces nothing, and the agent cycle that follows compiles nothing
(and, on PostgreSQL, finds its statements prepared on every connection of the pool)."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine.default import DefaultExecutionContext

from coldbench.api import rehearsal
from coldbench.api.artifacts import service as artifact_service
from coldbench.api.artifacts.store import LocalArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.database import Base, make_engine, make_sessionmaker, upgrade_database
from coldbench.api.jobs import service as job_service
from coldbench.api.runs import claim as run_claim
from coldbench.api.runs import completion
from coldbench.api.runs import heartbeat as run_heartbeat
from coldbench.api.runs.wakeup import CHANNEL, WorkSignal, register_local
from coldbench.api.settings import Settings
from coldbench.api.transactions import AsyncDatabase, Execute, Program, make_async_engine
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_host,
    make_job,
    manifest_for,
    provenance_json,
    records_jsonl,
)

# The rehearsal runs each dialect's statements.
pytestmark = pytest.mark.both_dialects

POOL = 3


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'coldbench.db'}"
        upgrade_database(url)
        return url
    return str(request.getfixturevalue("live_db"))


def _counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table.name: connection.execute(
                    sa.select(sa.func.count()).select_from(table)
                ).scalar_one()
                for table in Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def _agent_cycle(
    database: AsyncDatabase, settings: Settings, host_id: str, secret: str, key: str, store: Any
) -> Any:
    """A submission and one agent's cycle, as the routers run them."""

    async def cycle() -> None:
        dialect = database.dialect_name
        submission = job_service.Submission(
            settings, job_payload(), key.split("_")[1], dialect, token=key
        )
        submitted = await database.run_grouped(job_service.submit_group_program, submission)
        assert isinstance(submitted, job_service.Submitted)
        request = run_claim.ClaimRequest(
            host_id=host_id,
            report=run_claim.HostReport(
                fingerprint=fingerprint(hostname="real-1"),
                repositories={},
                models=["preset:tiny"],
            ),
            settings=settings,
            dialect=dialect,
            token=secret,
        )
        lease = (await database.run_grouped(run_claim.claim_group_program, request)).lease
        assert lease is not None
        upload = {"host_id": host_id, "run_id": lease.run_id, "attempt": lease.attempt}
        # As the routers run them (api/hosts/router.py, api/artifacts/router.py).
        beat_on = database.run_alone if dialect == "postgresql" else database.run
        await beat_on(
            partial(
                run_heartbeat.heartbeat_program,
                settings=settings,
                **upload,
                progress=None,
                token=secret,
                dialect=dialect,
            )
        )
        files = {
            "records.jsonl": records_jsonl(lease.run_id),
            "provenance.json": provenance_json(lease.run_id),
        }
        for name, content in files.items():
            blob = store.put_bytes(content)
            await database.read(
                partial(
                    artifact_service.upload_check_program,
                    **upload,
                    name=name,
                    sha256=blob.sha256,
                    token=secret,
                )
            )
            await database.run_alone(
                partial(artifact_service.record_upload_program, **upload, name=name, blob=blob)
            )
        written = await database.run(
            partial(
                completion.complete_program,
                **upload,
                status="succeeded",
                reason=None,
                manifest=manifest_for(files),
                dialect=dialect,
                token=secret,
            )
        )
        assert isinstance(written, completion.CompletionWritten)

    return cycle()


def test_after_the_rehearsal_an_agent_cycle_compiles_nothing_and_nothing_of_it_remains(
    url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=url, artifact_dir=tmp_path, db_async_pool_size=POOL)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as db_session:
        host, secret = make_host(db_session, "real-1")
        key = auth_service.create_api_key(db_session=db_session, name="real")
        queued = make_job(db_session, settings)  # a real queued run the rehearsal must not take
        db_session.commit()
        queued_run = db_session.execute(
            sa.text("select id from runs where job_id = :j"), {"j": queued.id}
        ).scalar_one()
    before = _counts(url)
    signal = WorkSignal()
    register_local(signal)
    listener = None
    if url.startswith("postgresql"):
        plain = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(False)
        listener = psycopg.connect(plain, autocommit=True)
        listener.execute(f"LISTEN {CHANNEL}")
    misses: list[str] = []

    def compiled(
        _conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool
    ) -> None:
        # A statement compiled for the first time in this process: a cache miss.
        if isinstance(context, DefaultExecutionContext) and (
            context.cache_hit == context.dialect.CACHE_MISS
        ):
            misses.append(statement[:80])

    async def scenario() -> tuple[rehearsal.Rehearsed | None, list[int]]:
        database = AsyncDatabase(
            make_async_engine(
                url, **({} if url.startswith("sqlite") else {"pool_size": POOL, "max_overflow": 0})
            ),
            sessions,
        )
        try:
            generation = signal.generation
            outcome = await rehearsal.rehearse(database, settings)
            assert signal.generation == generation  # announced nothing
            assert _counts(url) == before  # everything it wrote was rolled back
            async with database.engine.connect() as connection:
                state = await connection.scalar(
                    sa.text("select state from runs where id = :r"), {"r": queued_run}
                )
            assert state == "queued"
            if listener is not None:  # nor through PostgreSQL (NOTIFY is sent at commit)
                assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
            prepared: list[int] = []
            if database.dialect_name == "postgresql":
                held = [await database.engine.connect() for _ in range(POOL)]
                for connection in held:
                    count = await connection.scalar(
                        sa.text("select count(*) from pg_prepared_statements")
                    )
                    prepared.append(int(count or 0))
                for connection in held:
                    await connection.close()
            sa.event.listen(database.engine.sync_engine, "after_cursor_execute", compiled)
            store = LocalArtifactStore(tmp_path / "store")
            await _agent_cycle(database, settings, host.id, secret, key, store)
            return outcome, prepared
        finally:
            await database.engine.dispose()

    try:
        outcome, prepared = asyncio.run(scenario())
    finally:
        if listener is not None:
            listener.close()
    engine.dispose()
    assert outcome == rehearsal.Rehearsed("completed")
    assert misses == []
    if url.startswith("postgresql"):
        # Every connection of the pool prepared the cycle's statements (a dozen and more).
        assert len(prepared) == POOL and min(prepared) >= 12, prepared


def test_a_failed_rehearsal_is_logged_leaves_nothing_and_the_server_still_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from coldbench.api.app import create_app
    from coldbench.api.hosts.models import Host

    url = f"sqlite:///{tmp_path / 'coldbench.db'}"
    upgrade_database(url)

    def broken(settings: Settings, dialect: str) -> Program[rehearsal.Rehearsed]:
        yield Execute(
            sa.insert(Host), {"id": "0" * 16, "name": "half-way", "secret_sha256": "0" * 64}
        )
        raise RuntimeError("a statement the schema no longer has")

    monkeypatch.setattr(rehearsal, "agent_cycle_program", broken)
    settings = Settings(database_url=url, state_dir=tmp_path / "state")
    with (
        caplog.at_level(logging.WARNING, logger="coldbench.api.rehearsal"),
        TestClient(create_app(settings)) as client,
    ):
        assert client.get("/healthz").status_code == 200
    assert "the start-up rehearsal failed; serving without it" in caplog.text
    assert _counts(url)["hosts"] == 0


def test_the_server_rehearses_at_start_unless_told_not_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from coldbench.api.app import create_app

    url = f"sqlite:///{tmp_path / 'coldbench.db'}"
    upgrade_database(url)
    for rehearse, said in ((True, True), (False, False)):
        caplog.clear()
        settings = Settings(
            database_url=url, state_dir=tmp_path / "state", rehearse_at_start=rehearse
        )
        with (
            caplog.at_level(logging.INFO, logger="coldbench.api.rehearsal"),
            TestClient(create_app(settings)),
        ):
            pass
        said_it = "rehearsed an agent cycle on 1 connections in " in caplog.text
        assert said_it is said and (": completed" in caplog.text) is said
