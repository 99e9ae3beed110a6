"""Engine, sessions and the declarative base (one MetaData with a naming convention)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from coldbench.api.errors import DatabaseUnavailable
from coldbench.evidence.contract.schemas import JobSpec

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


# Where no request waits (Celery, the command line): SQLite's wait for another writer.
SQLITE_BUSY_TIMEOUT_S = 30.0
# psycopg (like libpq) takes a connect timeout in whole seconds, and no less than 2.
PSYCOPG_MIN_CONNECT_TIMEOUT_S = 2
# SQLSTATEs of a database that did not serve a statement in time or at all (PostgreSQL's
# statement_timeout and lock_timeout, too many connections, a shutdown or a start): retry later.
UNAVAILABLE_SQLSTATES = {
    "57014": "a statement ran, or waited for a lock, past its timeout",
    "55P03": "lock timeout: a lock held by another transaction",
    "53300": "too many connections",
    "57P01": "the server is shutting down",
    "57P02": "the server is shutting down",
    "57P03": "the server is starting",
}


def sqlite_pragmas(busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> Callable[[Any, Any], None]:
    """A "connect" event listener for every new SQLite connection, sync or aiosqlite."""

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # WAL lets readers (long-polling claimers, pages) run beside one writer.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={round(busy_timeout_s * 1000)}")
        cursor.close()

    return on_connect


def postgres_timeouts(timeout_s: float) -> dict[str, str]:
    """PostgreSQL settings of a request's connection: no statement runs, and no lock is
    waited for, longer than `timeout_s`."""
    milliseconds = str(max(1, round(timeout_s * 1000)))
    return {"statement_timeout": milliseconds, "lock_timeout": milliseconds}


def make_engine(url: str, *, timeout_s: float | None = None, **kwargs: Any) -> sa.Engine:
    """A sync engine. `timeout_s`: the API process's, whose requests wait on the database no
    longer than that (Settings.db_request_timeout_s); None: the drivers' own waits."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        busy_timeout_s = SQLITE_BUSY_TIMEOUT_S if timeout_s is None else timeout_s
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s}, **kwargs
        )
        sa.event.listen(engine, "connect", sqlite_pragmas(busy_timeout_s))
        return engine
    if timeout_s is not None:
        timeouts = postgres_timeouts(timeout_s)
        options = " ".join(f"-c {name}={value}" for name, value in timeouts.items())
        given = sa.engine.make_url(url).query.get("options")
        kwargs["connect_args"] = {
            "connect_timeout": max(PSYCOPG_MIN_CONNECT_TIMEOUT_S, math.ceil(timeout_s)),
            # After the URL's own options, if any: these are the request path's bound.
            "options": f"{given} {options}" if isinstance(given, str) else options,
            **kwargs.get("connect_args", {}),
        }
        kwargs.setdefault("pool_timeout", timeout_s)
    return sa.create_engine(url, pool_pre_ping=True, **kwargs)


def database_unavailable(error: BaseException) -> DatabaseUnavailable | None:
    """A 503 for an error of the database's work: it did not serve a statement in time or at
    all (a lock or statement timeout, no connection free in the pool or none to be made, a
    busy SQLite file). None where `error` says something else (a constraint, a bug).

    Raw `OSError`s count as the database's only where they came from a driver (asyncpg raises
    them from its connect and its own timeouts): callers pass only errors of database work."""
    reason = _unavailable_reason(error)
    if reason is None:
        return None
    return DatabaseUnavailable(f"the database is unavailable ({reason}); retry later")


def _unavailable_reason(error: BaseException) -> str | None:
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, OSError):
        return f"cannot connect: {error.strerror or type(error).__name__}"
    if isinstance(error, sa.exc.TimeoutError):
        return "no database connection became free"
    if isinstance(error, sa.exc.DBAPIError):
        if error.connection_invalidated:
            return "the database connection was lost"
        sqlstate = getattr(error.orig, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate in UNAVAILABLE_SQLSTATES:
            return UNAVAILABLE_SQLSTATES[sqlstate]
        if isinstance(sqlstate, str) and sqlstate.startswith("08"):
            return "the database connection failed"
        message = str(error.orig)
        if isinstance(error, sa.exc.OperationalError):
            if "database is locked" in message or "database table is locked" in message:
                return "the SQLite database is locked by another writer"
            if sqlstate is None and "sqlite" not in type(error.orig).__module__:
                # psycopg's own: a connection refused, timed out or lost.
                return "the database connection failed"
    return None


def make_sessionmaker(engine: sa.Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def upgrade_database(url: str) -> None:
    """`alembic upgrade head` on url (the embedded default runs this at start), leaving the
    process's logging as it is."""
    from alembic import command

    from coldbench.api.migration import alembic_config

    command.upgrade(alembic_config(url, configure_logger=False), "head")
