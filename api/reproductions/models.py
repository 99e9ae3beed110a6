"""A host's reproduction of published evidence: its bundle in the store and its runs' results."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, UTCDateTime, utcnow


class EvidenceReproduction(Base):
    __tablename__ = "evidence_reproductions"

    # The reproduction bundle's own evidence id (it names exactly one bundle).
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    evidence_id: Mapped[str] = mapped_column(sa.ForeignKey("evidence.id"), index=True)
    host_id: Mapped[str] = mapped_column(sa.ForeignKey("hosts.id"))
    manifest_sha256: Mapped[str] = mapped_column(sa.String(64))
    bundle_sha256: Mapped[str] = mapped_column(sa.String(64))
    bundle_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    # sha256 of the job identity (coldbench.evidence.bundles.compare.job_identity), the original's.
    identity_sha256: Mapped[str] = mapped_column(sa.String(64))
    # Each run of the bundle as coldbench.evidence.bundles.compare.host_run_document keeps it.
    hosts: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
