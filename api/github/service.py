"""Pull requests asking for evidence: deliveries recorded once, and requests (a comment, a
label, a push, `coldbench submit --pr`, the form) turned into jobs on the pull request's pinned
commits. The answer on GitHub is api/github/answer.py's.

Celery runs `handle_delivery` (api/github/tasks.py): GitHub is called there, never while a
webhook request waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from gidgethub import BadRequest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.database import utcnow
from api.errors import Invalid, NotFound, ServiceError, TooManyRequests
from api.github import client
from api.github.commands import Ask, CommandError, ask_of, parse_command
from api.github.config import GitHubConfig, RepositoryConfig
from api.github.events import Delivery, Facts, event_facts
from api.github.models import GitHubDelivery, PullRequest, PullRequestJob
from api.github.schemas import PullRequestAsk
from api.jobs import service as jobs_service
from api.jobs.models import Job
from api.settings import Settings
from api.transactions import Database
from evidence.job_options import JobOptionsError, build_job_spec, service_payload

log = logging.getLogger(__name__)

RATE_WINDOW = timedelta(hours=1)


# --- deliveries ------------------------------------------------------------------------------


def record_delivery(*, db_session: Session, delivery: Delivery) -> tuple[bool, Facts | None]:
    """Store the delivery by its id: (False, None) when that id was seen before. An event the
    service does not act on is stored as handled, without its body."""
    facts = event_facts(delivery)
    row = GitHubDelivery(
        id=delivery.delivery_id,
        event=delivery.event,
        repository=delivery.repository,
        payload=facts.model_dump(mode="json") if facts else None,
        handled_at=None if facts else utcnow(),
        outcome=None if facts else "not an event the service acts on",
    )
    db_session.add(row)
    try:
        db_session.commit()
    except IntegrityError:
        db_session.rollback()
        return False, None
    return True, facts


def unhandled_delivery_ids(*, db_session: Session, older_than_s: float) -> list[str]:
    """Deliveries stored but not handled (their task was lost): for the beat task."""
    before = utcnow() - timedelta(seconds=older_than_s)
    query = sa.select(GitHubDelivery.id).where(
        GitHubDelivery.handled_at.is_(None), GitHubDelivery.received_at < before
    )
    return list(db_session.scalars(query.order_by(GitHubDelivery.received_at).limit(100)))


def _pull_request_row(db_session: Session, repository: str, number: int) -> PullRequest:
    query = sa.select(PullRequest).where(
        PullRequest.repository == repository, PullRequest.number == number
    )
    row = db_session.scalars(query).first()
    if row is None:
        row = PullRequest(repository=repository, number=number)
        db_session.add(row)
        db_session.flush()
    return row


@dataclass(frozen=True)
class Asked:
    """What GitHub said of a request: whether its author may ask, and the pull request now."""

    may_ask: bool
    heads: client.PullRequestHeads | None


async def _ask_github(
    repository: RepositoryConfig,
    full_name: str,
    facts: Facts,
    installation_id: int | None,
    mode: str | None,
) -> Asked:
    async with client.github_api(repository, installation_id=installation_id) as gh:
        if repository.askers == "write":
            may_ask = await client.may_write(gh, full_name, facts.login)
        else:
            may_ask = facts.login.lower() in {login.lower() for login in repository.askers}
        if not may_ask:
            return Asked(False, None)
        return Asked(True, await _heads(gh, repository, full_name, facts.number, mode))


async def _heads(
    gh: Any, repository: RepositoryConfig, full_name: str, number: int, mode: str | None
) -> client.PullRequestHeads:
    """The pull request's commits now; for mode `commits` also where head's line leaves the
    base branch (the merge base), which the commits of base..head follow."""
    heads = await client.pull_request(gh, full_name, number)
    if (mode or repository.defaults.mode) != "commits":
        return heads
    merge_base = await client.merge_base(gh, full_name, heads.base_sha, heads.head_sha)
    return dataclasses.replace(heads, merge_base_sha=merge_base)


def handle_delivery(
    *, db_session: Session, settings: Settings, config: GitHubConfig, delivery_id: str
) -> int | None:
    """Act on a stored delivery once: a job on the pull request's pinned commits, or the reason
    none started. Returns the pull request whose answer must be brought up to date (None:
    nothing to say on GitHub)."""
    row = db_session.get(GitHubDelivery, delivery_id)
    if row is None or row.handled_at is not None or row.payload is None:
        return None
    facts = Facts.model_validate(row.payload)
    repository = config.repository(row.repository)
    if repository is None:
        _handled(db_session, row, "the repository is no longer configured")
        return None
    pull = _pull_request_row(db_session, row.repository, facts.number)
    if facts.installation_id is not None:
        pull.installation_id = facts.installation_id
    ask: Ask | None = None
    refusal: str | None = None
    if facts.kind == "synchronize":
        pull.head_sha = facts.head_sha
        if not repository.auto_run_on_push:
            _handled(db_session, row, "new head recorded")
            # Only a pull request the service has answered on hears of its new head.
            return pull.id if pull.comment_id is not None else None
        ask = Ask()
    elif facts.kind == "labeled":
        if not repository.label or facts.label != repository.label:
            _handled(db_session, row, "not the coldbench label")
            return None
        ask = Ask()
    else:
        try:
            ask = parse_command(facts.command or "")
        except CommandError as error:
            refusal = f"@{facts.login}: not started: {error}"
    mode = ask.mode if ask is not None else None
    asked = asyncio.run(_ask_github(repository, row.repository, facts, pull.installation_id, mode))
    if not asked.may_ask:
        # No event from someone who may not ask starts a job or gets an answer.
        _handled(db_session, row, f"ignored: {facts.login} may not ask")
        return None
    heads = asked.heads
    assert heads is not None
    pull.head_sha = heads.head_sha
    if refusal is not None or ask is None:
        pull.notice = refusal
        _handled(db_session, row, refusal or "nothing asked")
        return pull.id
    try:
        start_pull_request_job(
            db_session=db_session,
            settings=settings,
            repository=repository,
            full_name=row.repository,
            heads=heads,
            ask=ask,
            asked_by=f"@{facts.login}",
            installation_id=facts.installation_id,
            delivery=row,
        )
    except ServiceError as error:
        db_session.rollback()
        pull = _pull_request_row(db_session, row.repository, facts.number)
        pull.head_sha = heads.head_sha
        pull.installation_id = facts.installation_id or pull.installation_id
        pull.notice = f"@{facts.login}: not started: {error.message}"
        _handled(db_session, db_session.get(GitHubDelivery, delivery_id), pull.notice)
    return pull.id


async def ask_for_pull_request(
    *, db: Database, settings: Settings, config: GitHubConfig, asked: PullRequestAsk, asked_by: str
) -> tuple[Job, int]:
    """A submitter's request for a pull request (`coldbench submit --pr`, the form): a job on
    its commits now, answered on the pull request like a comment's. (job, pull request id)."""
    repository = config.repository(asked.full_name)
    if repository is None:
        raise NotFound(f"{asked.full_name} is not a repository this service answers on GitHub")
    try:
        ask = ask_of(asked.options)
    except CommandError as error:
        raise Invalid(str(error)) from None
    async with client.github_api(repository, full_name=asked.full_name) as gh:
        try:
            heads = await _heads(gh, repository, asked.full_name, asked.number, ask.mode)
        except BadRequest as error:
            if error.status_code == 404:
                raise NotFound(f"GitHub has no pull request {asked.pull_request}") from None
            raise
    name = config.repository_name(asked.full_name)

    def start(db_session: Session) -> tuple[Job, int]:
        job = start_pull_request_job(
            db_session=db_session,
            settings=settings,
            repository=repository,
            full_name=name,
            heads=heads,
            ask=ask,
            asked_by=asked_by,
        )
        return job, _pull_request_row(db_session, name, heads.number).id

    return await db.run_with_session(start)


def start_pull_request_job(
    *,
    db_session: Session,
    settings: Settings,
    repository: RepositoryConfig,
    full_name: str,
    heads: client.PullRequestHeads,
    ask: Ask,
    asked_by: str,
    installation_id: int | None = None,
    delivery: GitHubDelivery | None = None,
) -> Job:
    """A job on the pull request's commits as `heads` has them, linked to the pull request,
    within its rate limit; `delivery`, the event that asked, is marked handled in the job's
    own transaction (a redelivery, or its task run again, never starts the job twice).
    ServiceError says why none started."""
    pull = _pull_request_row(db_session, full_name, heads.number)
    pull.installation_id = installation_id or pull.installation_id
    if heads.state != "open":
        raise Invalid(f"the pull request is {heads.state}")
    if _jobs_in_window(db_session, pull) >= repository.max_jobs_per_hour:
        raise TooManyRequests(
            f"this pull request had {repository.max_jobs_per_hour} jobs in the last hour; "
            "ask again later"
        )
    try:
        payload = request_payload(repository, ask, heads)
    except JobOptionsError as error:
        raise Invalid(str(error)) from None
    if delivery is not None:
        delivery.handled_at = utcnow()
        delivery.outcome = "job started"
    job = jobs_service.create_job(
        db_session=db_session, settings=settings, payload=payload, submitted_by=None
    )
    pull = _pull_request_row(db_session, full_name, heads.number)
    db_session.add(
        PullRequestJob(
            job_id=job.id,
            pull_request_id=pull.id,
            base_sha=heads.merge_base_sha or heads.base_sha,
            head_sha=heads.head_sha,
            asked_by=asked_by[:40],
            command=_command_text(ask, repository),
        )
    )
    pull.head_sha = heads.head_sha
    pull.notice = None
    pull.updated_at = utcnow()
    db_session.commit()
    log.info("pull request %s#%d: job %s", pull.repository, pull.number, job.id)
    return job


def _handled(db_session: Session, row: GitHubDelivery | None, outcome: str) -> None:
    if row is not None:
        row.handled_at = utcnow()
        row.outcome = outcome[:500]
    db_session.commit()


def _jobs_in_window(db_session: Session, pull: PullRequest) -> int:
    query = sa.select(sa.func.count()).where(
        PullRequestJob.pull_request_id == pull.id,
        PullRequestJob.created_at > utcnow() - RATE_WINDOW,
    )
    return int(db_session.scalar(query) or 0)


def _command_text(ask: Ask, repository: RepositoryConfig) -> str:
    words = ["/coldbench", ask.mode or repository.defaults.mode]
    words += [f"{key}={value}" for key, value in sorted(ask.options.items())]
    return " ".join(words)


def request_payload(
    repository: RepositoryConfig, ask: Ask, heads: client.PullRequestHeads
) -> dict[str, Any]:
    """The job spec of a request, through the one builder (evidence/job_options.py): the pull
    request's base commit against its head commit, both pinned by sha (an ablation: its
    features on the head commit), with the repository's defaults for every option the request
    does not give. JobOptionsError names each option that is wrong."""
    defaults = repository.defaults
    given: dict[str, Any] = {
        "contexts": defaults.contexts,
        "labels": defaults.labels,
        "features": defaults.features,
        "model": defaults.model,
        "rounds": defaults.rounds,
    }
    mode = ask.mode or defaults.mode
    if mode != "ablation":
        del given["features"]
    given.update(ask.options)
    given.update(mode=mode, repository=repository.coldbench_repository, adapter=repository.adapter)
    if mode == "commits":
        # The host resolves the commits of base..head on head's first-parent line and measures
        # head without each; the variants are the builder's one configuration.
        given.update(base=heads.merge_base_sha or heads.base_sha, head=heads.head_sha)
    else:
        head = f"pr-{heads.number}:ref={heads.head_sha}"
        base = f"base:ref={heads.base_sha}"
        given["variants"] = [head] if mode == "ablation" else [base, head]
    spec = build_job_spec(given)
    return service_payload(spec, rounds=given.get("rounds"), exclude_none=True)
