"""A transaction written once as a program of Core statements, run on either connection type.

The agents' requests (lease, heartbeat, upload, completion) and job submission are short
transactions of a few Core statements. Each is written once, as a generator (a *program*) that
yields `Execute` steps and receives each statement's buffered result, and returns its answer:

    def heartbeat_program(...) -> Program[bool]:
        yield Execute(_HOST_SEEN, {...})
        renewed = (yield Execute(_RENEW, {...})).rowcount
        ...

Two drivers run a program, so no rule exists in a sync and an async copy:

- `run_in_session` on a sync `Session` (the services' sync entry points, Celery, the command
  line and the tests' rolled-back sessions): its connection, then `commit()` or `rollback()`.
- `AsyncDatabase.run` on the request path: a connection of the API process's async engine
  (asyncpg on PostgreSQL, aiosqlite on SQLite), on the event loop, with no thread-pool hand-off
  (each hand-off costs the server CPU per request; calling sync psycopg on the loop instead
  would block it on every round trip).

The pool does not ping each connection it hands out (a round trip per request): a statement
that finds its connection dropped (the server restarted, `pg_terminate_backend`) invalidates
the pool, and the program runs again on a fresh connection, once, provided the failure came
before the commit was sent (nothing was written). A dropped connection during the commit is
not retried: whether it committed is unknown, and the agent's retry of the request is the
idempotent way to find out.

A transaction the database does not serve in time (`Settings.db_request_timeout_s`: a lock, a
statement past its timeout, no connection free or none to be made, a server that stops
answering) raises `DatabaseUnavailable`, answered 503; it is not run again here (that would
double the wait), and one that did not reach its commit wrote nothing.

Requests that arrive together and do the same short transaction (lease claims, job
submissions) can share one: `Database.run_grouped` is a group commit. A request adds its item
to its process's queue for that program and waits; a task takes every waiting item (up to
`GROUP_MAX_ITEMS`), runs `make_program(items)` as one transaction, and hands each request its
own answer, or its own error (an `Exception` in the answer's place fails only that request).
A transaction that fails otherwise wrote nothing: its halves run again alone, down to the one
item that fails (`_Group._answer`), so no request can fail another's; only an unavailable
database fails every item. Up to `GROUP_TRANSACTIONS_MAX` such
transactions run at once; items that arrive while that many run form the next. Why: on this
stack a transaction of one statement costs the API process about 0.4 ms of CPU (the pool,
BEGIN, COMMIT, the async adaptation, in one greenlet: `AsyncDatabase._transaction`) and each
further statement about 0.2 ms (`benchmarks/statement_cost.py`); a claim is five statements
or more, and fifty agents asking for work at once paid that fifty times over, in turn, on one
event loop. A group pays it once, and its statements carry all of its items (`= ANY(:ids)`,
executemany).

`Database` is what an endpoint receives (`api/deps.py: DatabaseDep`); tests replace it with a
`SessionDatabase` on their rolled-back session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

import anyio
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.util import greenlet_spawn
from starlette.concurrency import run_in_threadpool

from coldbench.api.database import (
    SQLITE_BUSY_TIMEOUT_S,
    database_unavailable,
    postgres_timeouts,
    sqlite_pragmas,
)
from coldbench.api.errors import ServiceError
from coldbench.api.runs import wakeup

log = logging.getLogger(__name__)

T = TypeVar("T")
Item = TypeVar("Item")

# Items of one grouped transaction at most: the statements stay small, and a long queue is
# served in transactions of this size one after another.
GROUP_MAX_ITEMS = 64
# Transactions of one program in flight at once. A request that finds fewer running starts one
# at once, so requests that come one by one (agents in their steady state) each have a
# transaction of their own, as without grouping; only those that arrive while this many run
# wait, and share the next. With one at a time, a lone lease would wait for the claim in
# flight.
GROUP_TRANSACTIONS_MAX = 4


@dataclass(frozen=True, slots=True)
class Execute:
    """Run `statement` with `params` (a dict, or a list of dicts for an executemany); the
    program receives its buffered result (`.one_or_none()`, `.scalar()`, `.all()`,
    `.rowcount`)."""

    statement: sa.Executable
    params: Any = None


@dataclass(slots=True)
class _Progress:
    """How far a transaction got: whether its commit was sent (a dropped connection after
    that is not retried) and whether it announced work."""

    sent_commit: bool = False
    announced: bool = False


class _AnnounceWork:
    """Runs became claimable in this transaction: wake the lease waiters once it commits
    (`wakeup.announce_work`'s rule: `pg_notify` in the transaction on PostgreSQL, the process's
    own signals after the commit elsewhere)."""


ANNOUNCE_WORK = _AnnounceWork()

Step = Execute | _AnnounceWork
Program = Generator[Step, Any, T]

_NOTIFY = sa.select(sa.func.pg_notify(wakeup.CHANNEL, ""))


def among_ids(column: sa.ColumnElement[Any], name: str) -> dict[bool, sa.ColumnElement[bool]]:
    """`column` among the list parameter `name`, keyed by whether the dialect is PostgreSQL:
    there `= ANY(:name)`, one array parameter, so the SQL text (and asyncpg's prepared
    statement) is the same for any number of ids; elsewhere an expanding IN."""
    from sqlalchemy.dialects import postgresql

    return {
        True: column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(sa.String))),
        False: column.in_(sa.bindparam(name, expanding=True)),
    }


def run_statements(
    connection: sa.Connection, program: Program[T], announce: Callable[[], None]
) -> T:
    """Drive `program` on a sync connection inside the caller's transaction (no commit);
    `announce` is called where it announces work."""
    try:
        step = next(program)
        while True:
            if isinstance(step, Execute):
                result = connection.execute(step.statement, step.params)
            else:
                announce()
                result = None
            step = program.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_one_in_session(db_session: Session, make_program: GroupProgram[Item, T], item: Item) -> T:
    """A grouped program for one item on a sync session (the command line, Celery, tests)."""
    return _answer(run_in_session(db_session, make_program([item])), 0)


def run_in_session(db_session: Session, program: Program[T]) -> T:
    """Drive `program` on the session's connection, then commit (roll back on any error)."""
    try:
        value = run_statements(
            db_session.connection(), program, lambda: wakeup.announce_work(db_session)
        )
        db_session.commit()
    except BaseException:
        db_session.rollback()
        raise
    return value


class Database(Protocol):
    """What an endpoint runs its transactions on."""

    dialect_name: str

    async def run(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        """One transaction: the program's statements, then commit. `bulk`: a transaction of
        an upload or a completion, which take turns (`AsyncDatabase`)."""
        ...

    async def read(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        """A program that only reads, and needs no snapshot across its statements (one
        query: authentication): without a transaction where the engine allows it."""
        ...

    async def run_alone(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        """A program whose statements each stand alone (a write that checks what it needs
        in its own WHERE, then reads only where it wrote nothing): each statement commits by
        itself where the engine allows it, without BEGIN and COMMIT (two round trips)."""
        ...

    async def run_grouped(self, make_program: GroupProgram[Item, T], item: Item) -> T:
        """Group commit: `item` joins the items of concurrent requests waiting for the same
        `make_program` (a module-level function: the group's key), and one transaction of
        `make_program(items)` answers them all. Raises the item's own error, if it has one."""
        ...

    async def run_with_session(self, work: Callable[[Session], T]) -> T:
        """The rare paths kept on the ORM (a late completion, a bisection's first step): `work`
        on a sync session that commits itself, off the event loop."""
        ...


# `make_program(items)` answers each item in order: its value, or the Exception that request
# raises.
GroupProgram = Callable[[Sequence[Item]], Program[list[T | Exception]]]


def _answer(answers: list[T | Exception], index: int) -> T:
    answer = answers[index]
    if isinstance(answer, Exception):
        raise answer
    return answer


@dataclass
class _Group(Generic[Item, T]):
    """The items waiting for one grouped program, and the tasks serving them."""

    make_program: GroupProgram[Item, T]
    waiting: list[tuple[Item, asyncio.Future[T]]] = field(default_factory=list)
    servers: set[asyncio.Task[None]] = field(default_factory=set)

    async def join(self, database: AsyncDatabase, item: Item) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.waiting.append((item, future))
        if len(self.servers) < GROUP_TRANSACTIONS_MAX:
            # Started, not run here: the requests already on the loop's ready queue join the
            # same transaction.
            self.servers.add(loop.create_task(self._serve(database)))
        # A cancelled request (its client left) cancels only its future: the transaction it
        # may be part of runs to its end for the others.
        return await future

    async def _answer(
        self, database: AsyncDatabase, batch: list[tuple[Item, asyncio.Future[T]]]
    ) -> None:
        """One transaction for `batch`; each future gets its own answer. A transaction that
        fails with anything but a service's own error (a statement the database or its
        driver refuses: a value no check caught) was rolled back, so it wrote nothing: its
        halves run again, each in a transaction of its own, until the member that fails is
        alone. One request can fail only its own answer; the others commit. An unavailable
        database (DatabaseUnavailable, a ServiceError) fails them all at once: whatever ran
        next would wait as long."""
        try:
            answers = await database.run(partial(self.make_program, [item for item, _ in batch]))
        except Exception as error:
            if len(batch) > 1 and not isinstance(error, ServiceError):
                log.warning(
                    "a grouped transaction of %d requests failed (%s); running its halves alone",
                    len(batch),
                    str(error).splitlines()[0][:200] if str(error) else type(error).__name__,
                )
                middle = len(batch) // 2
                await self._answer(database, batch[:middle])
                await self._answer(database, batch[middle:])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for index, (_, future) in enumerate(batch):
            if future.done():
                continue
            answer = answers[index]
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    async def _serve(self, database: AsyncDatabase) -> None:
        try:
            while self.waiting:
                batch = [(item, f) for item, f in self.waiting[:GROUP_MAX_ITEMS] if not f.done()]
                del self.waiting[:GROUP_MAX_ITEMS]
                if not batch:
                    continue
                await self._answer(database, batch)
        finally:
            self.servers.discard(cast("asyncio.Task[None]", asyncio.current_task()))
            if not self.servers:
                # Cancelled (the process is stopping): nobody will serve what still waits.
                for _, future in self.waiting:
                    future.cancel()
                self.waiting.clear()


class AsyncDatabase:
    """The API process's async engine: one connection per transaction, on the event loop."""

    def __init__(
        self, engine: AsyncEngine, sessions: sessionmaker[Session], *, bulk_max: int = 0
    ) -> None:
        self.engine = engine
        # Bulk transactions (uploads', completions') at once; the others wait for a turn
        # (Settings.db_bulk_transactions_max says why). 0: no limit.
        self._bulk_turns = asyncio.Semaphore(bulk_max) if bulk_max else None
        self._groups: dict[Callable[..., Any], _Group[Any, Any]] = {}
        # The same pool without BEGIN and COMMIT: two round trips fewer for a lone read.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.sessions = sessions
        self.dialect_name = engine.dialect.name

    async def run(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        return await self._turn(self.engine, make_program, bulk)

    async def read(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        return await self._turn(self._autocommit, make_program, bulk)

    async def run_alone(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        return await self._turn(self._autocommit, make_program, bulk)

    async def _turn(
        self, engine: AsyncEngine, make_program: Callable[[], Program[T]], bulk: bool
    ) -> T:
        if not bulk or self._bulk_turns is None:
            return await self._run(engine, make_program)
        async with self._bulk_turns:
            return await self._run(engine, make_program)

    async def run_grouped(self, make_program: GroupProgram[Item, T], item: Item) -> T:
        group = self._groups.get(make_program)
        if group is None:
            group = self._groups[make_program] = _Group(make_program)
        return await group.join(self, item)

    async def _run(self, engine: AsyncEngine, make_program: Callable[[], Program[T]]) -> T:
        for tries_left in (1, 0):
            progress = _Progress()
            try:
                # Shielded: a cancelled request (its client left; Starlette cancels the
                # request's cancel scope) finishes its transaction and returns its connection
                # clean, never half-way through a statement. A bare Task.cancel() is not held
                # off by a cancel scope; the server cancels no request that way (uvicorn does
                # only past a graceful-shutdown timeout, and `coldbench server` sets none).
                with anyio.CancelScope(shield=True):
                    value = await greenlet_spawn(
                        self._transaction, engine.sync_engine, make_program, progress
                    )
            except (DBAPIError, sa.exc.TimeoutError, OSError) as error:
                if (
                    isinstance(error, DBAPIError)
                    and error.connection_invalidated
                    and not progress.sent_commit
                    and tries_left
                ):
                    log.warning(
                        "database connection dropped (%s); running the transaction again",
                        error.orig,
                    )
                    continue
                unavailable = database_unavailable(error)
                if unavailable is None:
                    raise
                raise unavailable from error
            if progress.announced and self.dialect_name != "postgresql":
                wakeup.notify_local()
            return value
        raise AssertionError("unreachable")

    def _transaction(
        self, engine: sa.Engine, make_program: Callable[[], Program[T]], progress: _Progress
    ) -> T:
        """The whole transaction (connect, the program, commit, close) on the sync face of
        the async engine, in one greenlet (`greenlet_spawn`): the async API's wrappers pass
        through a greenlet of their own for each call, five to eight per transaction, a
        tenth of a heartbeat's server CPU. Each round trip still waits on the event loop."""
        connection = engine.connect()
        try:
            value = run_statements(
                connection, make_program(), partial(self._announce, connection, progress)
            )
            progress.sent_commit = True
            connection.commit()
        finally:
            connection.close()
        return value

    def _announce(self, connection: sa.Connection, progress: _Progress) -> None:
        progress.announced = True
        if self.dialect_name == "postgresql":
            connection.execute(_NOTIFY)

    async def rehearse(self, make_program: Callable[[], Program[T]], connections: int) -> list[T]:
        """Run a program on `connections` distinct connections of the pool, each in a
        transaction that is rolled back (api/rehearsal.py): the first alone, so that each
        statement is compiled once, then the others at once. Their answers, in order."""
        engine = self.engine.sync_engine
        held: list[sa.Connection] = []

        def drive(connection: sa.Connection) -> T:
            return run_statements(
                connection, make_program(), partial(self._announce, connection, _Progress())
            )

        def release(connection: sa.Connection) -> None:
            connection.rollback()
            connection.close()

        try:
            for _ in range(connections):  # all held at once: distinct connections
                held.append(await greenlet_spawn(engine.connect))
            first = await greenlet_spawn(drive, held[0])
            rest = await asyncio.gather(
                *(greenlet_spawn(drive, connection) for connection in held[1:])
            )
            return [first, *rest]
        finally:
            for connection in held:
                await greenlet_spawn(release, connection)

    async def run_with_session(self, work: Callable[[Session], T]) -> T:
        def in_thread() -> T:
            with self.sessions() as db_session:
                return work(db_session)

        return await run_in_threadpool(in_thread)


class SessionDatabase:
    """A sync session as a `Database` (tests' rolled-back sessions): programs run at once on
    its connection, on the calling thread."""

    def __init__(self, db_session: Session) -> None:
        self.db_session = db_session
        self.dialect_name = db_session.get_bind().dialect.name

    async def run(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        try:
            return run_in_session(self.db_session, make_program())
        finally:
            # Objects the caller holds in this session read what the program wrote.
            self.db_session.expire_all()

    async def read(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        return await self.run(make_program)

    async def run_alone(self, make_program: Callable[[], Program[T]], *, bulk: bool = False) -> T:
        return await self.run(make_program)

    async def run_grouped(self, make_program: GroupProgram[Item, T], item: Item) -> T:
        # One request at a time reaches a test's session: a group of one.
        return _answer(await self.run(lambda: make_program([item])), 0)

    async def run_with_session(self, work: Callable[[Session], T]) -> T:
        return work(self.db_session)


# How much longer than the server's own timeouts asyncpg waits for an answer.
ANSWER_MARGIN_S = 0.25


def make_async_engine(url: str, *, timeout_s: float | None = None, **kwargs: Any) -> AsyncEngine:
    """The async engine for a sync engine URL: asyncpg for PostgreSQL, aiosqlite for SQLite
    (with the same pragmas as the sync engine: WAL, foreign keys, a busy timeout). `timeout_s`:
    the API process's, whose requests wait on the database no longer than that
    (Settings.db_request_timeout_s); None: the drivers' own waits."""
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        busy_timeout_s = SQLITE_BUSY_TIMEOUT_S if timeout_s is None else timeout_s
        engine = create_async_engine(
            parsed.set(drivername="sqlite+aiosqlite"),
            connect_args={"timeout": busy_timeout_s},
            **kwargs,
        )
        sa.event.listen(engine.sync_engine, "connect", sqlite_pragmas(busy_timeout_s))
        return engine
    if timeout_s is not None:
        kwargs["connect_args"] = {
            "timeout": timeout_s,
            # asyncpg's own wait for an answer, for a server that stops answering altogether;
            # a little past the server's timeouts, which end a statement with a clean error
            # and keep the connection.
            "command_timeout": timeout_s + ANSWER_MARGIN_S,
            "server_settings": postgres_timeouts(timeout_s),
            **kwargs.get("connect_args", {}),
        }
        kwargs.setdefault("pool_timeout", timeout_s)
    engine = create_async_engine(parsed.set(drivername="postgresql+asyncpg"), **kwargs)
    sa.event.listen(engine.sync_engine, "invalidate", _abort_connection)
    return engine


def _abort_connection(dbapi_connection: Any, _record: Any, _error: BaseException | None) -> None:
    """A connection being thrown away (dropped, or its server stopped answering) is closed
    at once: SQLAlchemy's polite close waits up to 2 s more for a server that may never
    answer, inside a request's time."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if driver is not None and not driver.is_closed():
        driver.terminate()
