"""Engine, sessions and the declarative base (one MetaData with a naming convention)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from evidence.schemas import JobSpec

log = logging.getLogger(__name__)

# Stable constraint names so migrations can drop and alter them by name on PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def one_of(column: str, values: Iterable[str]) -> str:
    """`state IN ('a', 'b')`: the SQL of a CHECK that a column holds one of an enum's values."""
    return f"{column} IN ({', '.join(repr(str(value)) for value in values)})"


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC on the way out, also on SQLite (which stores naive values)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SpecColumn(sa.TypeDecorator[JobSpec]):
    """A job spec: JSON in the database, a `JobSpec` in Python (validated as it is loaded), so
    no service parses a spec's JSON itself. Bound values are JobSpecs (dumped as the API
    stores them: `mode="json"`, field aliases) or that JSON."""

    impl = sa.JSON
    cache_ok = True

    def process_bind_param(
        self, value: JobSpec | dict[str, Any] | None, dialect: Dialect
    ) -> dict[str, Any] | None:
        if isinstance(value, JobSpec):
            return value.model_dump(mode="json", by_alias=True)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> JobSpec | None:
        return None if value is None else JobSpec.model_validate(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Every new SQLite connection, sync or aiosqlite (a "connect" event listener)."""
    cursor = dbapi_connection.cursor()
    # WAL lets readers (long-polling claimers, pages) run beside one writer.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_engine(url: str, **kwargs: Any) -> sa.Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs
        )
        sa.event.listen(engine, "connect", sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: sa.Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def upgrade_database(url: str) -> None:
    """`alembic upgrade head` on url (the embedded default runs this at start), leaving the
    process's logging as it is."""
    from alembic import command

    from api.migration import alembic_config

    command.upgrade(alembic_config(url, configure_logger=False), "head")
