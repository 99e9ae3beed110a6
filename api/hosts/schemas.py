"""API shapes of the host list. What a host sends (registration, heartbeat) is the worker
protocol, `evidence/contract/protocol.py`, shared with the agent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class HostOut(BaseModel):
    id: str
    name: str
    # What lease matching uses besides auto_labels: admin_labels | host_labels.
    labels: list[str]
    # Set by the admin (enrollment, `coldbench admin labels --set`).
    admin_labels: list[str]
    # Derived by the host itself and sent at registration (corpus:, chip:, mem:, worker.toml).
    host_labels: list[str]
    # Derived by the server (host:, and backend:, os: of the registered fingerprint).
    auto_labels: list[str]
    repositories: dict[str, Any]
    models: list[str]
    fingerprint: dict[str, Any]
    last_heartbeat_at: datetime | None
    health: str
    calibration: dict[str, Any] | None = (
        None  # coldbench.evidence.contract.calibration.HostCalibration
    )
