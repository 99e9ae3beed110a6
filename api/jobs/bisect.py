"""A bisection through the service: the job a maintainer submits (mode `bisect`, good, bad,
one variant without a ref) holds no runs itself; each step is a job of its own under it
(`parent_id`, `step`), with its one run and its own evidence, so every step's comparison stays
a complete, verifiable bundle. The host of step 1 resolves good..bad in its mirror (the run's
`resolved_spec`); each later step is built by the server from the previous one.

When a step ends, `advance` follows evidence/analysis/bisect.py's rule, the same the local runner
follows: the step's decision (from the server's own analysis of its cells) halves its line
into the next step's (`next_line`, `step_spec`), or ends the bisection; the bisection's job then
takes the last step's summary and evidence, which names the commit, its parent, the ratio and
links to every step's evidence. A step that fails or is cancelled fails the bisection.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.jobs.models import Job, spec_as_run
from coldbench.api.runs.models import Run
from coldbench.api.runs.wakeup import announce_work
from coldbench.evidence.analysis.bisect import next_line, step_spec
from coldbench.evidence.contract.canonical import sha256_json
from coldbench.evidence.contract.protocol import JobState, RunState
from coldbench.evidence.contract.schemas import BisectStep, JobSpec

log = logging.getLogger(__name__)


def add_step(*, db_session: Session, bisection: Job, spec: JobSpec, step: int) -> Job:
    """Store step `step` of `bisection` as a queued job with one queued run (no commit)."""
    job = Job(
        id=auth_service.new_id(),
        spec=spec,
        spec_sha256=sha256_json(spec.model_dump(mode="json", by_alias=True)),
        state=JobState.QUEUED,
        submitted_by=bisection.submitted_by,
        parent_id=bisection.id,
        step=step,
    )
    db_session.add(job)
    db_session.flush()
    db_session.add(Run(id=auth_service.new_id(), job_id=job.id, slot=0, state=RunState.QUEUED))
    announce_work(db_session)
    return job


def steps_of(*, db_session: Session, job_id: str) -> list[Job]:
    """The steps of a bisection's job, in order (empty for any other job)."""
    query = sa.select(Job).where(Job.parent_id == job_id).order_by(Job.step)
    return list(db_session.scalars(query))


def advance(*, db_session: Session, job_id: str) -> str | None:
    """After step `job_id` changed state: start the next step or end the bisection. Idempotent
    (an older step, a bisection already ended, or a next step already stored: nothing to do).
    Returns what it did, for the log: `step N`, `done`, `failed`, or None."""
    step_job = db_session.get(Job, job_id)
    if step_job is None or step_job.parent_id is None:
        return None
    bisection = db_session.get(Job, step_job.parent_id, with_for_update=True)
    if bisection is None or JobState(bisection.state).is_final:
        return None
    latest = steps_of(db_session=db_session, job_id=bisection.id)[-1]
    if latest.id != step_job.id:
        return None
    state = JobState(latest.state)
    now = utcnow()
    if state in (JobState.FAILED, JobState.CANCELLED):
        bisection.state = JobState.FAILED
        bisection.reason = f"step {latest.step} {state}: {latest.reason or 'no reason given'}"
        bisection.updated_at = now
        db_session.commit()
        return "failed"
    if state != JobState.DONE:
        if bisection.state != JobState.RUNNING and state != JobState.QUEUED:
            bisection.state = JobState.RUNNING
            bisection.updated_at = now
            db_session.commit()
        return None
    section: dict[str, Any] = (latest.summary or {}).get("bisect") or {}
    ran = spec_as_run(latest, db_session.scalars(sa.select(Run).where(Run.job_id == latest.id)))
    if not section or ran.bisect is None or ran.bisect.line is None or not latest.evidence_id:
        bisection.state = JobState.FAILED
        bisection.reason = f"step {latest.step} has no bisection result in its evidence"
        bisection.updated_at = now
        db_session.commit()
        return "failed"
    lo, mid, hi = ran.bisect.step_commits()
    steps = [
        *ran.bisect.steps,
        BisectStep(
            lo=lo,
            mid=mid,
            hi=hi,
            decision=section["decision"],
            evidence_id=latest.evidence_id,
            location=f"/e/{latest.evidence_id}",
        ),
    ]
    line = next_line(ran.bisect.line, section["decision"])
    if line is None:
        # The last step's evidence is the bisection's: it names the result and every step.
        bisection.state = JobState.DONE
        bisection.summary = latest.summary
        bisection.evidence_id = latest.evidence_id
        bisection.updated_at = now
        auth_service.record_audit(
            db_session=db_session,
            actor="server",
            kind="bisection.done",
            subject_id=bisection.id,
            evidence_id=latest.evidence_id,
            first_bad_commit=section.get("first_bad_commit"),
        )
        db_session.commit()
        log.info("bisection %s ended after %d steps", bisection.id, len(steps))
        return "done"
    try:
        add_step(
            db_session=db_session,
            bisection=bisection,
            spec=step_spec(ran, line, steps),
            step=(latest.step or 0) + 1,
        )
        bisection.state = JobState.RUNNING
        bisection.updated_at = now
        db_session.commit()
    except IntegrityError:  # another delivery stored this step first
        db_session.rollback()
        return None
    return f"step {(latest.step or 0) + 1}"


def unfinished_step_ids(*, db_session: Session) -> list[str]:
    """The latest step of every bisection still going (the beat advances them again, in case
    a task was lost between a step's end and its bisection's next move)."""
    parent = sa.orm.aliased(Job)
    latest = (
        sa.select(Job.parent_id, sa.func.max(Job.step).label("step"))
        .join(parent, parent.id == Job.parent_id)
        .where(parent.state.in_([JobState.QUEUED, JobState.RUNNING]))
        .group_by(Job.parent_id)
        .subquery()
    )
    return list(
        db_session.scalars(
            sa.select(Job.id).join(
                latest, sa.and_(Job.parent_id == latest.c.parent_id, Job.step == latest.c.step)
            )
        )
    )
