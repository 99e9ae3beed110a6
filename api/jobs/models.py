"""A submitted job: the validated spec, its digest and where it stands."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from coldbench.api.database import Base, SpecColumn, UTCDateTime, one_of, utcnow
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.contract.schemas import JobSpec

if TYPE_CHECKING:
    from coldbench.api.runs.models import Run


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.CheckConstraint(one_of("state", JobState), name="state"),
        sa.UniqueConstraint("parent_id", "step"),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    spec: Mapped[JobSpec] = mapped_column(SpecColumn)
    spec_sha256: Mapped[str] = mapped_column(sa.String(64), index=True)
    state: Mapped[str] = mapped_column(sa.String(16), default=JobState.QUEUED, index=True)
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
    # A bisection's step is a job of its own (its run, its evidence) under the bisection's job,
    # numbered from 1; the bisection's job has no runs (api/jobs/bisect.py).
    parent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("jobs.id"), index=True)
    step: Mapped[int | None] = mapped_column(sa.Integer)


def spec_as_run(job: Job, runs: Iterable[Run]) -> JobSpec:
    """The spec a job's runs measured: the one its host resolved where the job left commits
    to resolve (a history's range, a bisection's good..bad; one host resolves a job's refs,
    checked at ingest), else the job's own."""
    if job.spec.needs_host_resolution:
        resolved = next((run.resolved_spec for run in runs if run.resolved_spec), None)
        if resolved is not None:
            return resolved
    return job.spec
