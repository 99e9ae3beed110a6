"""Signed session cookies and CSRF tokens."""

from __future__ import annotations

from pathlib import Path

from coldbench.api.pages import signing
from coldbench.api.settings import Settings

SECRET = b"s" * 32


def test_session_cookie_round_trip_and_expiry() -> None:
    cookie = signing.session_cookie(SECRET, "0123456789abcdef", now_s=1000)
    assert signing.session_id_of(SECRET, cookie, ttl_s=60, now_s=1030) == "0123456789abcdef"
    assert signing.session_id_of(SECRET, cookie, ttl_s=60, now_s=1061) is None
    assert signing.session_id_of(b"other" * 8, cookie, ttl_s=60, now_s=1030) is None


def test_session_cookie_tampered_key_id_is_refused() -> None:
    cookie = signing.session_cookie(SECRET, "0123456789abcdef", now_s=1000)
    forged = cookie.replace("0123456789abcdef", "fedcba9876543210")
    assert signing.session_id_of(SECRET, forged, ttl_s=60, now_s=1001) is None
    for junk in ("", "a.b", "a.b.c.d", None):
        assert signing.session_id_of(SECRET, junk, ttl_s=60, now_s=1001) is None


def test_csrf_token_is_bound_to_its_session() -> None:
    token = signing.csrf_token(SECRET, "key-a")
    assert signing.csrf_ok(SECRET, token, token, "key-a")
    assert not signing.csrf_ok(SECRET, token, token, "key-b")
    assert not signing.csrf_ok(SECRET, token, token, None)
    assert not signing.csrf_ok(SECRET, token, signing.csrf_token(SECRET, "key-a"), "key-a")
    assert not signing.csrf_ok(SECRET, token, "", "key-a")
    assert not signing.csrf_ok(SECRET, None, token, "key-a")


def test_web_secret_is_generated_once_and_kept(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", artifact_dir=tmp_path / "a")
    first = signing.web_secret(settings)
    assert len(first) >= 32
    assert signing.web_secret(settings) == first
    assert (tmp_path / "state" / signing.SECRET_FILE).stat().st_mode & 0o077 == 0
    configured = Settings(state_dir=tmp_path / "state", web_secret="configured-secret")
    assert signing.web_secret(configured) == b"configured-secret"
