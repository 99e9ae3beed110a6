"""A submitted job: the validated spec, its digest and where it stands."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from api.database import Base, UTCDateTime, utcnow

# queued -> running -> analyzing -> done; failed when no run produced data; cancelled.
JOB_STATES = ("queued", "running", "analyzing", "done", "failed", "cancelled")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    spec_sha256: Mapped[str] = mapped_column(sa.String(64), index=True)
    state: Mapped[str] = mapped_column(sa.String(16), default="queued", index=True)
    submitted_by: Mapped[str | None] = mapped_column(sa.ForeignKey("api_keys.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Statistics recomputed on the server from raw cells (analyze_job).
    summary: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    # The rendered bundle's files in the artifact store, {name: {"sha256", "bytes"}}, written by
    # analyze_job and zipped by render_evidence.
    bundle_files: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    evidence_id: Mapped[str | None] = mapped_column(sa.String(64))
    reason: Mapped[str | None] = mapped_column(sa.Text)
