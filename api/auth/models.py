"""Enrollment tokens (admin -> host, one use) and submitter API keys; only digests are stored."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class EnrollmentToken(Base):
    __tablename__ = "enrollment_tokens"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    host_id: Mapped[str | None] = mapped_column(sa.ForeignKey("hosts.id"))


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100))
    key_sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WebSession(Base):
    """A browser's login with a submitter API key (`/login`): its cookie names this row, so
    `/logout` ends it on the server (the cookie alone is no longer enough), and revoking the
    key ends every session of it."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(sa.ForeignKey("api_keys.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AuditEvent(Base):
    """Every state change worth explaining later: who, what, on which row."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(sa.String(100))
    kind: Mapped[str] = mapped_column(sa.String(64))
    subject_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    detail: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
