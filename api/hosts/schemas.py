"""API shapes of registration, heartbeat and the host list (contracts live in evidence/)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from api.runs.schemas import Attempt
from evidence.schemas import NAME_PATTERN, HostInfo, Name

Label = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,63}$")]
ModelName = Annotated[str, Field(pattern=r"^(preset:)?[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")]


class RepositoryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recipes: list[Name] = Field(default_factory=list, max_length=50)


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    fingerprint: HostInfo
    labels: list[Label] = Field(default_factory=list, max_length=100)
    repositories: dict[Name, RepositoryEntry] = Field(default_factory=dict, max_length=100)
    models: list[ModelName] = Field(default_factory=list, max_length=200)


class RegisterResponse(BaseModel):
    worker_id: str
    secret: str


class InvalidCell(BaseModel):
    model_config = ConfigDict(extra="allow")
    variant: str | None = None
    round: int | None = None
    context_tokens: int | None = None
    reason: str | None = None


class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")
    cells_done: int = Field(ge=0)
    cells_total: int = Field(ge=0)
    variant: str | None = None
    context_tokens: int | None = None
    invalid: list[InvalidCell] = Field(default_factory=list, max_length=1000)


class HeartbeatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str | None = Field(None, max_length=64)
    attempt: Attempt | None = None
    progress: Progress | None = None


class HeartbeatResponse(BaseModel):
    cancel: bool


class HostOut(BaseModel):
    id: str
    name: str
    labels: list[str]
    auto_labels: list[str]
    repositories: dict[str, Any]
    models: list[str]
    fingerprint: dict[str, Any]
    last_heartbeat_at: datetime | None
    health: str
    calibration: dict[str, Any] | None = None  # evidence.calibration.HostCalibration


class CalibrationAccepted(BaseModel):
    host: str
    lines: list[str]
