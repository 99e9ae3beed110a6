"""Jobs, runs and run attempts may only hold the states of their StrEnums (CHECK constraints).

The values are written out here, as they were when this migration was made: a migration must
not change when the enums in evidence/contract/protocol.py later do (a new state needs a new
migration).

Revision ID: 8e4f0b7c2a19
Revises: 3c1d2e9a7b45
Create Date: 2026-12-01 05:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "8e4f0b7c2a19"
down_revision: str | Sequence[str] | None = "3c1d2e9a7b45"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES = {
    "jobs": ("queued", "running", "analyzing", "done", "failed", "cancelled"),
    "runs": ("queued", "leased", "completed", "processed", "failed", "expired", "cancelled"),
    "run_attempts": ("leased", "completed", "failed", "expired", "cancelled"),
}


def upgrade() -> None:
    for table, states in STATES.items():
        allowed = ", ".join(f"'{state}'" for state in states)
        with op.batch_alter_table(table) as batch_op:
            batch_op.create_check_constraint(op.f(f"ck_{table}_state"), f"state IN ({allowed})")


def downgrade() -> None:
    for table in reversed(STATES):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_constraint(op.f(f"ck_{table}_state"), type_="check")
