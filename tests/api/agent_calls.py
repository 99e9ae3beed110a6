"""An agent's requests as service calls on a test's sync session: the programs the endpoints
run (api/runs/claim.py, heartbeat.py, completion.py), driven by `run_in_session`, with the
ORM objects the test holds read again afterwards."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.runs import claim, completion
from coldbench.api.runs import heartbeat as run_heartbeat
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings
from coldbench.api.transactions import run_in_session, run_one_in_session
from coldbench.evidence.contract.protocol import Lease


def expire_loaded(db_session: Session, *keys: tuple[type, str | None]) -> None:
    """Objects of this session read these rows again when next used (the programs write
    through Core, past the identity map)."""
    for model, key in keys:
        if key is None:
            continue
        loaded = db_session.identity_map.get(identity_key(model, key))
        if loaded is not None:
            db_session.expire(loaded)


def claim_lease(
    *,
    db_session: Session,
    settings: Settings,
    host: Host,
    report: claim.HostReport | None = None,
) -> Lease | None:
    """One claim for a host the test loaded (no token: the host is trusted)."""
    claimed = run_one_in_session(
        db_session,
        claim.claim_group_program,
        claim.ClaimRequest(
            host_id=host.id,
            report=report,
            settings=settings,
            dialect=db_session.get_bind().dialect.name,
        ),
    )
    # The host object shows what was written, without a second write at the next flush.
    for name, value in claimed.host_values.items():
        set_committed_value(host, name, value)
    if claimed.lease is not None:
        expire_loaded(db_session, (Run, claimed.lease.run_id), (Job, claimed.lease.job_id))
    return claimed.lease


def heartbeat(
    *,
    db_session: Session,
    settings: Settings,
    host_id: str,
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
) -> bool:
    cancel = run_in_session(
        db_session,
        run_heartbeat.heartbeat_program(
            settings=settings, host_id=host_id, run_id=run_id, attempt=attempt, progress=progress
        ),
    )
    expire_loaded(db_session, (Host, host_id), (Run, run_id))
    return cancel


def complete_run(
    *,
    db_session: Session,
    host_id: str,
    run_id: str,
    attempt: int,
    status: str,
    reason: str | None,
    manifest: dict[str, Any],
) -> completion.Completed:
    """What `POST /runs/{id}/complete` does: the program, or the late path; then the tasks."""
    arguments: dict[str, Any] = {
        "host_id": host_id,
        "run_id": run_id,
        "attempt": attempt,
        "status": status,
        "reason": reason,
        "manifest": manifest,
    }
    written = run_in_session(
        db_session,
        completion.complete_program(**arguments, dialect=db_session.get_bind().dialect.name),
    )
    if not isinstance(written, completion.CompletionWritten):
        return completion.complete_late(db_session=db_session, **arguments)
    expire_loaded(db_session, (Run, run_id), (Job, written.job_id), (Host, host_id))
    completion.send_completion_tasks(written)
    return written.completed
