"""Hosts keep the `backend:` and `os:` labels of the fingerprint they registered with, so a
lease's fingerprint no longer changes them (and no query reads a host's fingerprint).

Revision ID: 5a7c3e91d2b4
Revises: 2f139c6ef9bd
Create Date: 2026-12-02 16:00:00
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "5a7c3e91d2b4"
down_revision: str | Sequence[str] | None = "2f139c6ef9bd"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,63}$")


def _system_labels(fingerprint: dict[str, Any]) -> list[str]:
    """The rule of api/hosts/matching.py: system_labels when this migration was written."""
    labels = []
    backend = fingerprint.get("backend")
    if backend:
        labels.append(f"backend:{backend}")
    os_name = str(fingerprint.get("os") or "").split()
    if os_name:
        labels.append(f"os:{os_name[0].lower()}")
    return [label for label in labels if _LABEL.fullmatch(label)]


def upgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("system_labels", sa.JSON(), nullable=True))
    hosts = sa.table(
        "hosts", sa.column("id", sa.String), sa.column("fingerprint", sa.JSON),
        sa.column("system_labels", sa.JSON),
    )
    connection = op.get_bind()
    # From the fingerprint as last reported: the closest there is to the registered one.
    for host_id, fingerprint in connection.execute(sa.select(hosts.c.id, hosts.c.fingerprint)):
        labels = _system_labels(fingerprint if isinstance(fingerprint, dict) else {})
        connection.execute(
            hosts.update().where(hosts.c.id == host_id).values(system_labels=labels)
        )
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.alter_column("system_labels", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("system_labels")
