"""Completion: a host closes its attempt of a run with a manifest of what it uploaded.

The current attempt's completion is a program of Core statements (`complete_program`); after
its commit the run is ingested (succeeded) or its job analysed (failed, when that finished the
job). A completion of an attempt that is no longer current is judged on the ORM
(`complete_late`): a retry answers what was stored, anything else is kept for audit and refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.artifacts.models import Artifact
from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import AuditEvent
from coldbench.api.database import utcnow
from coldbench.api.errors import Conflict, Invalid, validation_message
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.service import (
    AUDIT_COLUMNS,
    RUN_AND_ATTEMPT,
    RUN_AND_ATTEMPT_AS_WORKER,
    get_run,
    held_by,
    host_attempt,
    is_current,
    require_holder,
    row_is_current,
)
from coldbench.api.transactions import Execute, Program
from coldbench.evidence.contract.protocol import JobState, RunState
from coldbench.evidence.contract.schemas import Manifest

REQUIRED_FILES = ("records.jsonl", "provenance.json")

_runs = cast(sa.Table, Run.__table__)
_jobs = cast(sa.Table, Job.__table__)
_hosts = cast(sa.Table, Host.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)
_artifacts = cast(sa.Table, Artifact.__table__)
_audit = cast(sa.Table, AuditEvent.__table__)
_WHEN = _runs.c.lease_expires_at.type
_INSERT_AUDIT = sa.insert(_audit)
_UPDATE_JOB = sa.update(_jobs).where(_jobs.c.id == sa.bindparam("w_job"))


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


class _Upload(NamedTuple):
    """What `check_uploads` compares of a stored upload."""

    sha256: str
    bytes: int


# PostgreSQL: the run, the attempt and that attempt's uploads in one read (one round trip
# instead of two); each upload as [name, sha256, bytes].
_ATTEMPT_UPLOADS = (
    sa.select(
        sa.func.coalesce(
            sa.func.json_agg(
                sa.func.json_build_array(_artifacts.c.name, _artifacts.c.sha256, _artifacts.c.bytes)
            ),
            sa.func.json_build_array(),
        )
    )
    .where(
        _artifacts.c.run_id == sa.bindparam("w_run", type_=_artifacts.c.run_id.type),
        _artifacts.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
    )
    .scalar_subquery()
)
_RUN_ATTEMPT_AND_UPLOADS = RUN_AND_ATTEMPT.add_columns(
    sa.type_coerce(_ATTEMPT_UPLOADS, sa.JSON).label("uploads")
)
_RUN_ATTEMPT_AND_UPLOADS_AS_WORKER = auth_service.with_worker_secret(_RUN_ATTEMPT_AND_UPLOADS)
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
# The run closed by its current attempt's completion ([True]: a failure, with its reason).
_CLOSE_RUN = {
    failed: held_by(sa.update(_runs)).values(
        state=sa.bindparam("c_state", type_=_runs.c.state.type),
        manifest=sa.bindparam("c_manifest", type_=_runs.c.manifest.type),
        completed_at=sa.bindparam("c_now", type_=_WHEN),
        lease_expires_at=None,
        **({"reason": sa.bindparam("c_reason", type_=_runs.c.reason.type)} if failed else {}),
    )
    for failed in (False, True)
}
_HOST_READY = (
    sa.update(_hosts)
    .where(
        _hosts.c.id == sa.bindparam("w_host", type_=_hosts.c.id.type),
        _hosts.c.health != "ready",
    )
    .values(health="ready")
)


# PostgreSQL: the run closed and, only where it was (`closed` is empty when the attempt is no
# longer current), its attempt ended, its host ready and the audit row, in one statement
# instead of four; answers how many runs it closed (1, or 0: nothing written).
def _close_and_record(close: sa.Update) -> sa.Select[Any]:
    closed = close.returning(_runs.c.id).cte("closed")
    was_closed = sa.exists(sa.select(closed.c.id))
    audit_values = sa.select(
        *(sa.bindparam(f"a_{name}", type_=_audit.c[name].type) for name in AUDIT_COLUMNS)
    ).where(was_closed)
    return (
        sa.select(sa.func.count())
        .select_from(closed)
        .add_cte(
            _END_ATTEMPT.where(was_closed).cte("ended"),
            _HOST_READY.where(was_closed).cte("ready"),
            sa.insert(_audit).from_select(list(AUDIT_COLUMNS), audit_values).cte("audit"),
        )
    )


_CLOSE_AND_RECORD = {failed: _close_and_record(close) for failed, close in _CLOSE_RUN.items()}
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
    dialect: str,
    token: str | None = None,
) -> Program[CompletionWritten | _Late]:
    """Close the current attempt: one read of the run and the attempt (with `token`, the
    request's bearer token, checked in the same read: NotAuthenticated unless it is the
    host's secret; on PostgreSQL the attempt's uploads in the same read, elsewhere one read
    of its own), updates guarded by the run still being leased to this
    host as this attempt (on PostgreSQL one statement: `_CLOSE_AND_RECORD`), the audit row
    and the job's state. `LATE` (nothing written) when the attempt is not current."""
    is_pg = dialect == "postgresql"
    found = yield from auth_service.read_for_worker_program(
        _RUN_ATTEMPT_AND_UPLOADS if is_pg else RUN_AND_ATTEMPT,
        _RUN_ATTEMPT_AND_UPLOADS_AS_WORKER if is_pg else RUN_AND_ATTEMPT_AS_WORKER,
        {"w_run": run_id, "w_attempt": attempt},
        worker_id=host_id,
        token=token,
        present="state",
    )
    require_holder(found, host_id=host_id, run_id=run_id, attempt=attempt)
    if not row_is_current(found, host_id, attempt):
        return LATE
    try:
        parsed = Manifest.model_validate(manifest)
    except ValidationError as error:
        raise Invalid(validation_message("manifest", error), field="manifest") from None
    now = utcnow()
    values: dict[str, Any] = {
        "w_run": run_id,
        "w_host": host_id,
        "w_attempt": attempt,
        "c_manifest": parsed.model_dump(mode="json"),
        "c_now": now,
    }
    if status == "succeeded":
        if is_pg:
            uploaded: dict[str, Any] = {
                name: _Upload(sha256, size) for name, sha256, size in found.uploads
            }
        else:
            uploaded = {
                row.name: row
                for row in (yield Execute(_UPLOADED, {"w_run": run_id, "w_attempt": attempt}))
            }
        check_uploads(parsed, uploaded)
        values["c_state"] = RunState.COMPLETED
    elif status == "failed":
        values["c_state"] = RunState.FAILED
        values["c_reason"] = reason or "the worker reported a failure without a reason"
    else:
        raise Invalid(f"status must be succeeded or failed, not {status!r}")
    state = values["c_state"]
    ended = {"w_state": state, "w_now": now, "w_reason": reason}
    audit = {
        "at": now,
        "actor": f"host:{host_id}",
        "kind": f"run.{state}",
        "subject_id": run_id,
        "detail": {"attempt": attempt, "reason": reason},
    }
    failed = status == "failed"
    if dialect == "postgresql":
        params = {**values, **ended, **{f"a_{name}": value for name, value in audit.items()}}
        closed = (yield Execute(_CLOSE_AND_RECORD[failed], params)).scalar()
    else:
        closed = (yield Execute(_CLOSE_RUN[failed], values)).rowcount
        if closed == 1:
            yield Execute(_END_ATTEMPT, {"w_run": run_id, "w_attempt": attempt, **ended})
            yield Execute(_HOST_READY, {"w_host": host_id})
            yield Execute(_INSERT_AUDIT, audit)
    if closed != 1:
        # Expired (or cancelled) since the read above: judged again as a late completion
        # (this transaction wrote nothing).
        return LATE
    analyze = yield from _refresh_job_state(found.job_id, now)
    return CompletionWritten(Completed(run_id, attempt, str(state)), found.job_id, analyze)


def send_completion_tasks(written: CompletionWritten) -> None:
    """After the commit: ingest a completed run, or analyze a job its failure finished."""
    if written.completed.state == RunState.COMPLETED:
        dispatch.send_task("ingest_run", written.completed.run_id)
    elif written.analyze:
        dispatch.send_task("analyze_job", written.job_id)


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
