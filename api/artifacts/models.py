"""Uploaded files of a run attempt, by content digest."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (sa.UniqueConstraint("run_id", "attempt", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    name: Mapped[str] = mapped_column(sa.String(128))
    sha256: Mapped[str] = mapped_column(sa.String(64))
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    # Relative to the artifact store root: ab/cd/<sha256>.
    storage_path: Mapped[str] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
