"""API shapes of artifacts."""

from __future__ import annotations

from pydantic import BaseModel


class ArtifactOut(BaseModel):
    run_id: str
    attempt: int
    name: str
    sha256: str
    bytes: int
    created: bool
