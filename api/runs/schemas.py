"""API shapes of run views (leases and completion: the worker protocol,
evidence/contract/protocol.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class AttemptOut(BaseModel):
    attempt: int
    host_id: str
    state: str
    started_at: datetime
    ended_at: datetime | None
    reason: str | None


class RunOut(BaseModel):
    id: str
    slot: int
    attempt: int
    state: str
    host_id: str | None
    host_name: str | None
    progress: dict[str, Any] | None
    lease_expires_at: datetime | None
    completed_at: datetime | None
    processed_at: datetime | None
    reason: str | None
    attempts: list[AttemptOut]
