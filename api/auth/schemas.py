"""API shapes of the admin endpoints."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from coldbench.evidence.contract.schemas import Label


class EnrollmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[Label] = Field(default_factory=list, max_length=100)


class EnrollmentResponse(BaseModel):
    token: str


class ApiKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100)


class ApiKeyResponse(BaseModel):
    key: str


class LabelsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[Label] = Field(max_length=100)


class HostLabelsResponse(BaseModel):
    id: str
    name: str
    # What lease matching uses now: the admin's (as just set) and the host's own.
    labels: list[str]
    admin_labels: list[str]
    host_labels: list[str]


class HostRevokedResponse(BaseModel):
    id: str
    name: str
    revoked_at: datetime
    # Runs the host held a lease on: queued again (or expired after their last attempt).
    requeued_runs: list[str]


class ApiKeyRevokedResponse(BaseModel):
    id: str
    name: str
    revoked_at: datetime
