"""API shapes of leases, completion and run views."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evidence.schemas import HostInfo

# run_attempts.attempt and artifacts.attempt are 32-bit integer columns on PostgreSQL.
ATTEMPT_MAX = 2**31 - 1
Attempt = Annotated[int, Field(ge=1, le=ATTEMPT_MAX)]


class LeaseRequest(BaseModel):
    """No labels: a host's labels come from its enrollment and the admin, never from a lease."""

    model_config = ConfigDict(extra="forbid")
    fingerprint: HostInfo
    wait_s: int = Field(0, ge=0, le=25)


class LeaseResponse(BaseModel):
    run_id: str
    attempt: int
    job_id: str
    spec: dict[str, Any]
    timeout_s: int
    lease_ttl_s: int


class CompleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: Attempt
    status: Literal["succeeded", "failed"]
    reason: str | None = Field(None, max_length=4000)
    manifest: dict[str, Any]


class CompleteResponse(BaseModel):
    run_id: str
    attempt: int
    state: str


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
