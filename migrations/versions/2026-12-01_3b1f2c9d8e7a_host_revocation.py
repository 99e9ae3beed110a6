"""Hosts can be revoked: revoked_at, and a name is unique among the hosts not revoked.

Revision ID: 3b1f2c9d8e7a
Revises: c4l1b7a7e016
Create Date: 2026-12-01 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3b1f2c9d8e7a"
down_revision: str | Sequence[str] | None = "c4l1b7a7e016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ACTIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_constraint("uq_hosts_name", type_="unique")
    op.create_index(
        "uq_hosts_active_name",
        "hosts",
        ["name"],
        unique=True,
        sqlite_where=_ACTIVE,
        postgresql_where=_ACTIVE,
    )


def downgrade() -> None:
    op.drop_index("uq_hosts_active_name", table_name="hosts")
    # Without the column a revoked host would be live again: its secret digest is blanked
    # (no token hashes to '') and its name made unique again.
    op.execute(
        "UPDATE hosts SET secret_sha256 = '', name = substr(name, 1, 40) || '~' || id "
        "WHERE revoked_at IS NOT NULL"
    )
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_hosts_name", ["name"])
        batch_op.drop_column("revoked_at")
