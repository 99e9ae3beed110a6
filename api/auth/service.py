"""Tokens: generated here, shown once, stored as sha256 digests, compared in constant time.

Formats: `cbe_<random>` (enrollment, one use), `cbw_<worker_id>_<random>` (a worker's secret),
`cbk_<key_id>_<random>` (a submitter's API key).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coldbench.api.auth.models import ApiKey, AuditEvent, EnrollmentToken, WebSession
from coldbench.api.database import utcnow
from coldbench.api.errors import NotAuthenticated, NotFound
from coldbench.api.hosts.models import Host
from coldbench.api.transactions import Execute, Program, among_ids

log = logging.getLogger(__name__)

_ID_TOKEN = re.compile(r"^(cbw|cbk)_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})$")
_ENROLLMENT_TOKEN = re.compile(r"^cbe_[A-Za-z0-9_-]{20,100}$")


def new_id() -> str:
    return secrets.token_hex(8)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _matches(token: str, stored_sha256: str) -> bool:
    return hmac.compare_digest(token_digest(token), stored_sha256)


def record_audit(
    *, db_session: Session, actor: str, kind: str, subject_id: str, **detail: Any
) -> None:
    db_session.add(AuditEvent(actor=actor, kind=kind, subject_id=subject_id, detail=detail))


def create_enrollment_token(*, db_session: Session, labels: list[str] | None = None) -> str:
    """A one-use token that lets one host register; returns the token (shown once)."""
    token = f"cbe_{secrets.token_urlsafe(32)}"
    row = EnrollmentToken(id=new_id(), token_sha256=token_digest(token), labels=labels or [])
    db_session.add(row)
    record_audit(db_session=db_session, actor="admin", kind="enrollment.created", subject_id=row.id)
    db_session.commit()
    return token


def create_api_key(*, db_session: Session, name: str) -> str:
    """A submitter API key; returns the key (shown once)."""
    key_id = new_id()
    key = f"cbk_{key_id}_{secrets.token_urlsafe(32)}"
    db_session.add(ApiKey(id=key_id, name=name, key_sha256=token_digest(key)))
    record_audit(
        db_session=db_session, actor="admin", kind="apikey.created", subject_id=key_id, name=name
    )
    db_session.commit()
    return key


def new_worker_secret(worker_id: str) -> tuple[str, str]:
    """(secret, its digest) for a worker."""
    secret = f"cbw_{worker_id}_{secrets.token_urlsafe(32)}"
    return secret, token_digest(secret)


def claim_enrollment_token(*, db_session: Session, token: str) -> EnrollmentToken | None:
    """The unused enrollment token matching `token`, locked for this transaction, or None."""
    if not _ENROLLMENT_TOKEN.fullmatch(token):
        return None
    row = db_session.scalars(
        sa.select(EnrollmentToken)
        .where(EnrollmentToken.token_sha256 == token_digest(token))
        .with_for_update()
    ).one_or_none()
    if row is None or row.used_at is not None or not _matches(token, row.token_sha256):
        return None
    row.used_at = utcnow()
    return row


def token_id(token: str, kind: str) -> str | None:
    """The id a `<kind>_<id>_<random>` token names (kind `cbw`: a worker, `cbk`: an API key),
    not yet checked; None when the token is not of that form."""
    match = _ID_TOKEN.fullmatch(token)
    if match is None or match.group(1) != kind:
        return None
    return match.group(2)


def authenticate_worker(*, db_session: Session, token: str) -> Host | None:
    worker_id = token_id(token, "cbw")
    if worker_id is None:
        return None
    host = db_session.get(Host, worker_id)
    if host is None or host.revoked_at is not None or not _matches(token, host.secret_sha256):
        return None
    return host


# The worker's secret digest, if it is enrolled and not revoked: what a heartbeat, an upload or
# a completion needs to know of its caller (loading the whole Host row, with its JSON columns,
# through the ORM was a tenth of such a request's CPU under load; docs/RELIABILITY.md).
_HOSTS = cast(sa.Table, Host.__table__)
WORKER_REFUSAL = "invalid worker token"
_WORKER_SECRET = sa.select(_HOSTS.c.secret_sha256).where(
    _HOSTS.c.id == sa.bindparam("worker_id"), _HOSTS.c.revoked_at.is_(None)
)


def token_matches(token: str, stored_sha256: str | None) -> bool:
    """The token's digest equals the stored one (compared in constant time)."""
    return stored_sha256 is not None and _matches(token, stored_sha256)


def with_worker_secret(statement: sa.Select[Any]) -> sa.Select[Any]:
    """`statement` (a read of one row at most) as exactly one row, with the secret digest of
    host `worker_id` beside its columns (`worker_secret`; NULL when unknown or revoked): a
    request's authentication and its first read in one round trip (`read_for_worker_program`)."""
    found = statement.subquery("found")
    one = sa.select(sa.literal_column("1").label("one")).subquery("one")
    return sa.select(_WORKER_SECRET.scalar_subquery().label("worker_secret"), *found.c).select_from(
        one.outerjoin(found, sa.true())
    )


def read_for_worker_program(
    statement: sa.Select[Any],
    as_worker: sa.Select[Any],
    params: dict[str, Any],
    *,
    worker_id: str,
    token: str | None,
    present: str,
) -> Program[Any]:
    """`statement`'s row, or None, read for host `worker_id`. With `token` (a request's bearer
    token) it is read by `as_worker` (`with_worker_secret(statement)`): NotAuthenticated unless
    the token is the host's secret, whether or not a row was found (which shows in its column
    `present`, never NULL in a found row). Without, the caller authenticated the host.

    The same decision as `authenticate_worker` (the same digest compared in constant time,
    revocation read from the database on every request), without loading the host."""
    if token is None:
        return (yield Execute(statement, params)).one_or_none()
    row = (yield Execute(as_worker, {**params, "worker_id": worker_id})).one()
    if not token_matches(token, row.worker_secret):
        raise NotAuthenticated(WORKER_REFUSAL)
    return row if getattr(row, present) is not None else None


def is_admin(*, token: str, admin_token_sha256: str) -> bool:
    """The admin token is configured as a digest only; an empty digest disables it."""
    return bool(admin_token_sha256) and _matches(token, admin_token_sha256)


def authenticate_submitter(*, db_session: Session, token: str) -> ApiKey | None:
    key_id = token_id(token, "cbk")
    if key_id is None:
        return None
    key = db_session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None or not _matches(token, key.key_sha256):
        return None
    return key


_KEYS = cast(sa.Table, ApiKey.__table__)


_KEY_SECRETS = {
    is_pg: sa.select(_KEYS.c.id, _KEYS.c.key_sha256).where(among, _KEYS.c.revoked_at.is_(None))
    for is_pg, among in among_ids(_KEYS.c.id, "key_ids").items()
}


def submitter_ids_program(tokens: list[str], dialect: str) -> Program[list[str | None]]:
    """Each token's API key id, unless unknown, revoked or wrong (None): what
    `authenticate_submitter` decides, for several tokens in one query (a group of submissions)
    and without loading the keys."""
    key_ids = [token_id(token, "cbk") for token in tokens]
    wanted = sorted({key_id for key_id in key_ids if key_id is not None})
    stored: dict[str, str] = {}
    if wanted:
        params = {"key_ids": wanted}
        stored = dict((yield Execute(_KEY_SECRETS[dialect == "postgresql"], params)).all())
    return [
        key_id if key_id is not None and token_matches(token, stored.get(key_id)) else None
        for token, key_id in zip(tokens, key_ids, strict=True)
    ]


def revoke_api_key(*, db_session: Session, key_or_id: str, actor: str) -> ApiKey:
    """Refuse this key from now on (its id, or the whole key); idempotent. Browser sessions
    signed in with it end at their next request."""
    key_id = token_id(key_or_id, "cbk") or key_or_id
    key = db_session.get(ApiKey, key_id) if re.fullmatch(r"[0-9a-f]{16}", key_id) else None
    if key is None:
        raise NotFound(f"no API key {key_or_id[:20]!r} (give its id: cbk_<id>_...)")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        record_audit(db_session=db_session, actor=actor, kind="apikey.revoked", subject_id=key.id)
        db_session.commit()
    return key


def active_api_key(*, db_session: Session, key_id: str) -> ApiKey | None:
    """The API key with this id unless it is unknown or revoked (browser sessions name keys
    by id; a revoked key ends them)."""
    key = db_session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        return None
    return key


def start_web_session(*, db_session: Session, key: ApiKey) -> str:
    """A new browser session of `key` (at /login); its id goes into the signed cookie."""
    session = WebSession(id=secrets.token_hex(16), api_key_id=key.id)
    db_session.add(session)
    db_session.commit()
    return session.id


def web_session_key(*, db_session: Session, session_id: str) -> ApiKey | None:
    """The API key of a browser session that was not ended, unless the key is revoked."""
    return db_session.scalars(
        sa.select(ApiKey)
        .join(WebSession, WebSession.api_key_id == ApiKey.id)
        .where(
            WebSession.id == session_id,
            WebSession.ended_at.is_(None),
            ApiKey.revoked_at.is_(None),
        )
    ).one_or_none()


def end_web_session(*, db_session: Session, session_id: str) -> None:
    """End a browser session (/logout): its cookie opens nothing from now on; idempotent."""
    db_session.execute(
        sa.update(WebSession)
        .where(WebSession.id == session_id, WebSession.ended_at.is_(None))
        .values(ended_at=utcnow())
    )
    db_session.commit()
