"""Labels a host derives itself (`host_labels`: its corpus, chip, memory, ...) are kept apart
from the admin's (`enrolled_labels`), so `coldbench admin labels --set` replaces only the
admin's; browser sessions are rows (`web_sessions`), so logging out ends one on the server.
JSON stored before the door refused it (a fingerprint, a calibration, any JSON column) loses
its NUL and lone surrogates (each becomes U+FFFD), so no stored row can fail a later read.

Revision ID: d46a5e1f0b27
Revises: 5a7c3e91d2b4
Create Date: 2026-12-06 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "d46a5e1f0b27"
down_revision: str | Sequence[str] | None = "5a7c3e91d2b4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _storable(value: Any) -> Any:
    """`value` with NUL and lone surrogates replaced, nested (the door's rule when this
    migration was written: evidence/contract/boundary.py door_text_problem)."""
    if isinstance(value, str):
        return "".join(
            "\ufffd" if char == "\x00" or 0xD800 <= ord(char) <= 0xDFFF else char for char in value
        )
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value


# The escapes a stored JSON text holds NUL or a surrogate by (a valid pair escaped matches too,
# and is left as it is: it parses into one character).
_SUSPECT = ["\\u0000", *(f"\\ud{digit}" for digit in "89abcdef")]


def _clean_json_columns(connection: sa.Connection) -> None:
    """Every row of every JSON column whose text holds one of `_SUSPECT`, read, cleaned
    (`_storable`) and written back where that changed it."""
    inspector = sa.inspect(connection)
    for table_name in inspector.get_table_names():
        columns = [
            column["name"]
            for column in inspector.get_columns(table_name)
            if isinstance(column["type"], sa.JSON)
        ]
        keys = inspector.get_pk_constraint(table_name)["constrained_columns"]
        if not columns or not keys:
            continue
        table = sa.table(
            table_name, *(sa.column(key) for key in keys), *(sa.column(c, sa.JSON) for c in columns)
        )
        for name in columns:
            text = sa.cast(table.c[name], sa.Text)
            suspect = sa.or_(*(text.ilike(f"%{escape}%", escape="#") for escape in _SUSPECT))
            query = sa.select(*(table.c[key] for key in keys), table.c[name]).where(suspect)
            for *key_values, value in connection.execute(query).all():
                cleaned = _storable(value)
                if cleaned != value:
                    match = sa.and_(
                        *(table.c[k] == v for k, v in zip(keys, key_values, strict=True))
                    )
                    connection.execute(table.update().where(match).values({name: cleaned}))


def upgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host_labels", sa.JSON(), nullable=True))
    hosts = sa.table(
        "hosts",
        sa.column("id", sa.String),
        sa.column("labels", sa.JSON),
        sa.column("enrolled_labels", sa.JSON),
        sa.column("host_labels", sa.JSON),
    )
    connection = op.get_bind()
    rows = connection.execute(sa.select(hosts.c.id, hosts.c.labels, hosts.c.enrolled_labels)).all()
    for host_id, labels, enrolled in rows:
        # What the host configured at registration: its labels beyond the admin's.
        own = sorted(set(labels or []) - set(enrolled or []))
        connection.execute(hosts.update().where(hosts.c.id == host_id).values(host_labels=own))
    _clean_json_columns(connection)
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.alter_column("host_labels", existing_type=sa.JSON(), nullable=False)
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("api_key_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name=op.f("fk_web_sessions_api_key_id_api_keys")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_sessions")),
    )


def downgrade() -> None:
    op.drop_table("web_sessions")
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_column("host_labels")
