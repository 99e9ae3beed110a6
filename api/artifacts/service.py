"""Artifacts: who may upload what under which name, and the rows that point into the store."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coldbench.api.artifacts.models import Artifact
from coldbench.api.artifacts.store import SHA256_PATTERN, StoredBlob
from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.errors import Conflict, Invalid
from coldbench.api.runs import service as run_service
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.transactions import Execute, Program

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


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact row as an upload answers it."""

    name: str
    sha256: str
    bytes: int


# What an upload is judged on, in one statement: the run (its state, holder, attempt), who held
# the named attempt, and the artifact already stored under this name for it. Core on the
# session's connection: through the ORM this was five queries, each loading objects, twice per
# upload, the largest share of an agent's requests' server CPU (docs/RELIABILITY.md).
_runs = cast(sa.Table, Run.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)
_artifacts = cast(sa.Table, Artifact.__table__)
_ATTEMPT = sa.bindparam("w_attempt", type_=sa.Integer)
_INSERT_ARTIFACT = sa.insert(_artifacts)
_UPLOAD_STATE = (
    sa.select(
        _runs.c.state,
        _runs.c.host_id,
        _runs.c.attempt,
        _attempts.c.host_id.label("attempt_host_id"),
        _artifacts.c.sha256,
        _artifacts.c.bytes,
    )
    .select_from(
        _runs.outerjoin(
            _attempts, sa.and_(_attempts.c.run_id == _runs.c.id, _attempts.c.attempt == _ATTEMPT)
        ).outerjoin(
            _artifacts,
            sa.and_(
                _artifacts.c.run_id == _runs.c.id,
                _artifacts.c.attempt == _ATTEMPT,
                _artifacts.c.name == sa.bindparam("w_name", type_=_artifacts.c.name.type),
            ),
        )
    )
    .where(_runs.c.id == sa.bindparam("w_run", type_=_runs.c.id.type))
)
_UPLOAD_STATE_AS_WORKER = auth_service.with_worker_secret(_UPLOAD_STATE)


def upload_check_program(
    *, host_id: str, run_id: str, attempt: int, name: str, sha256: str, token: str | None = None
) -> Program[StoredArtifact | None]:
    """Refuse an upload before its bytes are read (with `token`, the request's bearer token,
    checked in the same read: NotAuthenticated unless it is the host's secret); returns the
    identical row if one exists."""
    found = yield from auth_service.read_for_worker_program(
        _UPLOAD_STATE,
        _UPLOAD_STATE_AS_WORKER,
        {"w_run": run_id, "w_attempt": attempt, "w_name": name},
        worker_id=host_id,
        token=token,
        present="state",
    )
    run_service.require_holder(found, host_id=host_id, run_id=run_id, attempt=attempt)
    existing = (
        None if found.sha256 is None else StoredArtifact(name, found.sha256, int(found.bytes))
    )
    if existing is not None and existing.sha256 != sha256:
        raise Conflict(
            f"{name} of run {run_id} attempt {attempt} was already uploaded with sha256 "
            f"{existing.sha256}; a stored artifact never changes"
        )
    if existing is None and not run_service.row_is_current(found, host_id, attempt):
        raise Conflict(
            f"attempt {attempt} of run {run_id} is no longer current (run is {found.state}, "
            f"attempt {found.attempt})"
        )
    return existing


# An upload's row in one statement, outside a transaction of its own: inserted only where the
# attempt is still current and holds no artifact of this name yet, and its id returned. The
# common case (a first upload of a current attempt) is this one round trip, where a check and
# an insert in a transaction were four (BEGIN, the check, INSERT, COMMIT) and a fifth of an
# upload's server CPU; anything else is said by the check (`upload_check_program`) after it.
_NOW = sa.bindparam("w_now", type_=_artifacts.c.created_at.type)
_INSERT_IF_CURRENT = (
    sa.insert(_artifacts)
    .from_select(
        ["run_id", "attempt", "name", "sha256", "bytes", "storage_path", "created_at"],
        sa.select(
            sa.bindparam("w_run", type_=_artifacts.c.run_id.type),
            _ATTEMPT,
            sa.bindparam("w_name", type_=_artifacts.c.name.type),
            sa.bindparam("w_sha256", type_=_artifacts.c.sha256.type),
            sa.bindparam("w_bytes", type_=_artifacts.c.bytes.type),
            sa.bindparam("w_path", type_=_artifacts.c.storage_path.type),
            _NOW,
        ).where(
            sa.exists(run_service.held_by(sa.select(_runs.c.id))),
            ~sa.exists(
                sa.select(_artifacts.c.id).where(
                    _artifacts.c.run_id == sa.bindparam("w_run"),
                    _artifacts.c.attempt == _ATTEMPT,
                    _artifacts.c.name == sa.bindparam("w_name"),
                )
            ),
        ),
    )
    .returning(_artifacts.c.id)
)


def record_upload_program(
    *, host_id: str, run_id: str, attempt: int, name: str, blob: StoredBlob
) -> Program[tuple[StoredArtifact, bool]]:
    """The row for a stored blob; (row, created). One statement where the attempt is current
    and the name new; otherwise the check says why not (Conflict, Forbidden, NotFound) or
    returns the identical row (idempotent for the same name and digest). Each statement stands
    alone (`Database.run_alone`): the insert checks what it needs in its own WHERE. Two
    identical uploads at once may both find the name free: the second insert's unique
    violation is the caller's to retry (it then finds the row)."""
    params = {
        "w_run": run_id,
        "w_host": host_id,
        "w_attempt": attempt,
        "w_name": name,
        "w_sha256": blob.sha256,
        "w_bytes": blob.bytes,
        "w_path": blob.storage_path,
        "w_now": utcnow(),
    }
    for _ in range(2):
        if (yield Execute(_INSERT_IF_CURRENT, params)).first() is not None:
            return StoredArtifact(name, blob.sha256, blob.bytes), True
        existing = yield from upload_check_program(
            host_id=host_id, run_id=run_id, attempt=attempt, name=name, sha256=blob.sha256
        )
        if existing is not None:
            return existing, False
        # Current and the name free when checked, after the insert found otherwise: an
        # artifact row removed in between. Once more.
    raise Conflict(
        f"{name} of run {run_id} attempt {attempt} could not be recorded: the run changed "
        "while it was checked; send it again"
    )


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
