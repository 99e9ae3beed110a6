"""Signed browser cookies: the session (which submitter API key logged in) and CSRF tokens.

Both are `<fields>.<hmac-sha256>` with the web secret, compared with `hmac.compare_digest`.
The session cookie never holds the API key itself, only the id of its session row
(`coldbench.api.auth.models.WebSession`): logging out ends the session on the server, and revoking
the key ends every browser session of it (both are checked on each request).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from coldbench.api.settings import Settings

log = logging.getLogger(__name__)

SESSION_COOKIE = "cb_session"
CSRF_COOKIE = "cb_csrf"
CSRF_FIELD = "csrf_token"
SECRET_FILE = "web-secret"


def web_secret(settings: Settings) -> bytes:
    """The configured secret, or one generated once into state_dir (mode 0600) and reused."""
    if settings.web_secret:
        return settings.web_secret.encode("utf-8")
    path = Path(settings.state_dir) / SECRET_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(48).encode("ascii")
    try:
        # O_EXCL: of several processes starting at once exactly one writes; the others read it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        time.sleep(0.05)
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as handle:
        handle.write(value)
    log.info("generated the web secret in %s", path)
    return value


def _sign(secret: bytes, purpose: str, payload: str) -> str:
    return hmac.new(secret, f"{purpose}:{payload}".encode(), hashlib.sha256).hexdigest()


def session_cookie(secret: bytes, session_id: str, now_s: float | None = None) -> str:
    """The signed cookie of a browser session (api/auth: WebSession's id)."""
    issued = str(int(now_s if now_s is not None else time.time()))
    payload = f"{session_id}.{issued}"
    return f"{payload}.{_sign(secret, 'session', payload)}"


def session_id_of(
    secret: bytes, cookie: str | None, ttl_s: int, now_s: float | None = None
) -> str | None:
    """The session id of a validly signed, unexpired session cookie, else None (whether the
    session still stands is the database's to say: logging out ends it there)."""
    if not cookie or cookie.count(".") != 2:
        return None
    session_id, issued, signature = cookie.split(".")
    expected = _sign(secret, "session", f"{session_id}.{issued}")
    if not hmac.compare_digest(signature, expected) or not issued.isdigit():
        return None
    now = now_s if now_s is not None else time.time()
    if not 0 <= now - int(issued) <= ttl_s:
        return None
    return session_id


def csrf_token(secret: bytes, session_id: str | None) -> str:
    """A fresh token bound to the session (or to no session, for the login form)."""
    nonce = secrets.token_urlsafe(24)
    return f"{nonce}.{_sign(secret, 'csrf', nonce + ':' + (session_id or '-'))}"


def csrf_token_valid(secret: bytes, token: str | None, session_id: str | None) -> bool:
    if not token or token.count(".") != 1:
        return False
    nonce, signature = token.split(".")
    expected = _sign(secret, "csrf", f"{nonce}:{session_id or '-'}")
    return hmac.compare_digest(signature, expected)


def csrf_ok(secret: bytes, cookie: str | None, field: str | None, session_id: str | None) -> bool:
    """Double submit: the form field equals the cookie, and the cookie is ours for this
    session. A cross-site form can send the cookie but cannot read it to fill the field."""
    if not cookie or not field:
        return False
    return hmac.compare_digest(cookie, field) and csrf_token_valid(secret, cookie, session_id)
