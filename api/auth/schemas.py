"""API shapes of the admin endpoints."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evidence.protocol import Label


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
