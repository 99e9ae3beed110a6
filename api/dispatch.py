"""Sending Celery tasks by name, always after the database transaction has committed.

Services commit first and then call `send_task`; a failed send is logged, not raised, because
the beat task `reprocess_unprocessed` finds committed work whose task never arrived.
Tests replace the sender with `use_sender` to observe what would be sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

Sender = Callable[[str, tuple[object, ...]], None]

TASK_PREFIX = "coldbench."


def _celery_sender(name: str, args: tuple[object, ...]) -> None:
    from coldbench.api.celery_app import celery_app

    # No result is ever read: without ignore_result, sending also subscribes to the result
    # backend, which retries for 20 s when Redis is down.
    celery_app.send_task(TASK_PREFIX + name, args=args, ignore_result=True)


_sender: Sender = _celery_sender


def prepare() -> None:
    """Build what sending needs (the Celery app, its producer pool, the broker's transport)
    now, without connecting: an API process calls this at start. Done lazily instead, the
    first completion's send would import Celery, kombu's Redis transport and redis-py in a
    thread-pool thread, holding the interpreter's lock while the event loop serves everyone
    else's requests."""
    if _sender is _celery_sender:
        from coldbench.api.celery_app import celery_app

        celery_app.producer_pool  # noqa: B018 (built on first access)


def send_task(name: str, *args: object) -> None:
    try:
        _sender(name, args)
    except Exception:
        log.exception("could not send task %s%s; the beat task will retry it", name, args)


@contextmanager
def use_sender(sender: Sender) -> Iterator[None]:
    global _sender
    previous, _sender = _sender, sender
    try:
        yield
    finally:
        _sender = previous
