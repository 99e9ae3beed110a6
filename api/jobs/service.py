"""Jobs: validation against the settings and the registered hosts, creation, state, cancel."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import AuditEvent
from coldbench.api.database import utcnow
from coldbench.api.errors import Forbidden, Invalid, NotAuthenticated, NotFound, ServiceError
from coldbench.api.hosts import service as host_service
from coldbench.api.hosts.matching import (
    HostView,
    Refusal,
    describe_allow_lists,
    offline_notice,
    why_host_cannot_run,
)
from coldbench.api.jobs import bisect
from coldbench.api.jobs.models import Job, spec_as_run
from coldbench.api.jobs.schemas import JobListItem, JobOut, StepOut
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.schemas import AttemptOut, RunOut
from coldbench.api.runs.wakeup import announce_work
from coldbench.api.settings import Settings, get_settings
from coldbench.api.transactions import ANNOUNCE_WORK, Execute, Program, run_one_in_session
from coldbench.evidence.analysis.stats import too_few_rounds
from coldbench.evidence.contract.canonical import sha256_json
from coldbench.evidence.contract.protocol import JobState, RunState
from coldbench.evidence.contract.schemas import (
    MAX_HISTORY_COMMITS,
    MAX_PR_COMMITS,
    JobRequest,
    JobSpec,
)
from coldbench.evidence.contract.summary_schema import Summary
from coldbench.evidence.contract.variant import expand_variants
from coldbench.evidence.spec.engine_flags import flag_problems
from coldbench.evidence.spec.job_options import (
    DefaultRoundsError,
    resolve_job,
    validation_problems,
)

log = logging.getLogger(__name__)


def checked_spec(settings: Settings, payload: dict[str, Any]) -> JobSpec:
    """The request's own checks with this service's limits (JobRequest's validation context),
    the flags its adapter takes (no database), then the one resolution of a service job
    (evidence/spec/job_options.py `resolve_job`: its rounds where left out, the service's
    default time budget where measuring until decided without one): the JobSpec that runs, or
    Invalid carrying every problem found, each at its field and said as a person reads it."""
    check_list_lengths(settings=settings, payload=payload)
    found: list[tuple[str | None, str]] = [(p.field, str(p)) for p in flag_problems(payload)]
    try:
        spec = JobRequest.model_validate(payload, context={"limits": settings.spec_limits})
    except ValidationError as error:
        problems = [(p.field, p.message) for p in validation_problems(error)]
        raise Invalid.of(found + problems, prefix="invalid job spec: ") from None
    if spec.mode == "bisect" and not spec.needs_host_resolution:
        found.append(
            (
                "variants",
                "a bisection through the service names good and bad and one variant without a "
                "ref (the configuration); the service picks each step's commits",
            )
        )
    if spec.bisect is not None and spec.bisect.steps:
        # Each step's decision and evidence are the service's own (api/jobs/bisect.py): a
        # submitter may not hand it earlier steps, or evidence ids it did not make.
        raise Invalid(
            "bisect.steps are recorded by the service as the bisection runs; submit good, bad "
            "and direction only",
            field="bisect.steps",
        )
    if spec.mode == "commits" and not spec.needs_host_resolution:
        found.append(
            (
                "variants",
                "a commits job through the service names base and head and one variant without "
                "a ref (the configuration); its host resolves base..head to commits",
            )
        )
    if spec.needs_host_resolution and spec.hosts != 1:
        what = {"history": "range", "bisect": "bisection", "commits": "base..head"}[spec.mode]
        found.append(
            (
                "hosts",
                f"hosts={spec.hosts}: a {what} is resolved to commits by the one host that runs "
                "it; ask for 1 host, or list the commits as variants",
            )
        )
    if spec.needs_host_resolution and spec.history is not None:
        # The host resolves the range: it may not make more variants than this service takes.
        limit = min(spec.history.max_commits or MAX_HISTORY_COMMITS, settings.max_variants - 1)
        if limit < 1:
            raise Invalid("a history needs at least 2 variants; max_variants is 1")
        history = spec.history.model_copy(update={"max_commits": limit})
        spec = spec.model_copy(update={"history": history})
    if spec.needs_host_resolution and spec.commits is not None:
        # base and head, then one variant per commit (two with `alone`)
        per_commit = 2 if spec.commits.alone else 1
        limit = min(
            spec.commits.max_commits or MAX_PR_COMMITS, (settings.max_variants - 2) // per_commit
        )
        if limit < 1:
            raise Invalid(
                f"a commits job needs at least {2 + per_commit} variants; max_variants is "
                f"{settings.max_variants}"
            )
        commits = spec.commits.model_copy(update={"max_commits": limit})
        spec = spec.model_copy(update={"commits": commits})
    variants = len(expand_variants(spec))
    if variants > settings.max_variants:
        found.append(("variants", f"{variants} variants; at most {settings.max_variants} allowed"))
    try:
        resolved = resolve_job(
            spec,
            limits=settings.spec_limits,
            budget_minutes=settings.default_budget_minutes or None,
        )
    except DefaultRoundsError as error:
        found.append(("rounds", str(error)))
    if found:
        raise Invalid.of(found)
    return resolved


def judge_hosts(spec: JobSpec, hosts: list[HostView]) -> None:
    """Invalid unless enough of the registered hosts (`host_views_program`) can run the job."""
    if not hosts:
        raise Invalid("no host is registered yet; enroll one with `coldbench admin enroll`")
    refusals: dict[str, Refusal | None] = {}
    able: list[str] = []
    for host in hosts:
        refusals[host.name] = why_host_cannot_run(host, spec)
        if refusals[host.name] is None:
            able.append(host.name)
            if len(able) == spec.hosts:
                return  # enough hosts can run it: the others need not be judged
    if not able:
        refused = [(name, r) for name, r in refusals.items() if r is not None]
        detail = "; ".join(f"{name} {refusal.reason}" for name, refusal in refused)
        message = f"no registered host can run this job: {detail}"
        if spec.repository is not None:
            message += f" (allowed repositories: {describe_allow_lists(hosts)})"
        # The field of the host that came closest (the first such host on a tie).
        closest = max((refusal for _, refusal in refused), key=lambda r: r.depth)
        raise Invalid(message, field=closest.field)
    raise Invalid(
        f"hosts={spec.hosts} asks for distinct hosts but only {len(able)} can run it: "
        f"{', '.join(able)}",
        field="hosts",
    )


def check_list_lengths(*, settings: Settings, payload: dict[str, Any]) -> None:
    """Refuse long lists by their length alone, before any per-item validation or expansion
    (20,000 variant names must cost a len(), not a validation of each name)."""

    def length(field: str) -> int:
        value = payload.get(field)
        return len(value) if isinstance(value, list | dict) else 0

    variants, features = length("variants"), length("features")
    if variants > settings.max_variants:
        raise Invalid(f"{variants} variants; at most {settings.max_variants} allowed")
    # An ablation runs `none`, `all` and one variant per feature, plus the other variants.
    if features and features + 1 + variants > settings.max_variants:
        raise Invalid(
            f"{features} ablation features make {features + 1 + variants} variants; "
            f"at most {settings.max_variants} allowed"
        )
    if length("contexts") > settings.max_contexts:
        raise Invalid(f"{length('contexts')} contexts; at most {settings.max_contexts} allowed")
    if length("host_labels") > settings.max_host_labels:
        raise Invalid(
            f"{length('host_labels')} host labels; at most {settings.max_host_labels} allowed"
        )


def create_job(
    *,
    db_session: Session,
    settings: Settings,
    payload: dict[str, Any],
    submitted_by: str | None = None,
) -> Job:
    """Validate, store the job and one queued run per requested host (a bisection: its first
    step, a job of its own with one run; api/jobs/bisect.py)."""
    return _create_job(
        db_session=db_session, settings=settings, payload=payload, submitted_by=submitted_by
    )[0]


def submitted_out(
    job: Job, runs: list[Run], steps: list[Job], *, notice: str | None = None
) -> JobOut:
    """A job just stored as job_detail shows it (`notice`: what its submission judged)."""
    first_steps = [_queued_step(step) for step in steps]
    return _job_out(job, runs, {run.id: [] for run in runs}, {}, steps=first_steps, notice=notice)


class Submitted(NamedTuple):
    """An A/B (or history, ablation) job as stored: its rows, built with every value written,
    and why it will wait where only offline hosts can run it (`offline_notice`)."""

    job: Job
    runs: list[Run]
    notice: str | None = None


@dataclass(frozen=True)
class Bisection:
    """A validated bisection, not yet stored: its first step is a job of its own, stored
    through the ORM (`create_bisection`, api/jobs/bisect.py) on a sync session."""

    spec: JobSpec


@dataclass(frozen=True)
class Submission:
    """One submission request: the payload, who sent it, and the settings it is judged by.

    `token` is the request's API key, checked (constant time) against its stored digest and
    revocation by the group's one read of the keys; None only where the caller knows who
    submits (the command line, tests)."""

    settings: Settings
    payload: dict[str, Any]
    submitted_by: str | None
    dialect: str
    token: str | None = None


def submit_group_program(
    submissions: Sequence[Submission],
) -> Program[list[Submitted | Bisection | Exception]]:
    """Concurrent submissions in one transaction (a group commit, `Database.run_grouped`):
    each spec checked on its own, one query of the hosts they are judged against, then every
    accepted job, its runs and its audit row as three Core inserts (the ORM's unit of work for
    these rows was a third of a submission's CPU) and one announcement. A refused key or spec
    is its own request's error; the others are stored. A bisection is only validated (nothing
    written): `Bisection` carries its spec."""
    # The API keys of the requests that came with one, in one read: a token that is not its
    # key's (unknown, revoked, wrong) refuses its request before its spec is looked at.
    tokens = {i: s.token for i, s in enumerate(submissions) if s.token is not None}
    key_ids: dict[int, str | None] = {}
    if tokens:
        found = yield from auth_service.submitter_ids_program(
            list(tokens.values()), submissions[0].dialect
        )
        key_ids = dict(zip(tokens, found, strict=True))
    checked: list[JobSpec | Exception] = []
    for index, submission in enumerate(submissions):
        if index in tokens and key_ids[index] != submission.submitted_by:
            checked.append(NotAuthenticated("invalid API key"))
            continue
        try:
            checked.append(checked_spec(submission.settings, submission.payload))
        except ServiceError as error:
            checked.append(error)
    specs = [spec for spec in checked if isinstance(spec, JobSpec)]
    hosts: list[HostView] = []
    if specs:
        with_repositories = any(spec.repository is not None for spec in specs)
        hosts = yield from host_service.host_views_program(with_repositories)
    answers: list[Submitted | Bisection | Exception] = []
    for submission, spec in zip(submissions, checked, strict=True):
        if isinstance(spec, Exception):
            answers.append(spec)
            continue
        try:
            judge_hosts(spec, hosts)
        except ServiceError as error:
            answers.append(error)
            continue
        if spec.mode == "bisect":
            answers.append(Bisection(spec))
            continue
        notice = offline_notice(
            spec, hosts, now=utcnow(), lease_ttl_s=submission.settings.lease_ttl_s
        )
        answers.append(_new_rows(spec, submission)._replace(notice=notice))
    stored = [answer for answer in answers if isinstance(answer, Submitted)]
    if not stored:
        return answers
    yield Execute(
        _INSERT_JOB,
        [
            {
                "id": job.id,
                "spec": job.spec,
                "spec_sha256": job.spec_sha256,
                "state": job.state,
                "submitted_by": job.submitted_by,
                "created_at": job.created_at,
                "updated_at": job.updated_at,
            }
            for job, _, _ in stored
        ],
    )
    yield Execute(
        _INSERT_RUN,
        [
            {
                "id": run.id,
                "job_id": run.job_id,
                "slot": run.slot,
                "attempt": 0,
                "state": run.state,
                "created_at": run.created_at,
            }
            for _, runs, _ in stored
            for run in runs
        ],
    )
    yield Execute(
        _INSERT_AUDIT,
        [
            {
                "at": job.created_at,
                "actor": _actor(job.submitted_by),
                "kind": "job.created",
                "subject_id": job.id,
                "detail": {"spec_sha256": job.spec_sha256},
            }
            for job, _, _ in stored
        ],
    )
    yield ANNOUNCE_WORK
    for job, runs, _ in stored:
        for row in (job, *runs):
            # Every column not written is NULL in the row: loaded as such, never read again.
            for column in sa.inspect(type(row)).column_attrs:
                if column.key not in row.__dict__:
                    set_committed_value(row, column.key, None)
    return answers


def _new_rows(spec: JobSpec, submission: Submission) -> Submitted:
    job = _new_job(spec, submission.submitted_by)
    runs = [
        Run(
            id=auth_service.new_id(),
            job_id=job.id,
            slot=slot,
            attempt=0,
            state=RunState.QUEUED,
            created_at=job.created_at,
        )
        for slot in range(spec.hosts)
    ]
    return Submitted(job, runs)


def _actor(submitted_by: str | None) -> str:
    return f"apikey:{submitted_by}" if submitted_by else "local"


def _new_job(spec: JobSpec, submitted_by: str | None) -> Job:
    now = utcnow()
    return Job(
        id=auth_service.new_id(),
        spec=spec,
        spec_sha256=sha256_json(spec.model_dump(mode="json", by_alias=True)),
        state=JobState.QUEUED,
        submitted_by=submitted_by,
        created_at=now,
        updated_at=now,
    )


def _create_job(
    *,
    db_session: Session,
    settings: Settings,
    payload: dict[str, Any],
    submitted_by: str | None,
) -> tuple[Job, list[Run], list[Job]]:
    dialect = db_session.get_bind().dialect.name
    submitted = run_one_in_session(
        db_session, submit_group_program, Submission(settings, payload, submitted_by, dialect)
    )
    if isinstance(submitted, Submitted):
        # Attached to the session as persistent rows (no query).
        for row in (submitted.job, *submitted.runs):
            make_transient_to_detached(row)
            db_session.add(row)
        return submitted.job, submitted.runs, []
    return create_bisection(db_session=db_session, spec=submitted.spec, submitted_by=submitted_by)


def create_bisection(
    *, db_session: Session, spec: JobSpec, submitted_by: str | None
) -> tuple[Job, list[Run], list[Job]]:
    """Store a validated bisection and its first step; commit."""
    job = _new_job(spec, submitted_by)
    db_session.add(job)
    db_session.flush()
    steps = [bisect.add_step(db_session=db_session, bisection=job, spec=spec, step=1)]
    auth_service.record_audit(
        db_session=db_session,
        actor=_actor(submitted_by),
        kind="job.created",
        subject_id=job.id,
        spec_sha256=job.spec_sha256,
    )
    announce_work(db_session)
    db_session.commit()
    return job, [], steps


_jobs = cast(sa.Table, Job.__table__)
_runs = cast(sa.Table, Run.__table__)
_audit = cast(sa.Table, AuditEvent.__table__)
_INSERT_JOB = sa.insert(_jobs)
_INSERT_RUN = sa.insert(_runs)
_INSERT_AUDIT = sa.insert(_audit)


def get_job(*, db_session: Session, job_id: str) -> Job:
    job = db_session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def list_jobs(*, db_session: Session, limit: int = 100) -> list[Job]:
    return list(db_session.scalars(sa.select(Job).order_by(Job.created_at.desc()).limit(limit)))


def list_job_items(
    *, db_session: Session, limit: int = 100, before: str | None = None
) -> list[JobListItem]:
    """Newest first, one page: one query over the columns shown (never the whole spec).

    `before` is the id of the last job of the previous page (keyset pagination).
    """
    query = (
        sa.select(
            Job.id,
            Job.state,
            Job.spec["mode"].as_string().label("mode"),
            Job.created_at,
            Job.evidence_id,
        )
        .order_by(Job.created_at.desc(), Job.id.desc())
        .limit(limit)
    )
    if before is not None:
        anchor = db_session.execute(
            sa.select(Job.created_at, Job.id).where(Job.id == before)
        ).one_or_none()
        if anchor is None:
            raise NotFound(f"no job {before!r} to page from")
        query = query.where(sa.tuple_(Job.created_at, Job.id) < tuple(anchor))
    return [
        JobListItem(
            id=row.id,
            state=row.state,
            mode=row.mode or "ab",
            created_at=row.created_at,
            evidence_id=row.evidence_id,
        )
        for row in db_session.execute(query)
    ]


def job_runs(*, db_session: Session, job_id: str) -> list[Run]:
    return list(db_session.scalars(sa.select(Run).where(Run.job_id == job_id).order_by(Run.slot)))


def cancel_job(*, db_session: Session, job_id: str, submitted_by: str | None) -> Job:
    """Cancel a job: queued and leased runs stop (workers learn it from their heartbeat)."""
    job = get_job(db_session=db_session, job_id=job_id)
    if job.submitted_by is not None and submitted_by != job.submitted_by:
        raise Forbidden("only the submitter of a job may cancel it")
    if JobState(job.state).is_final:
        return job
    now = utcnow()
    # A bisection's steps are jobs of their own: the one still going stops with it.
    steps = db_session.scalars(
        sa.select(Job).where(
            Job.parent_id == job.id, Job.state.not_in([s.value for s in JobState if s.is_final])
        )
    )
    for step in steps:
        _cancel_runs(db_session, step.id, now)
        step.state = JobState.CANCELLED
        step.updated_at = now
    _cancel_runs(db_session, job_id, now)
    job.state = JobState.CANCELLED
    job.updated_at = now
    auth_service.record_audit(
        db_session=db_session,
        actor=f"apikey:{submitted_by}" if submitted_by else "local",
        kind="job.cancelled",
        subject_id=job.id,
    )
    db_session.commit()
    return job


def _cancel_runs(db_session: Session, job_id: str, now: Any) -> None:
    for run in job_runs(db_session=db_session, job_id=job_id):
        if run.state in (RunState.QUEUED, RunState.LEASED):
            if run.state == RunState.LEASED:
                attempt = db_session.scalars(
                    sa.select(RunAttempt).where(
                        RunAttempt.run_id == run.id, RunAttempt.attempt == run.attempt
                    )
                ).one()
                attempt.state = RunState.CANCELLED
                attempt.ended_at = now
            run.state = RunState.CANCELLED
            run.reason = "job cancelled"


def next_job_state(current: str, run_states: list[str]) -> tuple[str, str | None] | None:
    """The job's new state derived from its runs' states, with the reason to store, or None
    when it stays (also for a job cancelled, done or being analysed)."""
    if current in (JobState.CANCELLED, JobState.DONE, JobState.ANALYZING):
        return None
    reason = None
    if all(RunState(state).is_final for state in run_states):
        if RunState.PROCESSED in run_states:
            new_state = JobState.ANALYZING
        else:
            new_state = JobState.FAILED
            reason = "no run produced results"
    elif all(state == RunState.QUEUED for state in run_states):
        new_state = JobState.QUEUED
    else:
        new_state = JobState.RUNNING
    if new_state == current and reason is None:
        return None
    return new_state, reason


def refresh_job_state(*, db_session: Session, job_id: str) -> bool:
    """Derive the job's state from its runs (no commit); True when analysis should start."""
    job = db_session.get(Job, job_id)
    if job is None:
        return False
    states = [run.state for run in job_runs(db_session=db_session, job_id=job_id)]
    change = next_job_state(job.state, states)
    if change is None:
        return False
    new_state, reason = change
    if reason is not None:
        job.reason = reason
    if new_state != job.state:
        job.state = new_state
        job.updated_at = utcnow()
    return new_state == JobState.ANALYZING


def job_summary(*, db_session: Session, job_id: str) -> Summary | None:
    """summary.json of the job's analysis, typed, once it has one (None also for a summary
    stored by an older coldbench that no longer matches the contract: its evidence bundle
    still holds it)."""
    stored = get_job(db_session=db_session, job_id=job_id).summary
    if stored is None:
        return None
    try:
        return Summary.model_validate(stored)
    except ValidationError:
        log.warning("job %s: stored summary does not match the summary contract", job_id)
        return None


def job_detail(*, db_session: Session, job_id: str, settings: Settings | None = None) -> JobOut:
    """The job with its runs, their attempts and progress (JSON API and pages); a queued job
    that only offline hosts can run says so (`settings`: the lease life that decides offline,
    the service's by default)."""
    from coldbench.api.hosts.models import Host

    job = get_job(db_session=db_session, job_id=job_id)
    runs = job_runs(db_session=db_session, job_id=job_id)
    attempts: dict[str, list[AttemptOut]] = {run.id: [] for run in runs}
    for row in db_session.scalars(
        sa.select(RunAttempt)
        .where(RunAttempt.run_id.in_([run.id for run in runs]))
        .order_by(RunAttempt.attempt)
    ):
        attempts[row.run_id].append(AttemptOut.model_validate(row, from_attributes=True))
    host_ids = {run.host_id for run in runs if run.host_id}
    host_names = dict(
        db_session.execute(sa.select(Host.id, Host.name).where(Host.id.in_(host_ids))).all()
    )
    is_bisection = job.spec.mode == "bisect" and job.parent_id is None
    notice = None
    if job.state == JobState.QUEUED and not is_bisection:
        notice = offline_notice(
            job.spec,
            host_service.list_hosts(db_session=db_session),
            now=utcnow(),
            lease_ttl_s=(settings or get_settings()).lease_ttl_s,
        )
    return _job_out(
        job,
        runs,
        attempts,
        host_names,
        steps=_steps(db_session, job.id) if is_bisection else [],
        resolved_spec=next((run.resolved_spec for run in runs if run.resolved_spec), None),
        notice=notice,
    )


def rounds_warning(job: Job, runs: list[Run]) -> str | None:
    """Why the job's rounds cannot reach a verdict, or None (coldbench.evidence.analysis.stats
    `too_few_rounds`: the same whatever the number of commits a host resolves a range to)."""
    return too_few_rounds(spec_as_run(job, runs))


def _job_out(
    job: Job,
    runs: list[Run],
    attempts: dict[str, list[AttemptOut]],
    host_names: dict[str, str],
    *,
    steps: list[StepOut],
    resolved_spec: JobSpec | None = None,
    notice: str | None = None,
) -> JobOut:
    return JobOut(
        parent_id=job.parent_id,
        step=job.step,
        steps=steps,
        resolved_spec=(
            None if resolved_spec is None else resolved_spec.model_dump(mode="json", by_alias=True)
        ),
        id=job.id,
        state=job.state,
        spec=job.spec.model_dump(mode="json", by_alias=True),
        rounds_warning=rounds_warning(job, runs),
        notice=notice,
        spec_sha256=job.spec_sha256,
        created_at=job.created_at,
        updated_at=job.updated_at,
        reason=job.reason,
        evidence_id=job.evidence_id,
        evidence_url=f"/e/{job.evidence_id}" if job.evidence_id else None,
        runs=[
            RunOut(
                id=run.id,
                slot=run.slot,
                attempt=run.attempt,
                state=run.state,
                host_id=run.host_id,
                host_name=host_names.get(run.host_id) if run.host_id else None,
                progress=run.progress,
                lease_expires_at=run.lease_expires_at,
                completed_at=run.completed_at,
                processed_at=run.processed_at,
                reason=run.reason,
                attempts=attempts[run.id],
            )
            for run in runs
        ],
    )


def _queued_step(step: Job) -> StepOut:
    """A step just stored: queued, its commits not resolved yet."""
    return StepOut(
        id=step.id,
        step=step.step or 0,
        state=step.state,
        lo=None,
        mid=None,
        hi=None,
        commits_apart=None,
        decision=None,
        why=None,
        cells_done=None,
        cells_total=None,
        evidence_url=None,
        reason=None,
    )


def _steps(db_session: Session, job_id: str) -> list[StepOut]:
    """A bisection's steps with their commits, decisions and evidence (empty for other jobs)."""
    out = []
    for step in bisect.steps_of(db_session=db_session, job_id=job_id):
        runs = job_runs(db_session=db_session, job_id=step.id)
        ran = spec_as_run(step, runs)
        line = ran.bisect.line if ran.bisect else None
        lo, mid, hi = ran.bisect.step_commits() if ran.bisect and line else (None, None, None)
        section = (step.summary or {}).get("bisect") or {}
        progress = next((run.progress or {} for run in runs), {})
        out.append(
            StepOut(
                id=step.id,
                step=step.step or 0,
                state=step.state,
                lo=lo,
                mid=mid,
                hi=hi,
                commits_apart=len(line) - 1 if line else None,
                decision=section.get("decision"),
                why=section.get("why"),
                cells_done=progress.get("cells_done"),
                cells_total=progress.get("cells_total"),
                evidence_url=f"/e/{step.evidence_id}" if step.evidence_id else None,
                reason=step.reason,
            )
        )
    return out
