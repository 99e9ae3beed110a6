"""Hosts' repositories carry what registration now reports: adapter and declared options.

A data migration (the column stays JSON): each repository entry registered before adapters
were reported, `{"recipes": [...]}`, gains the adapter worker.toml defaulted to then (mlx-lm)
and no options. An agent of this version sends its real offer with every lease request, so a
host whose worker.toml said otherwise is corrected at its next lease. Downgrade drops the two
keys again.

Revision ID: 3c1d2e9a7b45
Revises: 3b1f2c9d8e7a
Create Date: 2026-12-01 04:30:00
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "3c1d2e9a7b45"
down_revision: str | Sequence[str] | None = "3b1f2c9d8e7a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_hosts = sa.table("hosts", sa.column("id", sa.String), sa.column("repositories", sa.JSON))


def _rewrite(entry_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    connection = op.get_bind()
    for host_id, repositories in connection.execute(
        sa.select(_hosts.c.id, _hosts.c.repositories)
    ).all():
        rewritten = {name: entry_of(dict(entry)) for name, entry in (repositories or {}).items()}
        if rewritten != repositories:
            connection.execute(
                _hosts.update().where(_hosts.c.id == host_id).values(repositories=rewritten)
            )


def upgrade() -> None:
    _rewrite(lambda entry: {"adapter": "mlx-lm", "options": {}, **entry})


def downgrade() -> None:
    _rewrite(lambda entry: {k: v for k, v in entry.items() if k not in ("adapter", "options")})
