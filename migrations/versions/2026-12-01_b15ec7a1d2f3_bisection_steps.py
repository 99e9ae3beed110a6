"""Bisection through the service: each step is a job of its own under the bisection's job
(`parent_id`, `step`); a run keeps the spec its host resolved (a history's range, a
bisection's good..bad) as `resolved_spec`.

Revision ID: b15ec7a1d2f3
Revises: 8e4f0b7c2a19
Create Date: 2026-12-01 07:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b15ec7a1d2f3"
down_revision: str | Sequence[str] | None = "8e4f0b7c2a19"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("parent_id", sa.String(32), nullable=True))
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            op.f("fk_jobs_parent_id_jobs"), "jobs", ["parent_id"], ["id"]
        )
        batch_op.create_index(op.f("ix_jobs_parent_id"), ["parent_id"])
        batch_op.create_unique_constraint(op.f("uq_jobs_parent_id_step"), ["parent_id", "step"])
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("resolved_spec", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_column("resolved_spec")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_constraint(op.f("uq_jobs_parent_id_step"), type_="unique")
        batch_op.drop_index(op.f("ix_jobs_parent_id"))
        batch_op.drop_constraint(op.f("fk_jobs_parent_id_jobs"), type_="foreignkey")
        batch_op.drop_column("step")
        batch_op.drop_column("parent_id")
