"""Reproductions of published evidence uploaded by other hosts (`coldbench reproduce --api`):
one row per reproduction bundle, naming the evidence it reproduces and the host that sent it.

Revision ID: e7c2a9d41b58
Revises: 9d4e2b7f1c03
Create Date: 2026-12-06 23:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e7c2a9d41b58"
down_revision: str | Sequence[str] | None = "9d4e2b7f1c03"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evidence_reproductions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("evidence_id", sa.String(length=64), nullable=False),
        sa.Column("host_id", sa.String(length=32), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("bundle_sha256", sa.String(length=64), nullable=False),
        sa.Column("bundle_bytes", sa.BigInteger(), nullable=False),
        sa.Column("identity_sha256", sa.String(length=64), nullable=False),
        sa.Column("hosts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["evidence_id"],
            ["evidence.id"],
            name=op.f("fk_evidence_reproductions_evidence_id_evidence"),
        ),
        sa.ForeignKeyConstraint(
            ["host_id"], ["hosts.id"], name=op.f("fk_evidence_reproductions_host_id_hosts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evidence_reproductions")),
    )
    with op.batch_alter_table("evidence_reproductions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_evidence_reproductions_evidence_id"), ["evidence_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("evidence_reproductions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evidence_reproductions_evidence_id"))
    op.drop_table("evidence_reproductions")
