"""GitHub pull requests: webhook deliveries by id, the pull requests answered (their one
comment, last seen head, App installation) and the jobs each asked for.

Revision ID: 2f139c6ef9bd
Revises: b15ec7a1d2f3
Create Date: 2026-12-02 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2f139c6ef9bd"
down_revision: str | Sequence[str] | None = "b15ec7a1d2f3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "github_deliveries",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(40), nullable=False),
        sa.Column("repository", sa.String(140), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("handled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_github_deliveries")),
    )
    with op.batch_alter_table("github_deliveries") as batch_op:
        batch_op.create_index(op.f("ix_github_deliveries_received_at"), ["received_at"])
        batch_op.create_index(op.f("ix_github_deliveries_handled_at"), ["handled_at"])
    op.create_table(
        "github_pull_requests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("repository", sa.String(140), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("comment_id", sa.BigInteger(), nullable=True),
        sa.Column("comment_sha256", sa.String(64), nullable=True),
        sa.Column("head_sha", sa.String(40), nullable=True),
        sa.Column("installation_id", sa.BigInteger(), nullable=True),
        sa.Column("notice", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_github_pull_requests")),
        sa.UniqueConstraint(
            "repository", "number", name=op.f("uq_github_pull_requests_repository_number")
        ),
    )
    op.create_table(
        "github_pull_request_jobs",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("pull_request_id", sa.Integer(), nullable=False),
        sa.Column("base_sha", sa.String(40), nullable=False),
        sa.Column("head_sha", sa.String(40), nullable=False),
        sa.Column("asked_by", sa.String(40), nullable=False),
        sa.Column("command", sa.String(500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reported_state", sa.String(16), nullable=True),
        sa.Column("check_run_id", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_github_pull_request_jobs_job_id_jobs")
        ),
        sa.ForeignKeyConstraint(
            ["pull_request_id"],
            ["github_pull_requests.id"],
            name=op.f("fk_github_pull_request_jobs_pull_request_id_github_pull_requests"),
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_github_pull_request_jobs")),
    )
    with op.batch_alter_table("github_pull_request_jobs") as batch_op:
        batch_op.create_index(
            op.f("ix_github_pull_request_jobs_pull_request_id"), ["pull_request_id"]
        )
        batch_op.create_index(op.f("ix_github_pull_request_jobs_created_at"), ["created_at"])


def downgrade() -> None:
    op.drop_table("github_pull_request_jobs")
    op.drop_table("github_pull_requests")
    op.drop_table("github_deliveries")
