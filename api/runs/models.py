"""Runs (one host executing one job's plan), their attempts, and the ingested cells."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, SpecColumn, UTCDateTime, one_of, utcnow
from coldbench.evidence.contract.protocol import ATTEMPT_STATES, RunState
from coldbench.evidence.contract.schemas import JobSpec


class Run(Base):
    """One reproduction slot of a job; `attempt` counts leases, the host changes with them."""

    __tablename__ = "runs"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "slot"),
        sa.CheckConstraint(one_of("state", RunState), name="state"),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), index=True)
    slot: Mapped[int] = mapped_column(sa.Integer)
    attempt: Mapped[int] = mapped_column(sa.Integer, default=0)
    state: Mapped[str] = mapped_column(sa.String(16), default=RunState.QUEUED, index=True)
    host_id: Mapped[str | None] = mapped_column(sa.ForeignKey("hosts.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    leased_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    progress: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    manifest: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    # Records that failed validation at ingest ("line N: why"); the raw file stays stored.
    ingest_errors: Mapped[list[str] | None] = mapped_column(sa.JSON)
    # The spec this run's host ran when the job left refs for it to resolve (a history's range,
    # a bisection's good..bad; evidence/spec/resolution.py), checked at ingest; analysis uses it.
    resolved_spec: Mapped[JobSpec | None] = mapped_column(SpecColumn)


class RunAttempt(Base):
    """One lease of a run by one host; lost and late attempts stay here for audit."""

    __tablename__ = "run_attempts"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "attempt"),
        sa.CheckConstraint(one_of("state", ATTEMPT_STATES), name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    host_id: Mapped[str] = mapped_column(sa.ForeignKey("hosts.id"), index=True)
    state: Mapped[str] = mapped_column(sa.String(16), default=RunState.LEASED)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    # A complete that arrived after this attempt was lost: kept verbatim, never ingested.
    late_complete: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)


class Cell(Base):
    """One record of records.jsonl, normalized; `record` keeps the validated original."""

    __tablename__ = "cells"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "line"),
        # Re-ingesting a run can never count a measurement twice.
        sa.Index(
            "uq_cells_measurement",
            "run_id",
            "variant",
            "round",
            "context_tokens",
            unique=True,
            sqlite_where=sa.text("status != 'warmup'"),
            postgresql_where=sa.text("status != 'warmup'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    line: Mapped[int] = mapped_column(sa.Integer)
    variant: Mapped[str] = mapped_column(sa.String(64))
    round: Mapped[int] = mapped_column(sa.Integer)
    order: Mapped[int] = mapped_column(sa.Integer)
    context_tokens: Mapped[int] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(16))
    reason: Mapped[str | None] = mapped_column(sa.Text)
    cached_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    prefill_s: Mapped[float | None] = mapped_column(sa.Float)
    prefill_tps: Mapped[float | None] = mapped_column(sa.Float)
    decode_s: Mapped[float | None] = mapped_column(sa.Float)
    decode_tps: Mapped[float | None] = mapped_column(sa.Float)
    peak_memory_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    prompt_sha256: Mapped[str | None] = mapped_column(sa.String(64))
    output_sha256: Mapped[str | None] = mapped_column(sa.String(64))
    record: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
