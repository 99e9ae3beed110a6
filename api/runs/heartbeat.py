"""Heartbeats: a host says it is alive, renews its lease and reports its run's progress.

Heartbeats are most of an agent's requests: a program of Core statements
(`api/transactions.py`), no ORM objects. On PostgreSQL two statements that each stand alone
(`Database.run_alone`: no BEGIN, no COMMIT): the token checked against the host's secret,
then the host's time and the lease renewed in one statement; elsewhere two or three
statements in a transaction.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import sqlalchemy as sa

from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.errors import Invalid, NotAuthenticated
from coldbench.api.hosts.models import Host
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.service import RUN_AND_ATTEMPT, held_by, require_holder
from coldbench.api.settings import Settings
from coldbench.api.transactions import Execute, Program

_runs = cast(sa.Table, Run.__table__)
_hosts = cast(sa.Table, Host.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)
_WHEN = _runs.c.lease_expires_at.type
_HOST_SEEN = (
    sa.update(_hosts)
    .where(_hosts.c.id == sa.bindparam("w_host", type_=_hosts.c.id.type))
    .values(last_heartbeat_at=sa.bindparam("w_now", type_=_WHEN))
)
# The heartbeat's authentication and its first write in one statement: the secret's digest
# comes back only where the host exists and is not revoked, and a mismatch rolls it back.
_HOST_SEEN_RETURNING_SECRET = _HOST_SEEN.where(_hosts.c.revoked_at.is_(None)).returning(
    _hosts.c.secret_sha256
)
_RENEW = held_by(sa.update(_runs)).values(lease_expires_at=sa.bindparam("w_expires", type_=_WHEN))
_RENEW_WITH_PROGRESS = held_by(sa.update(_runs)).values(
    lease_expires_at=sa.bindparam("w_expires", type_=_WHEN),
    progress=sa.bindparam("w_progress", type_=_runs.c.progress.type),
)
# PostgreSQL: the secret read first (nothing written unless the token matches), then one
# statement writes the host's time and renews the lease where the host is still not revoked
# (data-modifying CTEs): two round trips where BEGIN, two updates and COMMIT were four.
_SECRET = sa.select(_hosts.c.secret_sha256).where(
    _hosts.c.id == sa.bindparam("w_host", type_=_hosts.c.id.type), _hosts.c.revoked_at.is_(None)
)


def _seen_and_renewed(renew: Any) -> sa.Select[Any]:
    """The host's time written (unless revoked) and, with `renew`, the lease renewed, in one
    statement. With a run, the host's time only where the attempt named was this host's: a
    heartbeat refused as another's (NotFound, Forbidden) writes nothing, as in a transaction
    that is rolled back."""
    seen_host = _HOST_SEEN.where(_hosts.c.revoked_at.is_(None))
    count = sa.func.count()
    if renew is None:
        seen = seen_host.returning(_hosts.c.id).cte("seen")
        return sa.select(sa.select(count).select_from(seen).scalar_subquery().label("seen"))
    held = sa.exists(
        sa.select(_attempts.c.run_id).where(
            _attempts.c.run_id == sa.bindparam("w_run", type_=_runs.c.id.type),
            _attempts.c.attempt == sa.bindparam("w_attempt", type_=sa.Integer),
            _attempts.c.host_id == sa.bindparam("w_host", type_=_hosts.c.id.type),
        )
    )
    seen = seen_host.where(held).returning(_hosts.c.id).cte("seen")
    renewed = renew.where(sa.exists(sa.select(seen.c.id))).returning(_runs.c.id).cte("renewed")
    return sa.select(
        sa.select(count).select_from(seen).scalar_subquery().label("seen"),
        sa.select(count).select_from(renewed).scalar_subquery().label("renewed"),
    )


# by what is renewed: nothing (no run), the lease, the lease and the progress
_BEAT = {
    "host": _seen_and_renewed(None),
    "lease": _seen_and_renewed(_RENEW),
    "progress": _seen_and_renewed(_RENEW_WITH_PROGRESS),
}


def heartbeat_program(
    *,
    settings: Settings,
    host_id: str,
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
    token: str | None = None,
    dialect: str | None = None,
) -> Program[bool]:
    """Record that the host is alive (and the run's progress); True when it should stop.

    The host's heartbeat time (with `token`, a request's bearer token, checked against the
    host's secret first: NotAuthenticated, nothing written, unless it matches), and the lease
    renewed only where the run is still leased to this host as this attempt; when it is not,
    why (not this host's attempt: refused; cancelled with its job, or lost and requeued: stop
    working). On PostgreSQL (`dialect`) each statement stands alone (the module docstring);
    elsewhere the program needs its transaction (a wrong token's write is rolled back)."""
    if run_id is not None and attempt is None:
        raise Invalid("heartbeat names a run_id without its attempt")
    now = utcnow()
    seen = {"w_host": host_id, "w_now": now}
    if dialect == "postgresql":
        return (yield from _beat_alone(settings, seen, run_id, attempt, progress, token))
    if token is None:
        yield Execute(_HOST_SEEN, seen)
    else:
        stored = (yield Execute(_HOST_SEEN_RETURNING_SECRET, seen)).scalar()
        if not auth_service.token_matches(token, stored):
            raise NotAuthenticated(auth_service.WORKER_REFUSAL)
    if run_id is None:
        return False
    params: dict[str, Any] = {
        "w_run": run_id,
        "w_host": host_id,
        "w_attempt": attempt,
        "w_expires": now + timedelta(seconds=settings.lease_ttl_s),
    }
    if progress is not None:
        params["w_progress"] = progress
    renewed = (yield Execute(_RENEW if progress is None else _RENEW_WITH_PROGRESS, params)).rowcount
    if renewed == 1:
        return False
    found = (yield Execute(RUN_AND_ATTEMPT, {"w_run": run_id, "w_attempt": attempt})).one_or_none()
    require_holder(found, host_id=host_id, run_id=run_id, attempt=cast(int, attempt))
    return True


def _beat_alone(
    settings: Settings,
    seen: dict[str, Any],
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
    token: str | None,
) -> Program[bool]:
    """`heartbeat_program` on PostgreSQL: statements that each stand alone."""
    host_id = seen["w_host"]
    if token is not None:
        stored = (yield Execute(_SECRET, {"w_host": host_id})).scalar()
        if not auth_service.token_matches(token, stored):
            raise NotAuthenticated(auth_service.WORKER_REFUSAL)
    if run_id is None:
        written = (yield Execute(_BEAT["host"], seen)).one()
        if written.seen != 1:  # revoked since the secret was read
            raise NotAuthenticated(auth_service.WORKER_REFUSAL)
        return False
    params: dict[str, Any] = {
        **seen,
        "w_run": run_id,
        "w_attempt": attempt,
        "w_expires": seen["w_now"] + timedelta(seconds=settings.lease_ttl_s),
    }
    if progress is not None:
        params["w_progress"] = progress
    written = (yield Execute(_BEAT["lease" if progress is None else "progress"], params)).one()
    if written.seen == 1 and written.renewed == 1:
        return False
    found = (yield Execute(RUN_AND_ATTEMPT, {"w_run": run_id, "w_attempt": attempt})).one_or_none()
    require_holder(found, host_id=host_id, run_id=run_id, attempt=cast(int, attempt))
    if written.seen != 1:  # the attempt is this host's: the host was revoked meanwhile
        raise NotAuthenticated(auth_service.WORKER_REFUSAL)
    return True
