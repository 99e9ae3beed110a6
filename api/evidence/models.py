"""Rendered evidence of a job: the id derived from the manifest digest, and its files."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class Evidence(Base):
    __tablename__ = "evidence"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), unique=True)
    manifest_sha256: Mapped[str] = mapped_column(sa.String(64))
    # {"bundle.zip" | "report.html" | "summary.md" | "summary.json": {"sha256", "bytes"}}
    files: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
