"""GitHub: deliveries de-duplicated by what they are about (a comment's id) as well as by
delivery id; the head the webhook last heard of (and when it became the head), so a fork's
approval is pinned to the commit of the approving comment (its own table, which the webhook
writes without waiting for an answer's lock on the pull request); an answer still due and the
backoff of a GitHub that was busy or refused; the head's "how to ask" check run.

Revision ID: 9d4e2b7f1c03
Revises: d46a5e1f0b27
Create Date: 2026-12-06 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9d4e2b7f1c03"
down_revision: str | Sequence[str] | None = "d46a5e1f0b27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("github_deliveries") as batch_op:
        batch_op.add_column(sa.Column("source_key", sa.String(80), nullable=True))
        batch_op.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("attempts", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.create_unique_constraint(
            op.f("uq_github_deliveries_source_key"), ["source_key"]
        )
    with op.batch_alter_table("github_pull_requests") as batch_op:
        batch_op.add_column(
            sa.Column("answer_due", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("attempts", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("idle_check_sha", sa.String(40), nullable=True))
    op.create_table(
        "github_pull_request_heads",
        sa.Column("repository", sa.String(140), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("repository", "number", name=op.f("pk_github_pull_request_heads")),
    )


def downgrade() -> None:
    op.drop_table("github_pull_request_heads")
    with op.batch_alter_table("github_pull_requests") as batch_op:
        for column in ("idle_check_sha", "attempts", "retry_at", "answer_due"):
            batch_op.drop_column(column)
    with op.batch_alter_table("github_deliveries") as batch_op:
        batch_op.drop_constraint(op.f("uq_github_deliveries_source_key"), type_="unique")
        for column in ("attempts", "retry_at", "source_key"):
            batch_op.drop_column(column)
