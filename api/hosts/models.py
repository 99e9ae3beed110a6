"""A registered benchmark host: what it is, what it may build and which models it has."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from api.database import Base, UTCDateTime, utcnow


class Host(Base):
    __tablename__ = "hosts"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    secret_sha256: Mapped[str] = mapped_column(sa.String(64))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    # Labels the admin gave at enrollment; they cannot be dropped by the host.
    enrolled_labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # Enrolled labels + the host's configured labels (the set lease matching uses).
    labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # {"<name>": {"recipes": [str]}}: the allow-list configured on the host.
    repositories: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    models: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # ready (polling), busy (holds a lease), lost (a lease of it expired)
    health: Mapped[str] = mapped_column(sa.String(16), default="ready")
    # The host's last `coldbench calibrate` result (evidence.calibration.HostCalibration).
    calibration: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
