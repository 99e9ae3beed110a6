"""Hosts keep their latest calibration (`coldbench calibrate`,
coldbench.evidence.contract.calibration).

Revision ID: c4l1b7a7e016
Revises: 7693a6ba4526
Create Date: 2026-12-01 04:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4l1b7a7e016"
down_revision: str | Sequence[str] | None = "7693a6ba4526"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("calibration", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("calibration")
