"""Heartbeats: a host says it is alive, renews its lease and reports its run's progress.

Heartbeats are most of an agent's requests: a program of two or three Core statements
(`api/transactions.py`), no ORM objects.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import sqlalchemy as sa

from api.auth import service as auth_service
from api.database import utcnow
from api.errors import Invalid, NotAuthenticated
from api.hosts.models import Host
from api.runs.models import Run
from api.runs.service import RUN_AND_ATTEMPT, held_by, require_holder
from api.settings import Settings
from api.transactions import Execute, Program

_runs = cast(sa.Table, Run.__table__)
_hosts = cast(sa.Table, Host.__table__)
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


def heartbeat_program(
    *,
    settings: Settings,
    host_id: str,
    run_id: str | None,
    attempt: int | None,
    progress: dict[str, Any] | None,
    token: str | None = None,
) -> Program[bool]:
    """Record that the host is alive (and the run's progress); True when it should stop.

    Two or three statements: the host's heartbeat time (with `token`, a request's bearer
    token, checked against the host's secret in the same statement: NotAuthenticated, nothing
    written, unless it matches), then the lease renewed only where the run is still leased to
    this host as this attempt; when it is not, why (not this host's attempt: refused;
    cancelled with its job, or lost and requeued: stop working)."""
    if run_id is not None and attempt is None:
        raise Invalid("heartbeat names a run_id without its attempt")
    now = utcnow()
    seen = {"w_host": host_id, "w_now": now}
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
