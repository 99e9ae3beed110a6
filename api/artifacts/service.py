"""Artifacts: who may upload what under which name, and the rows that point into the store."""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.artifacts.models import Artifact
from api.artifacts.store import SHA256_PATTERN, StoredBlob
from api.errors import Conflict, Invalid
from api.hosts.models import Host
from api.runs import service as run_service

ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_upload_request(name: str, sha256: str | None) -> str:
    if not ARTIFACT_NAME.fullmatch(name) or ".." in name:
        raise Invalid(f"artifact name {name!r} must match {ARTIFACT_NAME.pattern} without '..'")
    if sha256 is None:
        raise Invalid("X-Content-SHA256 header missing: send the body's sha256 in hex")
    sha256 = sha256.strip().lower()
    if not SHA256_PATTERN.fullmatch(sha256):
        raise Invalid("X-Content-SHA256 must be 64 lowercase hex digits")
    return sha256


def find_artifact(*, db_session: Session, run_id: str, attempt: int, name: str) -> Artifact | None:
    return db_session.scalars(
        sa.select(Artifact).where(
            Artifact.run_id == run_id, Artifact.attempt == attempt, Artifact.name == name
        )
    ).one_or_none()


def check_upload(
    *, db_session: Session, host: Host, run_id: str, attempt: int, name: str, sha256: str
) -> Artifact | None:
    """Refuse an upload before its bytes are read; returns the identical row if one exists."""
    run_service.host_attempt(db_session=db_session, host=host, run_id=run_id, attempt=attempt)
    run = run_service.get_run(db_session=db_session, run_id=run_id)
    existing = find_artifact(db_session=db_session, run_id=run_id, attempt=attempt, name=name)
    if existing is not None and existing.sha256 != sha256:
        raise Conflict(
            f"{name} of run {run_id} attempt {attempt} was already uploaded with sha256 "
            f"{existing.sha256}; a stored artifact never changes"
        )
    if existing is None and not run_service.is_current(run, host, attempt):
        raise Conflict(
            f"attempt {attempt} of run {run_id} is no longer current (run is {run.state}, "
            f"attempt {run.attempt})"
        )
    db_session.rollback()  # release the read transaction while the body streams
    return existing


def record_upload(
    *, db_session: Session, host: Host, run_id: str, attempt: int, name: str, blob: StoredBlob
) -> tuple[Artifact, bool]:
    """The row for a stored blob; (row, created). Idempotent for the same name and digest."""

    def recheck() -> Artifact | None:
        return check_upload(
            db_session=db_session,
            host=host,
            run_id=run_id,
            attempt=attempt,
            name=name,
            sha256=blob.sha256,
        )

    existing = recheck()
    if existing is not None:
        return existing, False
    row = Artifact(
        run_id=run_id,
        attempt=attempt,
        name=name,
        sha256=blob.sha256,
        bytes=blob.bytes,
        storage_path=blob.storage_path,
    )
    db_session.add(row)
    try:
        db_session.commit()
    except IntegrityError:
        # A concurrent upload of the same name won the race; same answer as a repeat.
        db_session.rollback()
        existing = recheck()
        assert existing is not None
        return existing, False
    return row, True


def run_artifacts(*, db_session: Session, run_id: str, attempt: int) -> list[Artifact]:
    return list(
        db_session.scalars(
            sa.select(Artifact)
            .where(Artifact.run_id == run_id, Artifact.attempt == attempt)
            .order_by(Artifact.name)
        )
    )


def total_artifact_bytes(*, db_session: Session) -> int:
    total = db_session.scalar(sa.select(sa.func.coalesce(sa.func.sum(Artifact.bytes), 0)))
    return int(total or 0)
