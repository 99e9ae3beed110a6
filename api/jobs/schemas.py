"""API shapes of jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from api.runs.schemas import RunOut


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


class JobListItem(BaseModel):
    id: str
    state: str
    mode: str
    created_at: datetime
    evidence_id: str | None
