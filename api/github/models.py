"""What the GitHub integration stores: deliveries seen, pull requests answered, and the jobs
each pull request asked for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class GitHubDelivery(Base):
    """One webhook delivery, by GitHub's id: a redelivery of the same id is not acted on twice.

    The event is kept until a Celery task has handled it (`handled_at`), so a task lost to a
    crash is sent again by the beat task."""

    __tablename__ = "github_deliveries"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    event: Mapped[str] = mapped_column(sa.String(40))
    repository: Mapped[str] = mapped_column(sa.String(140))
    payload: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    handled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    # What handling it did, in one line (a job started, or why not).
    outcome: Mapped[str | None] = mapped_column(sa.Text)
    # What the delivery is about, whatever its delivery id (`comment:<id>`): two hooks on one
    # repository deliver one comment under two ids, and it is acted on once.
    source_key: Mapped[str | None] = mapped_column(sa.String(80), unique=True)
    # GitHub was busy or refused (5xx, a rate limit): the beat does not send it before this.
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")


class PullRequest(Base):
    """A pull request the service answers on: its one comment and the head it last saw."""

    __tablename__ = "github_pull_requests"
    __table_args__ = (sa.UniqueConstraint("repository", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    repository: Mapped[str] = mapped_column(sa.String(140))
    number: Mapped[int] = mapped_column(sa.Integer)
    # The service's comment, created once and edited in place afterwards.
    comment_id: Mapped[int | None] = mapped_column(sa.BigInteger)
    # sha256 of the comment's body as last sent: an unchanged body is not sent again.
    comment_sha256: Mapped[str | None] = mapped_column(sa.String(64))
    head_sha: Mapped[str | None] = mapped_column(sa.String(40))
    # A GitHub App's installation on the repository (from its events): whose token answers.
    installation_id: Mapped[int | None] = mapped_column(sa.BigInteger)
    # The last reply to a request that started nothing (a refusal), shown in the comment.
    notice: Mapped[str | None] = mapped_column(sa.Text)
    # Something to say that GitHub has not been told yet (a refusal, a new job, a moved
    # head); cleared once the comment is sent, so a failed answer is sent again by the beat.
    answer_due: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    # GitHub was busy or refused: the beat does not answer again before this.
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    # The head (not measured) that has its neutral "how to ask" check run already.
    idle_check_sha: Mapped[str | None] = mapped_column(sa.String(40))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PullRequestHead(Base):
    """A pull request's head as the webhook last heard of it (pull_request events, noted at
    receipt) and since when it is the head by GitHub's clock (the event's
    `pull_request.updated_at`): a fork's approval is for the head at the moment of the
    approving comment, never a later push. Its own table: the webhook writes it while an
    answer holds the pull request's row for its GitHub calls, and must not wait for that."""

    __tablename__ = "github_pull_request_heads"

    repository: Mapped[str] = mapped_column(sa.String(140), primary_key=True)
    number: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    sha: Mapped[str] = mapped_column(sa.String(40))
    at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class PullRequestJob(Base):
    """A job asked for on a pull request: the commits pinned when it was asked for, who asked,
    and what was last reported to GitHub for it."""

    __tablename__ = "github_pull_request_jobs"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), primary_key=True)
    pull_request_id: Mapped[int] = mapped_column(
        sa.ForeignKey("github_pull_requests.id"), index=True
    )
    base_sha: Mapped[str] = mapped_column(sa.String(40))
    head_sha: Mapped[str] = mapped_column(sa.String(40))
    asked_by: Mapped[str] = mapped_column(sa.String(40))
    command: Mapped[str] = mapped_column(sa.String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    # The state last posted as the commit status or check run (pending, success, ...).
    reported_state: Mapped[str | None] = mapped_column(sa.String(16))
    check_run_id: Mapped[int | None] = mapped_column(sa.BigInteger)
