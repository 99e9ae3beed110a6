"""API shapes of the host list. What a host sends (registration, heartbeat) is the worker
protocol, `evidence/protocol.py`, shared with the agent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


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
