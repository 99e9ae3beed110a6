"""Expiry: leases that end without a completion, and the runs they give back.

A lease is lost when its host sends no heartbeat for lease_ttl_s or the run passes its hard
timeout (`expire_leases`, swept by Celery beat and by each API process: `sweep_leases`), or
when the admin revokes its host (`revoke_host`). Its attempt ends as expired and the run is
queued again (`lose_attempt`), up to max_attempts, and waiting hosts are told at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from coldbench.api import dispatch
from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.hosts import service as host_service
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.runs.models import Run
from coldbench.api.runs.service import get_attempt
from coldbench.api.runs.wakeup import announce_work
from coldbench.api.settings import Settings
from coldbench.evidence.contract.protocol import RunState

log = logging.getLogger(__name__)


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


def revoke_host(
    *, db_session: Session, settings: Settings, name_or_id: str, actor: str
) -> tuple[Host, list[str]]:
    """Refuse the host's secret from now on and queue its leased run again; returns (host, ids
    of the runs requeued or expired). Idempotent."""
    host = host_service.find_host(db_session=db_session, name_or_id=name_or_id)
    db_session.scalars(sa.select(Host.id).where(Host.id == host.id).with_for_update()).one()
    if host.revoked_at is None:
        host.revoked_at = utcnow()
        auth_service.record_audit(
            db_session=db_session, actor=actor, kind="host.revoked", subject_id=host.id
        )
    leased = list(
        db_session.scalars(
            sa.select(Run)
            .where(Run.host_id == host.id, Run.state == RunState.LEASED)
            .with_for_update()
        )
    )
    analyze = []
    for run in leased:
        if lose_attempt(
            db_session=db_session, settings=settings, run=run, why="host revoked by the admin"
        ):
            analyze.append(run.job_id)
    if any(run.state == RunState.QUEUED for run in leased):
        announce_work(db_session)  # waiting hosts may take it at once
    db_session.commit()
    for job_id in analyze:
        dispatch.send_task("analyze_job", job_id)
    log.info("host revoked", extra={"host_id": host.id, "host_name": host.name})
    return host, [run.id for run in leased]


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
