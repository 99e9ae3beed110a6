"""The async engine's path (api/transactions.py) on real databases, SQLite and PostgreSQL.

The `client` fixture runs every program on the test's rolled-back sync session; these tests
run the same programs the way `coldbench server` does: on `AsyncDatabase` (aiosqlite,
asyncpg) with real commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from coldbench.api.artifacts import service as artifact_service
from coldbench.api.artifacts.store import LocalArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import AuditEvent
from coldbench.api.database import make_engine, make_sessionmaker, upgrade_database
from coldbench.api.errors import Conflict, Forbidden, Invalid, NotAuthenticated
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.runs import claim as run_claim
from coldbench.api.runs import completion
from coldbench.api.runs import heartbeat as run_heartbeat
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.wakeup import WorkSignal, register_local
from coldbench.api.settings import Settings
from coldbench.api.transactions import AsyncDatabase, Execute, Program, make_async_engine
from coldbench.evidence.contract.protocol import JobState, RunState
from tests.api import agent_calls
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_host,
    make_job,
    manifest_for,
    provenance_json,
    records_jsonl,
)

# The program drivers, the pool and the notifications differ by dialect.
pytestmark = pytest.mark.both_dialects


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


@contextlib.contextmanager
def count_round_trips(db: AsyncDatabase) -> Iterator[list[int]]:
    """[statements, BEGINs] sent on `db`'s engine while in the block (BEGIN: a transaction
    that is not autocommit)."""
    trips = [0, 0]

    def statement(*_: Any) -> None:
        trips[0] += 1

    def begin(connection: sa.Connection) -> None:
        if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            trips[1] += 1

    engine = db.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", statement)
    sa.event.listen(engine, "begin", begin)
    try:
        yield trips
    finally:
        sa.event.remove(engine, "before_cursor_execute", statement)
        sa.event.remove(engine, "begin", begin)


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
        dialect = db.dialect_name
        submission = job_service.Submission(live.settings, job_payload(), key_id, dialect, key)
        with pytest.raises(NotAuthenticated):  # the group's one read of the keys checks each
            await db.run_grouped(
                job_service.submit_group_program,
                dataclasses.replace(submission, token=key + "x"),
            )
        generation = signal.generation
        submitted = await db.run_grouped(job_service.submit_group_program, submission)
        assert isinstance(submitted, job_service.Submitted)
        woken = signal.generation > generation
        # The claim authenticates the token on the host's row it locks.
        request = run_claim.ClaimRequest(
            host_id=host.id,
            report=run_claim.HostReport(fingerprint=fingerprint(hostname="async-1")),
            settings=live.settings,
            dialect=db.dialect_name,
            token=secret + "x",
        )
        with pytest.raises(NotAuthenticated):
            await db.run_grouped(run_claim.claim_group_program, request)
        claimed = await db.run_grouped(
            run_claim.claim_group_program, dataclasses.replace(request, token=secret)
        )
        lease = claimed.lease
        assert lease is not None and lease.job_id == submitted.job.id
        # Heartbeat, upload and completion check the request's token before they write: a
        # wrong one is refused, and writes nothing.
        beat = partial(
            run_heartbeat.heartbeat_program,
            settings=live.settings,
            host_id=host.id,
            run_id=lease.run_id,
            attempt=lease.attempt,
            progress=None,
            dialect=db.dialect_name,
        )
        # As the server runs it: on PostgreSQL statements that each stand alone.
        is_pg = db.dialect_name == "postgresql"
        beat_on = db.run_alone if is_pg else db.run
        seen = "select last_heartbeat_at from hosts where id = :h"
        expires = "select lease_expires_at from runs where id = :r"
        seen_before = live.scalar(seen, h=host.id)
        expires_before = live.scalar(expires, r=lease.run_id)
        with pytest.raises(NotAuthenticated):
            await beat_on(partial(beat, token=secret + "x"))
        assert live.scalar(seen, h=host.id) == seen_before
        with count_round_trips(db) as trips:
            assert await beat_on(partial(beat, token=secret)) is False
        # PostgreSQL: the secret, then the host's time and the lease in one statement.
        assert trips == ([2, 0] if is_pg else [2, 1])
        assert live.scalar(seen, h=host.id) != seen_before
        assert live.scalar(expires, r=lease.run_id) != expires_before
        seen_before = live.scalar(seen, h=host.id)
        with pytest.raises(Forbidden):  # an attempt not this host's: refused, nothing written
            await beat_on(partial(beat, token=secret, attempt=lease.attempt + 1))
        assert live.scalar(seen, h=host.id) == seen_before
        with count_round_trips(db):
            assert await beat_on(partial(beat, token=secret, progress={"cells_done": 1})) is False
        assert live.scalar("select progress from runs where id = :r", r=lease.run_id) in (
            {"cells_done": 1},
            '{"cells_done": 1}',
        )
        files = {
            "records.jsonl": records_jsonl(lease.run_id),
            "provenance.json": provenance_json(lease.run_id),
        }
        upload = {"host_id": host.id, "run_id": lease.run_id, "attempt": lease.attempt}
        for name, content in files.items():
            blob = store.put_bytes(content)
            check = partial(
                artifact_service.upload_check_program, **upload, name=name, sha256=blob.sha256
            )
            with pytest.raises(NotAuthenticated):
                await db.read(partial(check, token=secret + "x"))
            assert await db.read(partial(check, token=secret)) is None
            record = partial(artifact_service.record_upload_program, **upload, name=name)
            other = store.put_bytes(content + b"\n")
            # A first upload is one statement that commits by itself (no BEGIN, no COMMIT);
            # the same upload again finds the row (the insert, then the check).
            for created, statements in ((True, 1), (False, 2)):
                with count_round_trips(db) as trips:
                    row, was_created = await db.run_alone(partial(record, blob=blob))
                assert was_created is created and row.sha256 == blob.sha256
                assert trips == [statements, 0]
            with pytest.raises(Conflict):  # another digest under a stored name: nothing written
                await db.run_alone(partial(record, blob=other))
            stored = "select sha256 from artifacts where run_id = :r and name = :n"
            assert live.scalar(stored, r=lease.run_id, n=name) == blob.sha256
        complete = partial(
            completion.complete_program,
            **upload,
            status="succeeded",
            reason=None,
            manifest=manifest_for(files),
            dialect=db.dialect_name,
        )
        with pytest.raises(NotAuthenticated):
            await db.run(partial(complete, token=secret + "x"))
        run_state = "select state from runs where id = :r"
        assert live.scalar(run_state, r=lease.run_id) == "leased"
        written = await db.run(partial(complete, token=secret))
        assert isinstance(written, completion.CompletionWritten)
        again = await db.run(
            partial(
                completion.complete_program,
                **upload,
                status="succeeded",
                reason=None,
                manifest=manifest_for(files),
                dialect=db.dialect_name,
            )
        )
        assert again is completion.LATE  # a retry is judged on the ORM path
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
        stored = (
            yield Execute(sa.text("select secret_sha256 from hosts where id = :h"), {"h": host.id})
        ).scalar()
        return host.id if auth_service.token_matches(secret, stored) else None

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


# --- group commits ---------------------------------------------------------------------------

_groups_seen: list[int] = []


def _counted_claims(
    requests: Sequence[run_claim.ClaimRequest],
) -> Program[list[run_claim.Claimed | Exception]]:
    """The claim program, noting each transaction's number of requests."""
    _groups_seen.append(len(requests))
    return (yield from run_claim.claim_group_program(requests))


def test_concurrent_claims_share_one_transaction_each_with_its_own_answer(live: Live) -> None:
    with live.sessions() as db_session:
        holder, _ = make_host(db_session, "holder")
        hosts = [make_host(db_session, f"group-{i:02d}") for i in range(12)]
        jobs = [make_job(db_session, live.settings) for _ in range(10)]
        held = agent_calls.claim_lease(db_session=db_session, settings=live.settings, host=holder)
        assert held is not None and held.job_id == jobs[0].id
        holder_token = auth_service.create_enrollment_token(db_session=db_session)

    def request(host_id: str, token: str) -> run_claim.ClaimRequest:
        # One host also reports its models; the others leave theirs as registered.
        models = ["preset:tiny", "reported"] if host_id == hosts[10][0].id else None
        report = run_claim.HostReport(fingerprint=fingerprint(hostname=host_id), models=models)
        return run_claim.ClaimRequest(
            host_id=host_id,
            report=report,
            settings=live.settings,
            dialect=live.url.split(":")[0].split("+")[0],
            token=token,
        )

    (first, first_secret), (second, second_secret) = hosts[0], hosts[1]
    requests = [
        request(first.id, first_secret + "x"),  # a wrong secret: refused, the others unharmed
        *(request(host.id, secret) for host, secret in hosts),
        request(second.id, second_secret),  # the same host again: the first request claims
        request(holder.id, holder_token),  # an enrollment token is not the host's secret
    ]
    _groups_seen.clear()

    async def scenario(db: AsyncDatabase) -> list[Any]:
        claims = [db.run_grouped(_counted_claims, r) for r in requests]
        return await asyncio.gather(*claims, return_exceptions=True)

    answers = live.run(scenario)
    assert _groups_seen == [len(requests)]  # one transaction for all of them
    assert isinstance(answers[0], NotAuthenticated)
    assert isinstance(answers[-1], NotAuthenticated)
    leases = [answer.lease for answer in answers[1:13]]
    # Nine runs were queued: the oldest to the first host asking, and so on.
    assert [lease.job_id if lease else None for lease in leases] == [
        *(job.id for job in jobs[1:]),
        None,
        None,
        None,
    ]
    assert answers[13].lease is None  # one run per host at a time
    with live.sessions() as db_session:
        leased = db_session.execute(
            sa.select(Run.id, Run.host_id).where(Run.state == RunState.LEASED)
        ).all()
        assert sorted(host_id for _, host_id in leased) == sorted(
            [holder.id, *(host.id for host, _ in hosts[:9])]
        )
        assert {run_id for run_id, _ in leased} >= {lease.run_id for lease in leases if lease}
        audited = db_session.scalar(
            sa.select(sa.func.count())
            .select_from(AuditEvent)
            .where(AuditEvent.kind == "run.leased")
        )
        assert audited == 10
        attempts = db_session.scalar(sa.select(sa.func.count()).select_from(RunAttempt))
        assert attempts == 10
        # Each host's row as its report and its claim left it, written in the same transaction.
        for index, (host, _) in enumerate(hosts):
            row = db_session.get_one(Host, host.id)
            assert row.fingerprint == fingerprint(hostname=host.id)
            assert row.last_heartbeat_at is not None
            assert row.last_heartbeat_at > host.created_at
            assert row.health == ("busy" if index < 9 else "ready")
            assert row.models == (["preset:tiny", "reported"] if index == 10 else ["preset:tiny"])
        states = {job.id: job.state for job in db_session.scalars(sa.select(Job))}
        assert all(states[job.id] == JobState.RUNNING for job in jobs)
        # Every authenticated host's report was written, busy or not.
        seen = db_session.scalars(sa.select(Host.fingerprint["hostname"].as_string())).all()
        assert set(seen) >= {host.id for host, _ in hosts}


def test_grouped_submissions_refuse_only_the_invalid_one(live: Live) -> None:
    with live.sessions() as db_session:
        make_host(db_session, "submit-host")
        key = auth_service.create_api_key(db_session=db_session, name="k")
    key_id = key.split("_")[1]
    sent = [
        (job_payload(), key),
        (job_payload(model="preset:absent"), key),  # no host has it
        (job_payload(), key + "x"),  # not the key's secret
        (job_payload(), key),
        (job_payload(), key),
    ]

    async def scenario(db: AsyncDatabase) -> list[Any]:
        submissions = [
            db.run_grouped(
                job_service.submit_group_program,
                job_service.Submission(live.settings, payload, key_id, db.dialect_name, token),
            )
            for payload, token in sent
        ]
        return await asyncio.gather(*submissions, return_exceptions=True)

    answers = live.run(scenario)
    assert isinstance(answers[1], Invalid) and "preset:absent" in answers[1].message
    assert isinstance(answers[2], NotAuthenticated)
    stored = [answer for answer in answers if isinstance(answer, job_service.Submitted)]
    assert len(stored) == 3
    with live.sessions() as db_session:
        assert sorted(db_session.scalars(sa.select(Job.id))) == sorted(s.job.id for s in stored)
        assert db_session.scalar(sa.select(sa.func.count()).select_from(Run)) == 3


def _numbered(items: Sequence[int]) -> Program[list[int | Exception]]:
    """Each item doubled, odd items refused; 13 fails any transaction it is part of."""
    _groups_seen.append(len(items))
    yield Execute(sa.select(sa.literal(1)))
    if 13 in items:
        raise RuntimeError("the transaction failed")
    return [Invalid(f"{item} is odd") if item % 2 else item * 2 for item in items]


def test_a_group_answers_each_item_and_a_failed_transaction_fails_only_its_culprit(
    live: Live,
) -> None:
    async def scenario(db: AsyncDatabase) -> tuple[list[Any], list[Any], list[Any]]:
        _groups_seen.clear()
        first = await asyncio.gather(
            *(db.run_grouped(_numbered, i) for i in range(6)), return_exceptions=True
        )
        failed = await asyncio.gather(
            *(db.run_grouped(_numbered, i) for i in (2, 13, 4)), return_exceptions=True
        )
        # A request that leaves before its group runs is not part of it.
        waiting = [asyncio.ensure_future(db.run_grouped(_numbered, i)) for i in (20, 21, 22)]
        waiting[0].cancel()
        later = await asyncio.gather(*waiting, return_exceptions=True)
        return first, failed, later

    first, failed, later = live.run(scenario)
    assert first[0::2] == [0, 4, 8]
    assert [str(answer) for answer in first[1::2]] == ["1 is odd", "3 is odd", "5 is odd"]
    # The failed group's halves ran alone: 2 and 4 answered, only 13 failed.
    assert failed[0] == 4 and failed[2] == 8
    assert isinstance(failed[1], RuntimeError)
    assert isinstance(later[0], asyncio.CancelledError)
    assert str(later[1]) == "21 is odd" and later[2] == 44
    assert _groups_seen == [6, 3, 1, 2, 1, 1, 2]


_AUDIT = sa.text(
    "INSERT INTO audit_events (at, actor, kind, subject_id, detail) "
    "VALUES (CURRENT_TIMESTAMP, 'test', 'grouped', :subject, '{}')"
)


def _audited(items: Sequence[str]) -> Program[list[str | Exception]]:
    """One audit row per item, all in one statement: a value the driver cannot encode (a lone
    surrogate, which no door let through here) fails the whole statement."""
    yield Execute(_AUDIT, [{"subject": item} for item in items])
    return list(items)


def test_a_poisoned_member_of_a_group_is_refused_alone_and_the_rest_commit(live: Live) -> None:
    """What one host's lone surrogate did to the claims of every host leasing with it
    (issue 46): with the halves run again alone, only the poisoned request fails."""
    honest = [f"honest-{i:02d}" for i in range(12)]
    poisoned = "poisoned-\ud800"

    async def scenario(db: AsyncDatabase) -> list[Any]:
        items = [*honest[:6], poisoned, *honest[6:]]
        return await asyncio.gather(
            *(db.run_grouped(_audited, item) for item in items), return_exceptions=True
        )

    answers = live.run(scenario)
    assert isinstance(answers[6], Exception), answers[6]
    assert [a for i, a in enumerate(answers) if i != 6] == honest
    with live.sessions() as db_session:
        stored = db_session.scalars(
            sa.text("SELECT subject_id FROM audit_events WHERE kind = 'grouped'")
        ).all()
    assert sorted(stored) == honest


# --- the pool ---------------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_cancelled_request_finishes_its_transaction_and_returns_its_connection(
    live_db: str,
) -> None:
    """A request cancelled in the middle of its transaction (its client left: Starlette cancels
    the request's cancel scope) finishes the transaction, never half-way through a statement,
    and hands its connection back to the pool, closed by the transaction itself. Cancelled once
    its first statement has run, whenever that is on a loaded machine."""
    engine = make_engine(live_db)
    sessions = make_sessionmaker(engine)
    with sessions() as db_session:
        host, _ = make_host(db_session, "warm-2")
    steps: list[str] = []

    async def scenario() -> tuple[int, int, list[str]]:
        database = AsyncDatabase(make_async_engine(live_db, pool_size=2, max_overflow=0), sessions)
        updated = anyio.Event()
        failures: list[str] = []

        def slow_write() -> Program[None]:
            yield Execute(sa.text("UPDATE hosts SET health = 'busy' WHERE id = :h"), {"h": host.id})
            steps.append("updated")
            updated.set()
            yield Execute(sa.text("SELECT pg_sleep(0.3)"), {})
            steps.append("slept")
            raise RuntimeError("the program fails after its last statement")

        async def request() -> None:
            try:
                await database.run(slow_write)
            except RuntimeError as error:
                failures.append(str(error))

        try:
            async with anyio.create_task_group() as requests:
                requests.start_soon(request)
                await updated.wait()
                requests.cancel_scope.cancel()
            pool = database.engine.pool
            return pool.checkedout(), pool.checkedin(), failures  # type: ignore[attr-defined]
        finally:
            await database.engine.dispose()

    checked_out, checked_in, failures = asyncio.run(scenario())
    with sessions() as db_session:
        health = db_session.execute(
            sa.text("select health from hosts where id = :h"), {"h": host.id}
        ).scalar_one()
    engine.dispose()
    assert steps == ["updated", "slept"]
    assert failures == ["the program fails after its last statement"]
    assert (checked_out, checked_in) == (0, 1)
    assert health == "ready"  # the failed transaction's write rolled back


@pytest.mark.postgres
def test_requests_beyond_the_pool_wait_for_a_connection_and_open_no_more(
    live_db: str, tmp_path: Path
) -> None:
    """The app's engines keep the configured connections and open none beyond them: more
    transactions at once than connections all complete, on that many database sessions."""
    from coldbench.api.app import create_app

    settings = Settings(
        database_url=live_db,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        db_async_pool_size=2,
        db_sync_pool_size=3,
    )
    app = create_app(settings)
    database: AsyncDatabase = app.state.database
    sync_pool, async_pool = app.state.engine.pool, database.engine.pool

    def backend() -> Program[int]:
        pid = (yield Execute(sa.text("SELECT pg_backend_pid()"))).scalar()
        yield Execute(sa.text("SELECT pg_sleep(0.05)"))
        return int(pid)

    async def scenario() -> list[int]:
        try:
            return await asyncio.gather(*(database.run(backend) for _ in range(12)))
        finally:
            await database.engine.dispose()

    backends = asyncio.run(scenario())
    app.state.engine.dispose()
    assert (sync_pool.size(), sync_pool._max_overflow) == (3, 0)  # type: ignore[attr-defined]
    assert (async_pool.size(), async_pool._max_overflow) == (2, 0)  # type: ignore[attr-defined]
    assert len(backends) == 12
    assert len(set(backends)) == 2


def test_bulk_transactions_take_turns_and_others_pass_them(live_db: str) -> None:
    """Uploads' and completions' transactions (`bulk=True`) run `bulk_max` at a time; the
    others (claims, heartbeats, submissions) do not wait for them."""
    spans: dict[str, tuple[float, float]] = {}

    def timed(name: str) -> Program[None]:
        started = time.perf_counter()
        yield Execute(sa.text("SELECT pg_sleep(0.1)"))
        spans[name] = (started, time.perf_counter())

    async def scenario() -> None:
        engine = make_async_engine(live_db, pool_size=4, max_overflow=0)
        database = AsyncDatabase(engine, make_sessionmaker(make_engine(live_db)), bulk_max=1)
        try:
            await asyncio.gather(
                *(database.run(partial(timed, f"bulk-{i}"), bulk=True) for i in range(3)),
                database.read(partial(timed, "bulk-read"), bulk=True),
                database.run(partial(timed, "claim")),
            )
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    bulk = sorted(span for name, span in spans.items() if name.startswith("bulk"))
    assert len(bulk) == 4
    for (_, end), (start, _) in zip(bulk, bulk[1:], strict=False):
        assert start >= end  # one at a time
    # The other one ran beside the first, without waiting for the turns.
    assert spans["claim"][0] < bulk[0][1] and spans["claim"][1] < bulk[2][0]
