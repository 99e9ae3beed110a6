"""Runs: lease claims, heartbeats, completion and expiry.

A run is one reproduction slot of a job. Each lease of it is an attempt (run_attempts): when a
lease is lost (no heartbeat for lease_ttl_s, or past the run's hard timeout) the attempt is
recorded as expired and the run is queued again as the next attempt, up to max_attempts. A run
that reports its own failure is final: a benchmark failure is a result, not retried.

A lease request long-polls on the event loop (`wait_for_lease`): each claim is one short
transaction, and between claims the request waits for `wakeup.announce_work` from whoever
queued a run. Expiry is not part of a claim: the periodic sweep (`expire_leases`, run by Celery
beat and by each API process, see `sweep_leases`) requeues lost runs and announces them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any, cast

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key
from starlette.concurrency import run_in_threadpool

from api import dispatch
from api.artifacts.models import Artifact
from api.auth import service as auth_service
from api.auth.models import AuditEvent
from api.database import utcnow
from api.errors import Conflict, Forbidden, Invalid, NotFound, validation_message
from api.hosts import service as host_service
from api.hosts.models import Host
from api.hosts.service import LeasingHost
from api.jobs import service as job_service
from api.jobs.models import Job
from api.runs.models import Run, RunAttempt
from api.runs.wakeup import WorkSignal, announce_work
from api.settings import Settings
from api.transactions import Database, Execute, Program, run_in_session
from evidence.protocol import JobState, Lease, RepositoryOffer, RunState
from evidence.schemas import JobSpec, Manifest

log = logging.getLogger(__name__)

REQUIRED_FILES = ("records.jsonl", "provenance.json")


def get_run(*, db_session: Session, run_id: str) -> Run:
    run = db_session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}")
    return run


def get_attempt(*, db_session: Session, run_id: str, attempt: int) -> RunAttempt | None:
    return db_session.scalars(
        sa.select(RunAttempt).where(RunAttempt.run_id == run_id, RunAttempt.attempt == attempt)
    ).one_or_none()


def run_attempts(*, db_session: Session, run_id: str) -> list[RunAttempt]:
    return list(
        db_session.scalars(
            sa.select(RunAttempt).where(RunAttempt.run_id == run_id).order_by(RunAttempt.attempt)
        )
    )


def host_attempt(*, db_session: Session, host: Host, run_id: str, attempt: int) -> RunAttempt:
    """The attempt `attempt` of run_id if this host held it; NotFound or Forbidden otherwise."""
    get_run(db_session=db_session, run_id=run_id)
    row = get_attempt(db_session=db_session, run_id=run_id, attempt=attempt)
    if row is None or row.host_id != host.id:
        raise Forbidden(f"run {run_id} attempt {attempt} is not leased to this worker")
    return row


def is_current(run: Run, host: Host, attempt: int) -> bool:
    return run.state == RunState.LEASED and run.host_id == host.id and run.attempt == attempt


# --- claiming ---------------------------------------------------------------------------

# Queued runs looked at per query while searching for one this host may take: the oldest
# first, then the next page, so a host that fits none of the oldest still finds newer work.
CANDIDATE_PAGE = 100
CANDIDATE_PAGES_MAX = 20
# Runs offered to the final SKIP LOCKED pick: enough that 50 concurrent claimers find one
# unlocked, few enough to keep the statement small.
ELIGIBLE_MAX = 64
_SPEC_CACHE_MAX = 4096
_spec_cache: OrderedDict[str, tuple[JobSpec, dict[str, Any]]] = OrderedDict()
_spec_cache_lock = threading.Lock()


@dataclass(frozen=True)
class HostReport:
    """What a host says about itself with a lease request: its fingerprint and (None from agents
    that do not send them, which keeps what the host registered) its repositories and models.
    Never labels: those come from enrollment and the admin."""

    fingerprint: dict[str, Any]
    repositories: dict[str, RepositoryOffer] | None = None
    models: list[str] | None = None


# The claim runs as SQLAlchemy Core statements on the session's connection (its transaction):
# no ORM unit of work, autoflush or identity-map bookkeeping, which were most of a claim's CPU
# (7 to 10 ms a claim under load, measured with py-spy; docs/RELIABILITY.md).
_runs = cast(sa.Table, Run.__table__)
_jobs = cast(sa.Table, Job.__table__)
_hosts = cast(sa.Table, Host.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)
_audit = cast(sa.Table, AuditEvent.__table__)


def _job_specs(job_ids: set[str]) -> Program[dict[str, tuple[JobSpec, dict[str, Any]]]]:
    """Parsed specs by job id; a job's spec never changes, so each is parsed once per process."""
    found: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
    with _spec_cache_lock:
        for job_id in job_ids:
            if job_id in _spec_cache:
                found[job_id] = _spec_cache[job_id]
    missing = job_ids - found.keys()
    if missing:
        rows = (
            yield Execute(sa.select(_jobs.c.id, _jobs.c.spec).where(_jobs.c.id.in_(missing)))
        ).all()
        with _spec_cache_lock:
            for job_id, spec_json in rows:
                found[job_id] = (JobSpec.model_validate(spec_json), spec_json)
                _spec_cache[job_id] = found[job_id]
            while len(_spec_cache) > _SPEC_CACHE_MAX:
                _spec_cache.popitem(last=False)
    return found


_CANDIDATES = (
    sa.select(_runs.c.id, _runs.c.job_id, _runs.c.slot, _jobs.c.created_at)
    .join(_jobs, _jobs.c.id == _runs.c.job_id)
    .where(
        _runs.c.state == RunState.QUEUED,
        _jobs.c.state.in_((JobState.QUEUED, JobState.RUNNING)),
    )
    .order_by(_jobs.c.created_at, _jobs.c.id, _runs.c.slot)
    .limit(CANDIDATE_PAGE)
)


def _eligible_run_ids(host: LeasingHost) -> Program[list[str]]:
    """Queued runs this host may take, oldest job first (no locks taken)."""
    after: tuple[Any, str, int] | None = None
    for _ in range(CANDIDATE_PAGES_MAX):
        query = _CANDIDATES
        if after is not None:
            query = query.where(sa.tuple_(_jobs.c.created_at, _jobs.c.id, _runs.c.slot) > after)
        candidates = (yield Execute(query)).all()
        if not candidates:
            return []
        job_ids = {row.job_id for row in candidates}
        specs = yield from _job_specs(job_ids)
        # `hosts: N` reproductions run on N distinct hosts: a host that held another slot of
        # a job never takes a second one (it may take a requeued attempt of its own slot).
        shared = {job_id for job_id in job_ids if specs[job_id][0].hosts > 1}
        touched = (
            set(
                (
                    yield Execute(
                        sa.select(_runs.c.job_id, _runs.c.slot)
                        .join(_attempts, _attempts.c.run_id == _runs.c.id)
                        .where(_attempts.c.host_id == host.id, _runs.c.job_id.in_(shared))
                    )
                ).all()
            )
            if shared
            else set()
        )
        touched_jobs = {job_id for job_id, _ in touched}
        # A host's eligibility depends only on the job's spec: judged once per job.
        fits: dict[str, bool] = {}
        eligible = []
        for row in candidates:
            if row.job_id in touched_jobs and (row.job_id, row.slot) not in touched:
                continue
            if row.job_id not in fits:
                spec = specs[row.job_id][0]
                fits[row.job_id] = host_service.why_host_cannot_run(host, spec) is None
            if fits[row.job_id]:
                eligible.append(row.id)
                if len(eligible) == ELIGIBLE_MAX:
                    break
        if eligible:
            return eligible
        last = candidates[-1]
        after = (last.created_at, last.job_id, last.slot)
    return []


@dataclass(frozen=True)
class Claimed:
    """What a claim did: the lease (None: nothing fits, or the host holds a run) and the host
    columns it wrote."""

    lease: Lease | None
    host_values: dict[str, Any]


def claim_program(
    *, settings: Settings, host: LeasingHost, report: HostReport | None, dialect: str
) -> Program[Claimed]:
    """One short transaction: take the oldest queued run this host may run.

    Rows of other hosts' candidates are never locked: only the run being taken is, by one
    `UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED)`, so concurrent claimers pass
    each other instead of queueing. Core statements, about seven in all: the host's row is
    written once, at the end, with its report and its new health.
    """
    host_values: dict[str, Any] = {}
    if report is not None:
        host_values = host_service.host_report_values(
            fingerprint=report.fingerprint,
            repositories=report.repositories,
            models=report.models,
        )
        if host.health == "lost":
            host_values["health"] = "ready"
        # Eligibility is judged on the host as it will be written (it is, in this
        # transaction).
        host = replace(
            host,
            **{
                name: host_values[name]
                for name in ("fingerprint", "repositories", "models")
                if name in host_values
            },
        )
    claimed = yield from _claim(settings, host, dialect)
    lease = None
    if claimed is not None:
        run_id, job_id, attempt = claimed
        now = utcnow()
        yield Execute(
            _INSERT_ATTEMPT,
            {
                "run_id": run_id,
                "attempt": attempt,
                "host_id": host.id,
                "state": RunState.LEASED,
                "started_at": now,
            },
        )
        host_values["health"] = "busy"
        # A claimed run makes its job running (refresh_job_state's rule, without reading
        # every run of the job).
        yield Execute(_JOB_RUNNING, {"w_job": job_id, "w_now": now})
        yield Execute(
            _INSERT_AUDIT,
            {
                "at": now,
                "actor": f"host:{host.id}",
                "kind": "run.leased",
                "subject_id": run_id,
                "detail": {"attempt": attempt},
            },
        )
        specs = yield from _job_specs({job_id})
        lease = Lease(
            run_id=run_id,
            attempt=attempt,
            job_id=job_id,
            spec=specs[job_id][1],
            timeout_s=settings.run_timeout_s,
            lease_ttl_s=settings.lease_ttl_s,
        )
    if host_values:
        # The columns set are the parameters' keys (the statement is built once).
        yield Execute(_UPDATE_HOST, {"w_host": host.id, **host_values})
    return Claimed(lease, host_values)


# Built once, like every statement of the request paths: constructing a statement and its cache
# key costs more Python than executing a cached one.
_INSERT_ATTEMPT = sa.insert(_attempts)
_INSERT_AUDIT = sa.insert(_audit)
_UPDATE_HOST = sa.update(_hosts).where(_hosts.c.id == sa.bindparam("w_host"))
_UPDATE_JOB = sa.update(_jobs).where(_jobs.c.id == sa.bindparam("w_job"))
_JOB_RUNNING = (
    sa.update(_jobs)
    .where(_jobs.c.id == sa.bindparam("w_job"), _jobs.c.state == JobState.QUEUED)
    .values(
        state=JobState.RUNNING,
        updated_at=sa.bindparam("w_now", type_=_jobs.c.updated_at.type),
    )
)


def _log_claim(claimed: Claimed, host_id: str) -> None:
    if claimed.lease is not None:
        log.info("run leased", extra={"run_id": claimed.lease.run_id, "host_id": host_id})


def claim_lease(
    *, db_session: Session, settings: Settings, host: Host, report: HostReport | None = None
) -> Lease | None:
    """`claim_program` on a sync session (the tests', the command line's)."""
    claimed = run_in_session(
        db_session,
        claim_program(
            settings=settings,
            host=host_service.LeasingHost.of(host),
            report=report,
            dialect=db_session.get_bind().dialect.name,
        ),
    )
    # The host object shows what was written, without a second write at the next flush.
    for name, value in claimed.host_values.items():
        set_committed_value(host, name, value)
    if claimed.lease is not None:
        # Objects of this session (tests share one) read the run and its job again.
        _expire_loaded(db_session, (Run, claimed.lease.run_id), (Job, claimed.lease.job_id))
    _log_claim(claimed, host.id)
    return claimed.lease


# The claim's statements, built once: only their parameters change from claim to claim.
_HOST_BUSY = (
    sa.select(
        sa.exists().where(
            _runs.c.host_id == sa.bindparam("host_id"), _runs.c.state == RunState.LEASED
        )
    )
    .select_from(_hosts)
    .where(_hosts.c.id == sa.bindparam("host_id"))
    .with_for_update(of=_hosts)
)


def _claim_statement(eligible: sa.ColumnElement[bool]) -> sa.UpdateBase:
    """UPDATE the oldest eligible queued run that no concurrent claimer has locked."""
    chosen = (
        sa.select(_runs.c.id)
        .join(_jobs, _jobs.c.id == _runs.c.job_id)
        .where(eligible, _runs.c.state == RunState.QUEUED)
        .order_by(_jobs.c.created_at, _jobs.c.id, _runs.c.slot)
        .limit(1)
        .with_for_update(of=_runs, skip_locked=True)
        .scalar_subquery()
    )
    when = _runs.c.leased_at.type
    # The guard on state keeps the claim atomic also where FOR UPDATE is a no-op (SQLite).
    return (
        sa.update(_runs)
        .where(_runs.c.id == chosen, _runs.c.state == RunState.QUEUED)
        .values(
            state=RunState.LEASED,
            host_id=sa.bindparam("host_id", type_=_runs.c.host_id.type),
            attempt=_runs.c.attempt + 1,
            leased_at=sa.bindparam("now", type_=when),
            lease_expires_at=sa.bindparam("expires", type_=when),
            deadline_at=sa.bindparam("deadline", type_=when),
            progress=None,
        )
        .returning(_runs.c.id, _runs.c.job_id, _runs.c.attempt)
    )


# PostgreSQL: `id = ANY(%(eligible)s)`, one array parameter, so the SQL text is the same for
# any number of eligible runs (psycopg caches and prepares it; an IN list of 1 to 64
# placeholders was a new statement to convert each time). Elsewhere an expanding IN.
_CLAIM_ANY = _claim_statement(
    _runs.c.id == sa.any_(sa.bindparam("eligible", type_=postgresql.ARRAY(sa.String)))
)
_CLAIM_IN = _claim_statement(_runs.c.id.in_(sa.bindparam("eligible", expanding=True)))


# Claims of one request that lost every eligible run to concurrent claimers before it looks
# again at once (with work queued, waiting for the next notification would cost up to
# lease_poll_s).
CLAIM_RACES_MAX = 3


def _claim(
    settings: Settings, host: LeasingHost, dialect: str
) -> Program[tuple[str, str, int] | None]:
    """(run id, job id, attempt) of the run this host just took, or None (nothing fits, or
    the host holds a run)."""
    # Serialize the claims of one host (one run per host at a time): lock its row and look
    # for a run it holds in one statement.
    busy = (yield Execute(_HOST_BUSY, {"host_id": host.id})).scalar()
    if busy:
        return None
    for _ in range(CLAIM_RACES_MAX):
        eligible = yield from _eligible_run_ids(host)
        if not eligible:
            return None
        now = utcnow()
        claimed = (
            yield Execute(
                _CLAIM_ANY if dialect == "postgresql" else _CLAIM_IN,
                {
                    "eligible": eligible,
                    "host_id": host.id,
                    "now": now,
                    "expires": now + timedelta(seconds=settings.lease_ttl_s),
                    "deadline": now + timedelta(seconds=settings.run_timeout_s),
                },
            )
        ).one_or_none()
        if claimed is not None:
            return str(claimed[0]), str(claimed[1]), int(claimed[2])
        # Every eligible run was taken meanwhile: each statement sees the latest commits
        # (READ COMMITTED), so the next look finds what is still queued.
    return None


async def wait_for_lease(
    *,
    db: Database,
    settings: Settings,
    host: LeasingHost,
    signal: WorkSignal,
    report: HostReport,
    wait_s: float,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> Lease | None:
    """Long-poll on the event loop: claim, and between claims wait for a notification that
    work was queued (bounded by lease_poll_s); None after wait_s seconds without a run, or as
    soon as `gone()` says the client left (a run claimed for nobody would wait for expiry).

    No database connection is held while waiting: each claim commits or rolls back.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait_s, settings.lease_wait_max_s)
    pending_report: HostReport | None = report
    while True:
        seen = signal.generation
        claimed = await db.run(
            partial(
                claim_program,
                settings=settings,
                host=host,
                report=pending_report,
                dialect=db.dialect_name,
            )
        )
        _log_claim(claimed, host.id)
        if pending_report is not None:
            host = replace(
                host,
                **{k: v for k, v in claimed.host_values.items() if k in _LEASING_HOST_FIELDS},
            )
        pending_report = None
        remaining = deadline - loop.time()
        if claimed.lease is not None or remaining <= 0:
            return claimed.lease
        await signal.wait(since=seen, timeout_s=min(remaining, settings.lease_poll_s))
        if gone is not None and await gone():
            return None


_LEASING_HOST_FIELDS = {"fingerprint", "repositories", "models", "health"}


# --- heartbeat ---------------------------------------------------------------------------

# Heartbeats and completions are most of an agent's requests: Core statements on the session's
# connection, like the claim (through the ORM each cost 7 to 23 ms of server CPU under load,
# most of it loading, autoflushing and flushing objects; docs/RELIABILITY.md).
_artifacts = cast(sa.Table, Artifact.__table__)

# A run as a host's request about one of its attempts sees it: the run's state, holder and
# current attempt, and who held attempt `w_attempt` (NULL: no such attempt).
_RUN_AND_ATTEMPT = (
    sa.select(
        _runs.c.state,
        _runs.c.host_id,
        _runs.c.attempt,
        _runs.c.job_id,
        _attempts.c.host_id.label("attempt_host_id"),
        _attempts.c.state.label("attempt_state"),
    )
    .select_from(
        _runs.outerjoin(
            _attempts,
            sa.and_(
                _attempts.c.run_id == _runs.c.id,
                _attempts.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
            ),
        )
    )
    .where(_runs.c.id == sa.bindparam("w_run", type_=_runs.c.id.type))
)


def require_holder(found: Any, *, host_id: str, run_id: str, attempt: int) -> None:
    """NotFound when `found` (a row of a run and one attempt) is None, Forbidden unless that
    attempt was this host's: `host_attempt`'s refusals, for Core rows."""
    if found is None:
        raise NotFound(f"no run {run_id!r}")
    if found.attempt_host_id != host_id:
        raise Forbidden(f"run {run_id} attempt {attempt} is not leased to this worker")


def row_is_current(found: Any, host_id: str, attempt: int) -> bool:
    """`is_current` for a Core row of the run."""
    return found.state == RunState.LEASED and found.host_id == host_id and found.attempt == attempt


def _held_by(statement: Any) -> Any:
    """`statement` limited to the run `w_run` while attempt `w_attempt` of it is leased to
    host `w_host`."""
    return statement.where(
        _runs.c.id == sa.bindparam("w_run", type_=_runs.c.id.type),
        _runs.c.state == RunState.LEASED,
        _runs.c.host_id == sa.bindparam("w_host", type_=_runs.c.host_id.type),
        _runs.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
    )


_WHEN = _runs.c.lease_expires_at.type
_HOST_SEEN = (
    sa.update(_hosts)
    .where(_hosts.c.id == sa.bindparam("w_host", type_=_hosts.c.id.type))
    .values(last_heartbeat_at=sa.bindparam("w_now", type_=_WHEN))
)
_RENEW = _held_by(sa.update(_runs)).values(lease_expires_at=sa.bindparam("w_expires", type_=_WHEN))
_RENEW_WITH_PROGRESS = _held_by(sa.update(_runs)).values(
    lease_expires_at=sa.bindparam("w_expires", type_=_WHEN),
    progress=sa.bindparam("w_progress", type_=_runs.c.progress.type),
)


def heartbeat_program(
    *,
    settings: Settings,
    host_id: str,
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
) -> Program[bool]:
    """Record that the host is alive (and the run's progress); True when it should stop.

    Two or three statements: the host's heartbeat time, then the lease renewed only where
    the run is still leased to this host as this attempt; when it is not, why (not this
    host's attempt: refused; cancelled with its job, or lost and requeued: stop working)."""
    if run_id is not None and attempt is None:
        raise Invalid("heartbeat names a run_id without its attempt")
    now = utcnow()
    yield Execute(_HOST_SEEN, {"w_host": host_id, "w_now": now})
    if run_id is None:
        return False
    params: dict[str, Any] = {
        "w_run": run_id,
        "w_host": host_id,
        "w_attempt": attempt,
        "w_expires": now + timedelta(seconds=settings.lease_ttl_s),
    }
    if progress is not None:
        params["w_progress"] = progress
    renewed = (yield Execute(_RENEW if progress is None else _RENEW_WITH_PROGRESS, params)).rowcount
    if renewed == 1:
        return False
    found = (yield Execute(_RUN_AND_ATTEMPT, {"w_run": run_id, "w_attempt": attempt})).one_or_none()
    require_holder(found, host_id=host_id, run_id=run_id, attempt=cast(int, attempt))
    return True


def heartbeat(
    *,
    db_session: Session,
    settings: Settings,
    host_id: str,
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
) -> bool:
    """`heartbeat_program` on a sync session."""
    cancel = run_in_session(
        db_session,
        heartbeat_program(
            settings=settings, host_id=host_id, run_id=run_id, attempt=attempt, progress=progress
        ),
    )
    _expire_loaded(db_session, (Host, host_id), (Run, run_id))
    return cancel


def _expire_loaded(db_session: Session, *keys: tuple[type, str | None]) -> None:
    """Objects of this session (tests share one) read these rows again when next used."""
    for model, key in keys:
        if key is None:
            continue
        loaded = db_session.identity_map.get(identity_key(model, key))
        if loaded is not None:
            db_session.expire(loaded)


# --- completion -------------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    """What a completion answers: the run, its attempt and the state it is in now."""

    run_id: str
    attempt: int
    state: str


_UPLOADED = sa.select(_artifacts.c.name, _artifacts.c.sha256, _artifacts.c.bytes).where(
    _artifacts.c.run_id == sa.bindparam("w_run", type_=_artifacts.c.run_id.type),
    _artifacts.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
)
_END_ATTEMPT = (
    sa.update(_attempts)
    .where(
        _attempts.c.run_id == sa.bindparam("w_run", type_=_attempts.c.run_id.type),
        _attempts.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
    )
    .values(
        state=sa.bindparam("w_state", type_=_attempts.c.state.type),
        ended_at=sa.bindparam("w_now", type_=_WHEN),
        reason=sa.bindparam("w_reason", type_=_attempts.c.reason.type),
    )
)
_HOST_READY = (
    sa.update(_hosts)
    .where(
        _hosts.c.id == sa.bindparam("w_host", type_=_hosts.c.id.type),
        _hosts.c.health != "ready",
    )
    .values(health="ready")
)
_JOB_AND_RUN_STATES = (
    sa.select(_jobs.c.state, _runs.c.state.label("run_state"))
    .select_from(_jobs.join(_runs, _runs.c.job_id == _jobs.c.id))
    .where(_jobs.c.id == sa.bindparam("w_job", type_=_jobs.c.id.type))
)


def _refresh_job_state(job_id: str, now: Any) -> Program[bool]:
    """`job_service.refresh_job_state` as Core statements: one read of the job's state and
    its runs' states, one write when the state changes; True when analysis should start."""
    rows = (yield Execute(_JOB_AND_RUN_STATES, {"w_job": job_id})).all()
    if not rows:
        return False
    change = job_service.next_job_state(rows[0].state, [row.run_state for row in rows])
    if change is None:
        return False
    new_state, reason = change
    values: dict[str, Any] = {}
    if new_state != rows[0].state:
        values.update(state=new_state, updated_at=now)
    if reason is not None:
        values["reason"] = reason
    yield Execute(_UPDATE_JOB, {"w_job": job_id, **values})
    return new_state == JobState.ANALYZING


@dataclass(frozen=True)
class CompletionWritten:
    """A current attempt completed: what to answer, and what to send after the commit."""

    completed: Completed
    job_id: str
    analyze: bool


class _Late:
    """The attempt is not current (a retry, a late one, or one that lost a race with expiry):
    judged by `complete_late` on the ORM."""


LATE = _Late()


def complete_program(
    *,
    host_id: str,
    run_id: str,
    attempt: int,
    status: str,
    reason: str | None,
    manifest: dict[str, Any],
) -> Program[CompletionWritten | _Late]:
    """Close the current attempt: one read of the run and the attempt, one of its uploads,
    updates guarded by the run still being leased to this host as this attempt, the audit row
    and the job's state. `LATE` (nothing written) when the attempt is not current."""
    found = (yield Execute(_RUN_AND_ATTEMPT, {"w_run": run_id, "w_attempt": attempt})).one_or_none()
    require_holder(found, host_id=host_id, run_id=run_id, attempt=attempt)
    if not row_is_current(found, host_id, attempt):
        return LATE
    try:
        parsed = Manifest.model_validate(manifest)
    except ValidationError as error:
        raise Invalid(validation_message("manifest", error), field="manifest") from None
    now = utcnow()
    held = {"w_run": run_id, "w_host": host_id, "w_attempt": attempt}
    values: dict[str, Any] = {
        "manifest": parsed.model_dump(mode="json"),
        "completed_at": now,
        "lease_expires_at": None,
    }
    if status == "succeeded":
        uploaded = {
            row.name: row
            for row in (yield Execute(_UPLOADED, {"w_run": run_id, "w_attempt": attempt}))
        }
        check_uploads(parsed, uploaded)
        values["state"] = RunState.COMPLETED
    elif status == "failed":
        values["state"] = RunState.FAILED
        values["reason"] = reason or "the worker reported a failure without a reason"
    else:
        raise Invalid(f"status must be succeeded or failed, not {status!r}")
    state = values["state"]
    if (yield Execute(_held_by(sa.update(_runs)).values(**values), held)).rowcount != 1:
        # Expired (or cancelled) since the read above: judged again as a late completion
        # (this transaction wrote nothing).
        return LATE
    yield Execute(
        _END_ATTEMPT,
        {"w_run": run_id, "w_attempt": attempt, "w_state": state, "w_now": now, "w_reason": reason},
    )
    yield Execute(_HOST_READY, {"w_host": host_id})
    yield Execute(
        _INSERT_AUDIT,
        {
            "at": now,
            "actor": f"host:{host_id}",
            "kind": f"run.{state}",
            "subject_id": run_id,
            "detail": {"attempt": attempt, "reason": reason},
        },
    )
    analyze = yield from _refresh_job_state(found.job_id, now)
    return CompletionWritten(Completed(run_id, attempt, str(state)), found.job_id, analyze)


def send_completion_tasks(written: CompletionWritten) -> None:
    """After the commit: ingest a completed run, or analyze a job its failure finished."""
    if written.completed.state == RunState.COMPLETED:
        dispatch.send_task("ingest_run", written.completed.run_id)
    elif written.analyze:
        dispatch.send_task("analyze_job", written.job_id)


def complete_run(
    *,
    db_session: Session,
    host_id: str,
    run_id: str,
    attempt: int,
    status: str,
    reason: str | None,
    manifest: dict[str, Any],
) -> Completed:
    """`complete_program` on a sync session; after the commit, send ingest (succeeded) or
    analysis (failed). A completion that is not current takes `complete_late`."""
    written = run_in_session(
        db_session,
        complete_program(
            host_id=host_id,
            run_id=run_id,
            attempt=attempt,
            status=status,
            reason=reason,
            manifest=manifest,
        ),
    )
    if isinstance(written, _Late):
        return complete_late(
            db_session=db_session,
            host_id=host_id,
            run_id=run_id,
            attempt=attempt,
            status=status,
            reason=reason,
            manifest=manifest,
        )
    _expire_loaded(db_session, (Run, run_id), (Job, written.job_id), (Host, host_id))
    send_completion_tasks(written)
    return written.completed


def check_uploads(parsed: Manifest, uploaded: dict[str, Any]) -> None:
    """Invalid unless every file the manifest lists (and each required one) was uploaded for
    this attempt with the listed digest and size; `uploaded` maps names to rows with
    `sha256` and `bytes`."""
    problems = [f"{name} (required)" for name in REQUIRED_FILES if name not in parsed.files]
    for name, entry in sorted(parsed.files.items()):
        stored = uploaded.get(name)
        if stored is None:
            problems.append(f"{name} (not uploaded)")
        elif stored.sha256 != entry.sha256 or stored.bytes != entry.bytes:
            problems.append(f"{name} (uploaded with another digest or size)")
    if problems:
        raise Invalid(f"manifest files not uploaded as listed: {', '.join(problems)}")


def complete_late(
    *,
    db_session: Session,
    host_id: str,
    run_id: str,
    attempt: int,
    status: str,
    reason: str | None,
    manifest: dict[str, Any],
) -> Completed:
    """A completion of an attempt that is no longer current: the same one again (a retried
    request) answers what was stored; any other is kept verbatim for audit, never ingested,
    and refused."""
    host = db_session.get(Host, host_id)
    assert host is not None  # authenticated in this request
    attempt_row = host_attempt(db_session=db_session, host=host, run_id=run_id, attempt=attempt)
    run = get_run(db_session=db_session, run_id=run_id)
    if is_current(run, host, attempt):
        # Current again meanwhile cannot happen (an attempt number is never reused); refuse
        # rather than complete it twice.
        raise Conflict(f"attempt {attempt} of run {run_id} changed while completing; retry")
    if (
        run.attempt == attempt
        and run.host_id == host.id
        and run.state in (RunState.COMPLETED, RunState.PROCESSED, RunState.FAILED)
        and attempt_row.state in (RunState.COMPLETED, RunState.FAILED)
    ):
        return Completed(run_id=run.id, attempt=run.attempt, state=run.state)
    attempt_row.late_complete = {
        "received_at": utcnow().isoformat(),
        "status": status,
        "reason": reason,
        "manifest": manifest,
    }
    auth_service.record_audit(
        db_session=db_session,
        actor=f"host:{host.id}",
        kind="run.late_complete",
        subject_id=run_id,
        attempt=attempt,
    )
    db_session.commit()
    raise Conflict(
        f"attempt {attempt} of run {run_id} is no longer current (run is {run.state}, "
        f"attempt {run.attempt}); its data is kept for audit but not used"
    )


# --- expiry -----------------------------------------------------------------------------


def expire_leases(*, db_session: Session, settings: Settings) -> list[str]:
    """Requeue runs whose lease or hard timeout passed; returns job ids to analyze (commits)."""
    now = utcnow()
    expired = list(
        db_session.scalars(
            sa.select(Run)
            .where(
                Run.state == RunState.LEASED,
                sa.or_(Run.lease_expires_at < now, Run.deadline_at < now),
            )
            .with_for_update(skip_locked=True)
        )
    )
    to_analyze = []
    for run in expired:
        timed_out = run.deadline_at is not None and run.deadline_at < now
        why = (
            f"run timeout of {settings.run_timeout_s} s passed"
            if timed_out
            else f"no heartbeat for {settings.lease_ttl_s} s"
        )
        if lose_attempt(db_session=db_session, settings=settings, run=run, why=why):
            to_analyze.append(run.job_id)
    if any(run.state == RunState.QUEUED for run in expired):
        announce_work(db_session)
    db_session.commit()
    return to_analyze


def lose_attempt(*, db_session: Session, settings: Settings, run: Run, why: str) -> bool:
    """End the leased attempt of `run` as expired and queue the run again (or expire it after
    max_attempts); True when the job should be analyzed. The caller commits."""
    now = utcnow()
    attempt_row = get_attempt(db_session=db_session, run_id=run.id, attempt=run.attempt)
    if attempt_row is not None:
        attempt_row.state = RunState.EXPIRED
        attempt_row.ended_at = now
        attempt_row.reason = why
    host = db_session.get(Host, run.host_id) if run.host_id else None
    if host is not None:
        host.health = "lost"
    if run.attempt < settings.max_attempts:
        run.state = RunState.QUEUED
        run.host_id = None
    else:
        run.state = RunState.EXPIRED
        run.reason = f"lost {run.attempt} attempts; last: {why}"
    run.lease_expires_at = None
    run.deadline_at = None
    auth_service.record_audit(
        db_session=db_session,
        actor="server",
        kind="run.attempt_expired",
        subject_id=run.id,
        attempt=run.attempt,
        reason=why,
        requeued=run.state == RunState.QUEUED,
    )
    return job_service.refresh_job_state(db_session=db_session, job_id=run.job_id)


async def sweep_leases(*, sessionmaker: Callable[[], Session], settings: Settings) -> None:
    """Expire lost leases every lease_sweep_s for as long as the process runs.

    Celery beat does the same; this keeps expiry going in a deployment without beat (the
    embedded default, tests) and costs one indexed query per interval. Several sweepers at once
    are safe: expired rows are taken with SKIP LOCKED.
    """

    def sweep_once() -> list[str]:
        with sessionmaker() as db_session:
            return expire_leases(db_session=db_session, settings=settings)

    while True:
        await asyncio.sleep(settings.lease_sweep_s)
        try:
            job_ids = await run_in_threadpool(sweep_once)
        except Exception:  # noqa: BLE001 - a database hiccup: log it, sweep again next time
            log.exception("lease sweep failed; retrying in %s s", settings.lease_sweep_s)
            continue
        for job_id in job_ids:
            await run_in_threadpool(dispatch.send_task, "analyze_job", job_id)
