"""API shapes of jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from coldbench.api.runs.schemas import RunOut


class StepOut(BaseModel):
    """One step of a bisection: a job of its own; its commits once its host resolved them."""

    id: str
    step: int
    state: str
    lo: str | None
    mid: str | None
    hi: str | None
    commits_apart: int | None
    decision: str | None
    why: str | None
    cells_done: int | None
    cells_total: int | None
    evidence_url: str | None
    reason: str | None


class JobOut(BaseModel):
    id: str
    state: str
    spec: dict[str, Any]
    spec_sha256: str
    created_at: datetime
    updated_at: datetime
    reason: str | None
    evidence_id: str | None
    evidence_url: str | None
    runs: list[RunOut]
    # A bisection step's bisection and number; a bisection's steps so far.
    parent_id: str | None = None
    step: int | None = None
    steps: list[StepOut] = []
    # The spec the host ran, where it resolved the job's commits (a range, good..bad).
    resolved_spec: dict[str, Any] | None = None
    # Why the rounds cannot reach a verdict (evidence/analysis/stats.py too_few_rounds), over the
    # commits the host resolved once it has; None when they can.
    rounds_warning: str | None = None
    # Why a queued job will wait: only offline hosts can run it (api/hosts/matching.py).
    notice: str | None = None


class JobListItem(BaseModel):
    id: str
    state: str
    mode: str
    created_at: datetime
    evidence_id: str | None
