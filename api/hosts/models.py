"""A registered benchmark host: what it is, what it may build and which models it has."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class Host(Base):
    __tablename__ = "hosts"
    # A name names one host that is not revoked: a revoked host keeps its rows and history,
    # and the name may be enrolled again as a new host (new id, new secret).
    __table_args__ = (
        sa.Index(
            "uq_hosts_active_name",
            "name",
            unique=True,
            sqlite_where=sa.text("revoked_at IS NULL"),
            postgresql_where=sa.text("revoked_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64))
    secret_sha256: Mapped[str] = mapped_column(sa.String(64))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    # Labels the admin gave at enrollment (or set since with `coldbench admin labels`).
    enrolled_labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # Labels the host derives itself and sent when it registered (its worker.toml's labels,
    # `corpus:NAME` for each corpus, `chip:`, `mem:`, ...): the admin's command never changes
    # them.
    host_labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # What lease matching uses, with the automatic ones: enrolled_labels | host_labels, never
    # changed by a lease request, never `host:...`.
    labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # The automatic `backend:` and `os:` labels, from the fingerprint it registered with
    # (api/hosts/matching.py: system_labels); a lease's fingerprint never changes them.
    system_labels: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    # {"<name>": {"recipes": [str]}}: the allow-list configured on the host.
    repositories: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    # The host's model names plus `preset:NAME` for each preset it allows (allow_presets).
    models: Mapped[list[str]] = mapped_column(sa.JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # ready (polling), busy (holds a lease), lost (a lease of it expired)
    health: Mapped[str] = mapped_column(sa.String(16), default="ready")
    # Set by `coldbench admin revoke host`: its secret is refused from then on.
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The host's last `coldbench calibrate` result
    # (coldbench.evidence.contract.calibration.HostCalibration).
    calibration: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
