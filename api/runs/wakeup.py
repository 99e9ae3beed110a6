"""Waking long-polling lease requests when runs become claimable.

A lease request that finds nothing waits on its process's `WorkSignal` instead of sleeping in a
thread. Whoever queues a run (a submitted job, a requeued attempt) calls `announce_work` inside
the transaction that queues it:

- on PostgreSQL that is `pg_notify('coldbench_work')`, delivered when (and only if) the
  transaction commits, to every API process listening (`listen_for_work`), on any machine;
- elsewhere (the embedded SQLite default) the signals of this process are woken after the
  commit.

A transaction written as a program of statements (api/transactions.py) announces work with its
`ANNOUNCE_WORK` step, which applies the same rule on either connection type.

A wait is always bounded (`lease_poll_s`), so a lost notification (a listener reconnecting, work
queued by another process on SQLite) costs at most one poll interval, never a stuck agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

CHANNEL = "coldbench_work"
_PENDING = "coldbench_announce_work"
_LISTEN_BACKOFF_MAX_S = 10.0


class WorkSignal:
    """One per process: a generation counter and the futures of the requests waiting on it.

    `wait(since=...)` returns at once when the generation moved after `since`, so a
    notification arriving between a failed claim and the wait is never missed.
    """

    def __init__(self) -> None:
        self.generation = 0
        self._lock = threading.Lock()
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        """Wake every waiter; safe from any thread."""
        with self._lock:
            self.generation += 1
            waiters, self._waiters = self._waiters, set()
        for future in waiters:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                future.get_loop().call_soon_threadsafe(_resolve, future)

    async def wait(self, *, since: int, timeout_s: float) -> bool:
        """Until notified after generation `since`, or timeout_s; True when notified."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self.generation != since:
                return True
            self._waiters.add(future)
        try:
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_local_signals: weakref.WeakSet[WorkSignal] = weakref.WeakSet()


def register_local(signal: WorkSignal) -> None:
    """Wake `signal` after commits of this process that announce work (non-PostgreSQL)."""
    _local_signals.add(signal)


def announce_work(db_session: Session) -> None:
    """Runs became claimable in this transaction: wake lease waiters once it commits."""
    if db_session.get_bind().dialect.name == "postgresql":
        db_session.execute(sa.select(sa.func.pg_notify(CHANNEL, "")))
    else:
        db_session.info[_PENDING] = True


def notify_local() -> None:
    """Wake this process's lease waiters (after a commit that queued runs, non-PostgreSQL)."""
    for signal in list(_local_signals):
        signal.notify()


@event.listens_for(Session, "after_commit")
def _after_commit(db_session: Session) -> None:
    if db_session.info.pop(_PENDING, False):
        notify_local()


@event.listens_for(Session, "after_rollback")
def _after_rollback(db_session: Session) -> None:
    db_session.info.pop(_PENDING, None)


def libpq_url(sqlalchemy_url: str) -> str:
    """`postgresql+psycopg://...` as the plain conninfo URL psycopg connects with."""
    url = sa.engine.make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


async def listen_for_work(database_url: str, signal: WorkSignal) -> None:
    """LISTEN on a dedicated connection for as long as the process runs, reconnecting after a
    dropped connection; every notification (and every reconnect) wakes the signal."""
    import psycopg

    backoff_s = 0.5
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                libpq_url(database_url), autocommit=True
            ) as connection:
                await connection.execute(f"LISTEN {CHANNEL}")
                # Work may have been queued while nobody listened: let waiters look once.
                signal.notify()
                backoff_s = 0.5
                async for _ in connection.notifies():
                    signal.notify()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any loss of the connection: reconnect
            log.warning("work notifications interrupted (%s); reconnecting", error)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, _LISTEN_BACKOFF_MAX_S)
