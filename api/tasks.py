"""Celery tasks. Each is idempotent, acknowledged late, and sends follow-up tasks only after
its own transaction has committed (through `coldbench.api.dispatch`).

A task that fails because the database or the store is briefly unreachable is retried (and
sent again by beat); one that fails on its input (a run's files, a job's cells) fails the same
way every time, so its run or job is marked failed with the reason, once, where the job page
and the API show it, and nothing sends it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

import sqlalchemy as sa
from celery.signals import worker_init
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from coldbench.api import dispatch
from coldbench.api.artifacts.store import ArtifactStore, is_unavailable, open_store
from coldbench.api.celery_app import celery_app
from coldbench.api.database import make_engine, make_sessionmaker
from coldbench.api.evidence import service as evidence_service
from coldbench.api.github import answer as github_answer
from coldbench.api.jobs import bisect
from coldbench.api.jobs.models import Job
from coldbench.api.runs import expiry, ingest
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings, get_settings
from coldbench.evidence.analysis import stats
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.rendering import report

log = logging.getLogger(__name__)

T = TypeVar("T")

TASK_OPTIONS = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    # A database that is briefly unreachable (a restart, a failover) is retried, not lost.
    "autoretry_for": (OperationalError,),
    "retry_backoff": True,
    "max_retries": 5,
}


@lru_cache
def _sessionmaker() -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(get_settings().sqlalchemy_url))


@contextmanager
def _session() -> Iterator[Session]:
    db_session = _sessionmaker()()
    try:
        yield db_session
    finally:
        db_session.close()


def _settings() -> Settings:
    return get_settings()


@lru_cache
def _store() -> ArtifactStore:
    return open_store(get_settings())


@worker_init.connect
def prepare_analysis(**_: object) -> None:
    """A worker builds what every analysis reuses when it starts (before a prefork pool forks
    its children, which inherit it), not in the first job it analyses: scipy.stats (1 to 3 s
    to import on the 2-core machine) and the report's plotly template and page pieces (about
    0.6 s of CPU)."""
    stats.prepare()
    report.prepare()


def _is_transient(error: Exception) -> bool:
    """The database or the store could not be reached: worth another try."""
    return isinstance(error, OperationalError) or is_unavailable(error)


def _failure(stage: str, error: Exception) -> str:
    """`ingest failed: DataError: value out of range ...`, on one line."""
    message = " ".join(str(error).split())[:500]
    return f"{stage} failed: {type(error).__name__}: {message}"


def _step_or_fail(
    step: Callable[[], T], fail: Callable[[str], T], *, stage: str, subject: str
) -> T:
    """What `step()` returns; when it fails on its input, what `fail(reason)` returns (it marks
    the run or job failed with the one-line reason, once). A transient failure is raised, for
    Celery to retry (the module docstring)."""
    try:
        return step()
    except Exception as error:
        if _is_transient(error):
            raise
        log.exception("%s of %s cannot proceed", stage, subject)
        return fail(_failure(stage, error))


@celery_app.task(name="coldbench.ingest_run", **TASK_OPTIONS)
def ingest_run(run_id: str) -> None:
    """Verify, parse, validate and insert a completed run's records; run -> processed (or
    failed with the reason when its files cannot be ingested)."""
    with _session() as db_session:
        job_id = _step_or_fail(
            lambda: ingest.ingest_run(
                db_session=db_session, settings=_settings(), store=_store(), run_id=run_id
            ),
            lambda reason: ingest.fail_ingest(db_session=db_session, run_id=run_id, reason=reason),
            stage="ingest",
            subject=f"run {run_id}",
        )
        run = db_session.get(Run, run_id)
        if run is not None:
            # a bisection's step: running (analysis follows), or failed (the bisection ends)
            _advance_bisection(db_session, run.job_id)
            _answer_pull_request(db_session, run.job_id)
    if job_id is not None:
        dispatch.send_task("analyze_job", job_id)


def _advance_bisection(db_session: Session, job_id: str) -> None:
    """When `job_id` is a bisection's step: its next step, or the bisection's end."""
    moved = bisect.advance(db_session=db_session, job_id=job_id)
    if moved:
        log.info("bisection step job %s: %s", job_id, moved)


def _answer_pull_request(db_session: Session, job_id: str) -> None:
    """When a pull request asked for `job_id`: its answer on GitHub follows the job's state."""
    pull_request_id = github_answer.pull_request_of_job(db_session=db_session, job_id=job_id)
    if pull_request_id is not None:
        dispatch.send_task("github_answer_pull_request", pull_request_id)


@celery_app.task(name="coldbench.analyze_job", **TASK_OPTIONS)
def analyze_job(job_id: str) -> None:
    """Statistics recomputed on the server from the job's raw cells; bundle files rendered."""
    with _session() as db_session:

        def failed(reason: str) -> bool:
            evidence_service.fail_analysis(db_session=db_session, job_id=job_id, reason=reason)
            return False

        ready = _step_or_fail(
            lambda: evidence_service.analyze_job(
                db_session=db_session, store=_store(), job_id=job_id
            ),
            failed,
            stage="analysis",
            subject=f"job {job_id}",
        )
        if not ready:
            _advance_bisection(db_session, job_id)
            _answer_pull_request(db_session, job_id)
    if ready:
        dispatch.send_task("render_evidence", job_id)


@celery_app.task(name="coldbench.render_evidence", **TASK_OPTIONS)
def render_evidence(job_id: str) -> None:
    """Bundle zip into the store; the evidence row with its id; job -> done."""
    with _session() as db_session:
        _step_or_fail(
            lambda: evidence_service.render_evidence(
                db_session=db_session, store=_store(), job_id=job_id
            ),
            lambda reason: evidence_service.fail_analysis(
                db_session=db_session, job_id=job_id, reason=reason
            ),
            stage="publishing",
            subject=f"the evidence of job {job_id}",
        )
        _advance_bisection(db_session, job_id)
        _answer_pull_request(db_session, job_id)


@celery_app.task(name="coldbench.expire_leases", **TASK_OPTIONS)
def expire_leases() -> None:
    """Beat: requeue runs whose lease or hard timeout passed."""
    with _session() as db_session:
        job_ids = expiry.expire_leases(db_session=db_session, settings=_settings())
    for job_id in job_ids:
        dispatch.send_task("analyze_job", job_id)


@celery_app.task(name="coldbench.reprocess_unprocessed", **TASK_OPTIONS)
def reprocess_unprocessed() -> None:
    """Beat: send again what a crash or a lost message left undone (all tasks idempotent), and
    remove upload temporaries a killed server left behind."""
    with _session() as db_session:
        for step_id in bisect.unfinished_step_ids(db_session=db_session):
            _advance_bisection(db_session, step_id)
        run_ids = ingest.unprocessed_run_ids(db_session=db_session)
        stuck = db_session.execute(
            sa.select(Job.id, Job.bundle_files).where(Job.state == JobState.ANALYZING)
        ).all()
    swept = _store().sweep_temporary(older_than_s=_settings().upload_tmp_max_age_s)
    if swept:
        log.info("removed %d abandoned upload temporaries: %s", len(swept), ", ".join(swept))
    for run_id in run_ids:
        dispatch.send_task("ingest_run", run_id)
    for job_id, bundle_files in stuck:
        dispatch.send_task("render_evidence" if bundle_files else "analyze_job", job_id)
