"""Runs: what every request about one attempt of a run shares (its reads and refusals).

A run is one reproduction slot of a job. Each lease of it is an attempt (run_attempts): when a
lease is lost (no heartbeat for lease_ttl_s, or past the run's hard timeout) the attempt is
recorded as expired and the run is queued again as the next attempt, up to max_attempts. A run
that reports its own failure is final: a benchmark failure is a result, not retried.

The domain's modules, by what a run goes through:

- `claim`: lease requests (a long-poll on the event loop; each claim a grouped transaction);
- `heartbeat`: a host's heartbeats, which keep its lease alive and report progress;
- `completion`: a host's completion of its attempt (then ingest, `ingest`);
- `expiry`: leases lost (the periodic sweep) and hosts revoked, which requeue runs;
- this module: the reads of a run and an attempt those share, and their refusals.

Which requests run as programs of Core statements (`api/transactions.py`: on the event loop,
through asyncpg on PostgreSQL) and which through the ORM on a sync session in a worker thread:

- programs: `POST /leases` (`claim.claim_group_program`, grouped with concurrent claims),
  `POST /workers/heartbeat` (`heartbeat.heartbeat_program`), `PUT /runs/{id}/artifacts/{name}`
  (`api/artifacts/service.py`: a check before the body, the row after it), `POST
  /runs/{id}/complete` of the current attempt (`completion.complete_program`) and `POST /jobs`
  (`api/jobs/service.py: submit_group_program`, grouped);
- the ORM: a late completion (`completion.complete_late`), a bisection's first step
  (`api/jobs/service.py: create_bisection`), registration, calibration reports, the admin's
  requests, cancelling, every page and read, and off the request path lease expiry and
  revocation (`expiry`), ingest (`ingest`) and analysis (Celery tasks).

The programs are the requests every agent sends all the time, whose CPU sets how many agents
one API process serves; the ORM serves the rest.
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.errors import Forbidden, NotFound
from coldbench.api.hosts.models import Host
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.evidence.contract.protocol import RunState

_runs = cast(sa.Table, Run.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)

# The columns of an audit row a program writes (api/auth/models.py AuditEvent).
AUDIT_COLUMNS = ("at", "actor", "kind", "subject_id", "detail")


def get_run(*, db_session: Session, run_id: str) -> Run:
    run = db_session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}")
    return run


def get_attempt(*, db_session: Session, run_id: str, attempt: int) -> RunAttempt | None:
    return db_session.scalars(
        sa.select(RunAttempt).where(RunAttempt.run_id == run_id, RunAttempt.attempt == attempt)
    ).one_or_none()


def host_attempt(*, db_session: Session, host: Host, run_id: str, attempt: int) -> RunAttempt:
    """The attempt `attempt` of run_id if this host held it; NotFound or Forbidden otherwise."""
    get_run(db_session=db_session, run_id=run_id)
    row = get_attempt(db_session=db_session, run_id=run_id, attempt=attempt)
    if row is None or row.host_id != host.id:
        raise Forbidden(f"run {run_id} attempt {attempt} is not leased to this worker")
    return row


def is_current(run: Run, host: Host, attempt: int) -> bool:
    return run.state == RunState.LEASED and run.host_id == host.id and run.attempt == attempt


# A run as a host's request about one of its attempts sees it: the run's state, holder and
# current attempt, and who held attempt `w_attempt` (NULL: no such attempt).
RUN_AND_ATTEMPT = (
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
RUN_AND_ATTEMPT_AS_WORKER = auth_service.with_worker_secret(RUN_AND_ATTEMPT)


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


def held_by(statement: Any) -> Any:
    """`statement` limited to the run `w_run` while attempt `w_attempt` of it is leased to
    host `w_host`."""
    return statement.where(
        _runs.c.id == sa.bindparam("w_run", type_=_runs.c.id.type),
        _runs.c.state == RunState.LEASED,
        _runs.c.host_id == sa.bindparam("w_host", type_=_runs.c.host_id.type),
        _runs.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
    )
