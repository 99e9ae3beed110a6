"""The answer on a pull request: its one comment, edited in place, and each job's commit
status or check run, kept in step with the job (Celery's `github_answer_pull_request`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coldbench.api.artifacts.store import ArtifactStore
from coldbench.api.database import utcnow
from coldbench.api.evidence import service as evidence_service
from coldbench.api.github import client
from coldbench.api.github.comment import (
    MARKER,
    JobView,
    render_comment,
    without_host_paths,
    without_mentions,
)
from coldbench.api.github.config import GitHubConfig, RepositoryConfig, StatusPolicy
from coldbench.api.github.events import check_run_external_id
from coldbench.api.github.models import PullRequest, PullRequestJob
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.reproductions import service as reproduction_service
from coldbench.api.runs.models import Run
from coldbench.evidence.contract.canonical import sha256_hex
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.contract.summary_schema import Summary, Verdict

log = logging.getLogger(__name__)

Conclusion = Literal["success", "neutral", "failure"]


@dataclass(frozen=True)
class Report:
    """The commit status or check run of one job, as it should be now."""

    state: Literal["pending", "success", "neutral", "failure", "cancelled"]
    description: str
    target_url: str
    # The job's state while pending (queued, running, analyzing), else None.
    pending_as: str | None = None

    @property
    def is_final(self) -> bool:
        return self.state != "pending"

    @property
    def key(self) -> str:
        """What `PullRequestJob.reported_state` records once GitHub shows this report: the
        conclusion, or the job's state while it is pending (a move from queued to running is
        reported too)."""
        return self.pending_as or self.state


FINAL_REPORTS = ("success", "neutral", "failure", "cancelled")


def conclusion(policy: StatusPolicy, summary: Summary) -> Conclusion:
    """failure when a comparison is slower by more than the policy allows, success when one is
    faster (and none is a failure), neutral otherwise."""
    limit = 1 - policy.failure_slower_pct / 100
    comparisons = summary.comparisons
    if any(
        c.verdict == Verdict.SLOWER and c.ratio_median is not None and c.ratio_median < limit
        for c in comparisons
    ):
        return "failure"
    if any(c.verdict == Verdict.FASTER for c in comparisons):
        return "success"
    return "neutral"


def _verdict_counts(summary: Summary) -> str:
    counts: dict[str, int] = {}
    for comparison in summary.comparisons:
        counts[comparison.verdict] = counts.get(comparison.verdict, 0) + 1
    return ", ".join(f"{count} {verdict}" for verdict, count in counts.items()) or "no comparison"


def job_report(job: Job, policy: StatusPolicy, config: GitHubConfig) -> Report:
    job_url = config.link(f"/jobs/{job.id}")
    if job.state == JobState.DONE and job.summary is not None and job.evidence_id:
        summary = Summary.model_validate(job.summary)
        return Report(
            conclusion(policy, summary),
            _verdict_counts(summary),
            config.link(f"/e/{job.evidence_id}"),
        )
    if job.state == JobState.CANCELLED:
        return Report("cancelled", "the job was cancelled", job_url)
    if job.state == JobState.FAILED:
        return Report("failure", (job.reason or "the job failed")[:140], job_url)
    return Report("pending", f"{job.state} on coldbench", job_url, pending_as=job.state)


def evidence_markdown(
    db_session: Session, job: Job, store: ArtifactStore, config: GitHubConfig
) -> str | None:
    """The job's PR Markdown, its evidence id linked to its page (the evidence page's), and the
    reproducing hosts' section, with each host path shown by its last name."""
    if job.evidence_id is None:
        return None
    markdown = evidence_service.pr_markdown(
        db_session=db_session, store=store, evidence_id=job.evidence_id, base_url=config.service_url
    )
    # The hosts that reproduced it since (`coldbench reproduce --api`), as `/e/{id}.md` shows.
    markdown = reproduction_service.with_hosts_markdown(
        markdown, db_session=db_session, store=store, evidence_id=job.evidence_id
    )
    # A pull request is public: the hosts' paths stay on the evidence page and in the bundle.
    return without_mentions(without_host_paths(markdown))


@dataclass
class Progress:
    """What GitHub has been told so far in one answer, kept whatever fails next: a check run
    made is never made again, a comment created is edited afterwards."""

    comment_id: int | None
    check_run_ids: dict[str, int | None]
    reported: dict[str, str] = field(default_factory=dict)
    comment_sent: bool = False
    idle_check_sha: str | None = None


def hosts_text(db_session: Session, job_id: str) -> str | None:
    """Where the job ran, for the comment's first line: each host's name, machine, chip, cores
    and memory from the fingerprint it registered with (the evidence has each run's own)."""
    query = (
        sa.select(Host.id, Host.name, Host.fingerprint)
        .join(Run, Run.host_id == Host.id)
        .where(Run.job_id == job_id)
        .order_by(Host.name)
    )
    shown: dict[str, str] = {}
    for host_id, name, fingerprint in db_session.execute(query):
        facts = fingerprint or {}
        memory = facts.get("memory_bytes")
        cores = facts.get("cores")
        parts = [
            facts.get("machine_model"),
            facts.get("chip") or facts.get("cpu"),
            f"{cores} cores" if isinstance(cores, int) and cores else None,
            f"{memory / 2**30:.0f} GiB" if isinstance(memory, int | float) and memory else None,
        ]
        details = ", ".join(str(part) for part in parts if part)
        shown[host_id] = f"{name} ({details})" if details else name
    return "; ".join(shown.values()) or None


def answer_pull_request(
    *, db_session: Session, config: GitHubConfig, store: ArtifactStore, pull_request_id: int
) -> None:
    """Bring the pull request's comment and each of its jobs' status up to date (idempotent:
    what GitHub already shows is not sent again, and what a failed call left done is kept).
    GitHub busy, limiting or refusing: the answer waits for the beat (`retry_at`)."""
    query = sa.select(PullRequest).where(PullRequest.id == pull_request_id).with_for_update()
    pull = db_session.scalars(query).first()
    if pull is None:
        return
    repository = config.repository(pull.repository)
    if repository is None:
        pull.answer_due = False  # no longer configured: nothing to say there
        db_session.commit()
        return
    if pull.retry_at is not None and pull.retry_at > utcnow():
        db_session.rollback()  # GitHub asked to wait: the beat sends it when due
        return
    links = list(
        db_session.scalars(
            sa.select(PullRequestJob)
            .where(PullRequestJob.pull_request_id == pull.id)
            .order_by(PullRequestJob.created_at)
        )
    )
    jobs = {
        job.id: job
        for job in db_session.scalars(
            sa.select(Job).where(Job.id.in_([link.job_id for link in links]))
        )
    }
    reports = {
        link.job_id: job_report(jobs[link.job_id], repository.policy, config)
        for link in links
        if link.reported_state not in FINAL_REPORTS
    }

    def view_of(link: PullRequestJob) -> JobView:
        job = jobs[link.job_id]
        return JobView(
            job_id=job.id,
            state=job.state,
            base_sha=link.base_sha,
            head_sha=link.head_sha,
            asked_by=link.asked_by,
            command=link.command,
            job_url=config.link(f"/jobs/{job.id}"),
            reason=job.reason,
            evidence_markdown=evidence_markdown(db_session, job, store, config),
            hosts=hosts_text(db_session, job.id),
        )

    view = view_of(links[-1]) if links else None
    # The latest evidence stays on the comment whatever a later job does.
    done = [link for link in links if jobs[link.job_id].evidence_id is not None]
    evidence_view = view_of(done[-1]) if done and done[-1] is not links[-1] else None
    if view is None and pull.notice is None and pull.comment_id is None:
        pull.answer_due = False
        db_session.commit()
        return  # nothing asked here yet: no comment
    body = render_comment(
        job=view, head_sha=pull.head_sha, notice=pull.notice, evidence=evidence_view
    )
    body_sha256 = sha256_hex(body.encode())
    to_report = [
        (link, reports[link.job_id])
        for link in links
        if link.job_id in reports and reports[link.job_id].key != link.reported_state
    ]
    # A head nobody measured, pushed after a job was asked for: a neutral check run says how
    # to ask (check runs only: a commit status has no neutral state).
    idle_sha = None
    if (
        repository.report == "check-run"
        and links
        and pull.head_sha
        and pull.head_sha not in {link.head_sha for link in links}
        and pull.idle_check_sha != pull.head_sha
    ):
        idle_sha = pull.head_sha
    progress = Progress(pull.comment_id, {link.job_id: link.check_run_id for link in links})
    failed: BaseException | None = None
    if body_sha256 == pull.comment_sha256 and not to_report and idle_sha is None:
        # GitHub shows all of it already: not even a token is asked for.
        pull.answer_due, pull.attempts, pull.retry_at = False, 0, None
        db_session.commit()
        return
    try:
        asyncio.run(
            _send_answer(
                repository,
                pull,
                body if body_sha256 != pull.comment_sha256 else None,
                to_report,
                idle_sha,
                config,
                progress,
            )
        )
    except client.GITHUB_ERRORS as error:
        failed = error
    pull.comment_id = progress.comment_id
    if progress.comment_sent:
        pull.comment_sha256 = body_sha256
    if progress.idle_check_sha is not None:
        pull.idle_check_sha = progress.idle_check_sha
    for link in links:
        link.check_run_id = progress.check_run_ids.get(link.job_id)
        if link.job_id in progress.reported:
            link.reported_state = progress.reported[link.job_id]
    if failed is None:
        pull.answer_due, pull.attempts, pull.retry_at = False, 0, None
    else:
        pull.answer_due = True
        pull.attempts = (pull.attempts or 0) + 1
        delay = client.retry_delay(failed, pull.attempts)
        pull.retry_at = utcnow() + timedelta(seconds=delay)
        log.warning(
            "pull request %s#%d: answer waits %.0f s: %s",
            pull.repository,
            pull.number,
            delay,
            client.describe(failed),
        )
    db_session.commit()


async def _send_answer(
    repository: RepositoryConfig,
    pull: PullRequest,
    body: str | None,
    to_report: list[tuple[PullRequestJob, Report]],
    idle_sha: str | None,
    config: GitHubConfig,
    progress: Progress,
) -> None:
    full_name = pull.repository
    async with client.github_api(repository, installation_id=pull.installation_id) as gh:
        for link, report in to_report:
            await _report(gh, repository, full_name, pull.number, link, report, progress)
            progress.reported[link.job_id] = report.key
        if idle_sha is not None:
            await _idle_check_run(gh, repository, pull, idle_sha, config)
            progress.idle_check_sha = idle_sha
        if body is not None:
            progress.comment_id = await _put_comment(
                gh, repository, full_name, pull.number, progress.comment_id, body
            )
        progress.comment_sent = True


async def _put_comment(
    gh: Any,
    repository: RepositoryConfig,
    full_name: str,
    number: int,
    comment_id: int | None,
    body: str,
) -> int:
    """Edit the service's comment; never a second one: before creating, look for the one a
    create whose answer was lost (a timeout after GitHub applied it) left there."""
    if comment_id is not None and await client.edit_comment(gh, full_name, comment_id, body):
        return comment_id
    me = await client.identity(gh, repository)
    found = await client.find_comment(gh, full_name, number, marker=MARKER, me=me)
    if found is not None and await client.edit_comment(gh, full_name, found, body):
        return found
    return await client.create_comment(gh, full_name, number, body)


async def _idle_check_run(
    gh: Any, repository: RepositoryConfig, pull: PullRequest, sha: str, config: GitHubConfig
) -> None:
    external_id = check_run_external_id(pull.number, None)
    name = repository.status_context
    if await client.find_check_run(gh, pull.repository, sha, name=name, external_id=external_id):
        return
    await client.create_check_run(
        gh,
        pull.repository,
        sha,
        name=name,
        details_url=config.link("/"),
        title="coldbench: this commit is not measured",
        summary=(
            "Nothing runs on a new head until someone allowed to ask (write permission on the "
            f"repository) comments `/coldbench` (or `/coldbench head={sha[:10]}`) on the pull "
            "request, or clicks Re-run on this check."
        ),
        external_id=external_id,
        conclusion="neutral",
    )


async def _report(
    gh: Any,
    repository: RepositoryConfig,
    full_name: str,
    number: int,
    link: PullRequestJob,
    report: Report,
    progress: Progress,
) -> None:
    title = f"coldbench: {report.description}"
    if repository.report == "status":
        state = {"neutral": repository.policy.neutral_status, "cancelled": "error"}.get(
            report.state, report.state
        )
        await client.set_status(
            gh,
            full_name,
            link.head_sha,
            state=state,
            description=report.description,
            target_url=report.target_url,
            context=repository.status_context,
        )
        return
    check_run_id = progress.check_run_ids.get(link.job_id)
    if check_run_id is None:
        external_id = check_run_external_id(number, link.job_id)
        name = repository.status_context
        check_run_id = await client.find_check_run(
            gh, full_name, link.head_sha, name=name, external_id=external_id
        )
        if check_run_id is None:
            check_run_id = await client.create_check_run(
                gh,
                full_name,
                link.head_sha,
                name=name,
                details_url=report.target_url,
                title=title,
                external_id=external_id,
            )
        # Kept at once: a failure further on never makes this check run again.
        progress.check_run_ids[link.job_id] = check_run_id
    await client.update_check_run(
        gh,
        full_name,
        check_run_id,
        status="completed" if report.is_final else _CHECK_RUN_STATUS[report.key],
        conclusion=report.state if report.is_final else None,
        details_url=report.target_url,
        title=title,
        summary=report.description,
    )


_CHECK_RUN_STATUS = {"queued": "queued", "running": "in_progress", "analyzing": "in_progress"}


def pull_request_of_job(*, db_session: Session, job_id: str) -> int | None:
    """The pull request that asked for `job_id` (None for any other job)."""
    query = sa.select(PullRequestJob.pull_request_id).where(PullRequestJob.job_id == job_id)
    return db_session.scalar(query)


def unanswered_pull_request_ids(*, db_session: Session) -> list[int]:
    """Pull requests whose answer is behind, for the beat task: a job whose state moved on
    since GitHub was last told (or never was), which reports a job's move from queued to
    running (the lease is claimed by the API, which sends no task); and an answer still due
    (a refusal, a moved head, a comment GitHub failed to take). Not before a backoff ends."""
    moved = (
        sa.select(PullRequestJob.pull_request_id)
        .join(Job, Job.id == PullRequestJob.job_id)
        .where(
            sa.or_(
                PullRequestJob.reported_state.is_(None),
                sa.and_(
                    PullRequestJob.reported_state.not_in(FINAL_REPORTS),
                    Job.state != PullRequestJob.reported_state,
                ),
            )
        )
    )
    query = (
        sa.select(PullRequest.id)
        .where(
            sa.or_(PullRequest.answer_due.is_(True), PullRequest.id.in_(moved)),
            sa.or_(PullRequest.retry_at.is_(None), PullRequest.retry_at <= utcnow()),
        )
        .order_by(PullRequest.id)
        .limit(100)
    )
    return list(db_session.scalars(query))
