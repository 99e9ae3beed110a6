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

from coldbench.api.database import utcnow
from coldbench.api.errors import Conflict, Invalid, NotFound, ServiceError, TooManyRequests
from coldbench.api.github import client
from coldbench.api.github.commands import PREFIX, Ask, CommandError, ask_of, parse_command
from coldbench.api.github.config import GitHubConfig, RepositoryConfig
from coldbench.api.github.events import Delivery, Facts, event_facts
from coldbench.api.github.models import GitHubDelivery, PullRequest, PullRequestHead, PullRequestJob
from coldbench.api.github.schemas import PullRequestAsk
from coldbench.api.jobs import service as jobs_service
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.api.transactions import Database
from coldbench.evidence.spec.job_options import JobOptionsError, build_job_spec, service_payload

log = logging.getLogger(__name__)

RATE_WINDOW = timedelta(hours=1)


# --- deliveries ------------------------------------------------------------------------------


def record_delivery(*, db_session: Session, delivery: Delivery) -> tuple[bool, Facts | None]:
    """Store the delivery by its id: (False, None) when that id, or the comment it is about,
    was seen before. An event the service does not act on is stored as handled, without its
    body. A pull request's head is noted as it arrives (what a fork's approval is pinned to)."""
    assert delivery.repository is not None
    facts = event_facts(delivery)
    acted_on = facts is not None and facts.kind != "opened"
    row = GitHubDelivery(
        id=delivery.delivery_id,
        event=delivery.event,
        repository=delivery.repository,
        payload=facts.model_dump(mode="json") if facts else None,
        handled_at=None if acted_on else utcnow(),
        outcome=None if acted_on else "not an event the service acts on",
        source_key=facts.source_key if facts else None,
    )
    if facts is not None and facts.kind == "opened":
        row.outcome = "head recorded"
    db_session.add(row)
    try:
        db_session.flush()
    except IntegrityError:
        db_session.rollback()
        return False, None
    if facts is not None and facts.head_sha is not None and facts.kind != "rerequested":
        _see_head(db_session, delivery.repository, facts)
    db_session.commit()
    return True, (facts if acted_on else None)


def _see_head(db_session: Session, repository: str, facts: Facts) -> None:
    """Note the head a pull_request event carries, and since when (GitHub's clock) it is the
    head. Deliveries may arrive out of order: an older event does not undo a newer one."""
    assert facts.head_sha is not None
    seen = db_session.get(PullRequestHead, (repository, facts.number), with_for_update=True)
    at = facts.at
    if seen is None:
        # Two deliveries about a new pull request may both note it: the loser updates it.
        try:
            with db_session.begin_nested():
                db_session.add(
                    PullRequestHead(
                        repository=repository, number=facts.number, sha=facts.head_sha, at=at
                    )
                )
            return
        except IntegrityError:
            seen = db_session.get(PullRequestHead, (repository, facts.number), with_for_update=True)
            assert seen is not None
    if seen.sha == facts.head_sha:
        if at is not None and (seen.at is None or at < seen.at):
            seen.at = at
        return
    if seen.at is None or at is None or at >= seen.at:
        seen.sha, seen.at = facts.head_sha, at


def unhandled_delivery_ids(*, db_session: Session, older_than_s: float) -> list[str]:
    """Deliveries stored but not handled (their task was lost): for the beat task."""
    before = utcnow() - timedelta(seconds=older_than_s)
    query = sa.select(GitHubDelivery.id).where(
        GitHubDelivery.handled_at.is_(None),
        GitHubDelivery.received_at < before,
        sa.or_(GitHubDelivery.retry_at.is_(None), GitHubDelivery.retry_at <= utcnow()),
    )
    return list(db_session.scalars(query.order_by(GitHubDelivery.received_at).limit(100)))


def _pull_request_row(db_session: Session, repository: str, number: int) -> PullRequest:
    query = sa.select(PullRequest).where(
        PullRequest.repository == repository, PullRequest.number == number
    )
    row = db_session.scalars(query).first()
    if row is None:
        # Two deliveries about a new pull request may both create it: the loser reads it.
        try:
            with db_session.begin_nested():
                row = PullRequest(repository=repository, number=number)
                db_session.add(row)
        except IntegrityError:
            row = db_session.scalars(query).one()
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
    nothing to say on GitHub). GitHub busy or refusing: the delivery waits for the beat
    (`retry_at`), nothing lost."""
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
        # Only a pull request the service has answered on hears of its new head.
        answered = pull.comment_id is not None or _has_jobs(db_session, pull)
        pull.answer_due = pull.answer_due or answered
        if not repository.auto_run_on_push:
            _handled(db_session, row, "new head recorded")
            return pull.id if answered else None
        ask = Ask()
    elif facts.kind == "labeled":
        if not repository.label or facts.label != repository.label:
            _handled(db_session, row, "not the coldbench label")
            return None
        ask = Ask()
    elif facts.kind == "rerequested":
        ask = _ask_again(db_session, pull, facts.job_id)
    else:
        try:
            ask = parse_command(facts.command or "")
        except CommandError as error:
            refusal = f"@{facts.login}: not started: {error}"
    mode = ask.mode if ask is not None else None
    installation_id = pull.installation_id
    # What the webhook heard of the head is read after GitHub answers, in a new transaction:
    # a push it heard of meanwhile counts.
    db_session.commit()
    try:
        asked = asyncio.run(_ask_github(repository, row.repository, facts, installation_id, mode))
    except client.GITHUB_ERRORS as error:
        _wait_for_github(db_session, row, error)
        return None
    if not asked.may_ask:
        # No event from someone who may not ask starts a job or gets an answer (a push to a
        # pull request answered before still moves its head there).
        _handled(db_session, row, f"ignored: {facts.login} may not ask")
        return pull.id if facts.kind == "synchronize" and pull.answer_due else None
    heads = asked.heads
    assert heads is not None
    pull.head_sha = heads.head_sha
    if refusal is None and ask is not None:
        seen = db_session.get(PullRequestHead, (row.repository, facts.number))
        refusal = pinned_refusal(facts=facts, ask=ask, heads=heads, seen=seen)
    if refusal is not None or ask is None:
        pull.notice = refusal
        pull.answer_due = True
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
        pull.answer_due = True
        _handled(db_session, db_session.get(GitHubDelivery, delivery_id), pull.notice)
    return pull.id


def pinned_refusal(
    *, facts: Facts, ask: Ask, heads: client.PullRequestHeads, seen: PullRequestHead | None
) -> str | None:
    """Why the pull request's head now (`heads`) is not the commit its asker approved, or
    None when it is. The approved commit is the one the command names (`head=SHA`); else the
    head the label was added to, pushed, or re-run on; else, for a comment, the head at the
    moment of the comment: the head the webhook had heard of, if it became the head before
    the comment by GitHub's clock. A pull request from the repository itself runs its head
    as GitHub has it (whoever can push to it may ask), except a named or re-run commit."""
    now = heads.head_sha
    who = f"@{facts.login}"
    ask_again = f"review `{short(now)}`, then comment `/coldbench head={short(now)}`"
    if ask.head_sha is not None:
        if now.startswith(ask.head_sha):
            return None
        return (
            f"{who}: not started: the head is now `{short(now)}`, not `{ask.head_sha}`; {ask_again}"
        )
    if facts.kind != "comment":
        pinned = facts.head_sha
        if pinned == now or (not heads.from_fork and facts.kind != "rerequested"):
            return None
        moment = {"labeled": "the label", "synchronize": "the push", "rerequested": "the re-run"}
        return (
            f"{who}: not started: the head moved from `{short(pinned or '')}` to "
            f"`{short(now)}` after {moment[facts.kind]}; {ask_again}"
        )
    if not heads.from_fork:
        return None
    if seen is None:
        return (
            f"{who}: not started: this pull request is from a fork and its head at the moment "
            f"of the comment is not known here; {ask_again}"
        )
    # Moved: not the head the webhook heard of, or it became the head at the comment or after
    # (GitHub's clock has seconds; a moment not known counts as after).
    moved = seen.sha != now or seen.at is None or facts.at is None or seen.at >= facts.at
    if moved:
        return (
            f"{who}: not started: the head moved to `{short(now)}` after the comment "
            f"(nothing pushed after an approval runs); {ask_again}"
        )
    return None


def short(sha: str) -> str:
    return sha[:10]


def _ask_again(db_session: Session, pull: PullRequest, job_id: str | None) -> Ask:
    """What a check run's Re-run asks for: its job's command again (the default request for
    the "how to ask" check run of a head nobody measured)."""
    if job_id is None:
        return Ask()
    link = db_session.get(PullRequestJob, job_id)
    if link is None or link.pull_request_id != pull.id:
        return Ask()
    try:
        return parse_command(link.command.removeprefix(PREFIX).strip())
    except CommandError:
        return Ask()


def _has_jobs(db_session: Session, pull: PullRequest) -> bool:
    query = sa.select(PullRequestJob.job_id).where(PullRequestJob.pull_request_id == pull.id)
    return db_session.scalars(query.limit(1)).first() is not None


def _wait_for_github(db_session: Session, row: GitHubDelivery, error: BaseException) -> None:
    """GitHub busy, limiting or refusing: the delivery stays unhandled until `retry_at`."""
    db_session.rollback()
    row.attempts = (row.attempts or 0) + 1
    delay = client.retry_delay(error, row.attempts)
    row.retry_at = utcnow() + timedelta(seconds=delay)
    row.outcome = f"waiting {delay:.0f} s: {client.describe(error)}"[:500]
    log.warning("delivery %s: %s", row.id, row.outcome)
    db_session.commit()


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
    if asked.head_sha is not None:
        if ask.head_sha not in (None, asked.head_sha):
            raise Invalid(f"two heads named: {asked.head_sha} and {ask.head_sha}")
        ask = dataclasses.replace(ask, head_sha=asked.head_sha)
    async with client.github_api(repository, full_name=asked.full_name) as gh:
        try:
            heads = await _heads(gh, repository, asked.full_name, asked.number, ask.mode)
        except BadRequest as error:
            if error.status_code == 404:
                raise NotFound(f"GitHub has no pull request {asked.name}") from None
            raise
    # The same rule as a comment's: a fork's commits run only as the head its asker names.
    if ask.head_sha is not None and not heads.head_sha.startswith(ask.head_sha):
        raise Conflict(
            f"{asked.name}'s head is now {short(heads.head_sha)}, not {ask.head_sha}: "
            "review it and name it with --head (the form: OWNER/REPO#N@SHA)"
        )
    if ask.head_sha is None and heads.from_fork and not repository.api_runs_fork_heads:
        raise Invalid(
            f"{asked.name} is from a fork: name the head commit you reviewed, --head SHA "
            "(the form: OWNER/REPO#N@SHA); it runs only while it is the pull request's head"
        )
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
    pull.answer_due = True
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
    """The job spec of a request, through the one builder (evidence/spec/job_options.py): the pull
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
    return service_payload(build_job_spec(given), exclude_none=True)
