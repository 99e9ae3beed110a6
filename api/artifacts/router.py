"""Artifact upload: the body streams to the store while it is hashed."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from sqlalchemy.exc import IntegrityError

from coldbench.api.artifacts import service
from coldbench.api.deps import DatabaseDep, SettingsDep, StoreDep, WorkerClaim
from coldbench.api.errors import TooLarge
from coldbench.api.routing import StrictJSONRoute
from coldbench.evidence.contract.boundary import Utf8Lines
from coldbench.evidence.contract.protocol import ATTEMPT_MAX, CONTENT_SHA256_HEADER, ArtifactReceipt

router = APIRouter(route_class=StrictJSONRoute, tags=["artifacts"])


@router.put(
    "/runs/{run_id}/artifacts/{name}",
    response_model=ArtifactReceipt,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "the same name and digest were already stored"}},
)
async def upload_artifact(
    run_id: str,
    name: str,
    request: Request,
    response: Response,
    db: DatabaseDep,
    settings: SettingsDep,
    store: StoreDep,
    worker: WorkerClaim,
    attempt: Annotated[int, Query(ge=1, le=ATTEMPT_MAX)],
    x_content_sha256: Annotated[str | None, Header(alias=CONTENT_SHA256_HEADER)] = None,
    content_length: Annotated[int | None, Header()] = None,
):
    sha256 = service.validate_upload_request(name, x_content_sha256)
    if content_length is not None and content_length > settings.max_artifact_bytes:
        raise TooLarge(
            f"Content-Length {content_length} exceeds the limit of "
            f"{settings.max_artifact_bytes} bytes"
        )
    upload = {"host_id": worker.id, "run_id": run_id, "attempt": attempt, "name": name}
    # The token is checked by the same read that checks the upload, before the body is read.
    await db.read(
        partial(service.upload_check_program, **upload, sha256=sha256, token=worker.token),
        bulk=True,
    )
    blob = await store.put_stream(
        request.stream(),
        expected_sha256=sha256,
        max_bytes=settings.max_artifact_bytes,
        # JSON files (records.jsonl, provenance.json) pass the door's rule as they stream: a
        # byte that is not UTF-8 is refused here with its line, never accepted and dropped.
        text=Utf8Lines(name) if name.endswith((".json", ".jsonl")) else None,
    )
    # One statement, no transaction of its own: the insert checks the attempt itself.
    record = partial(service.record_upload_program, **upload, blob=blob)
    try:
        row, created = await db.run_alone(record, bulk=True)
    except IntegrityError:
        # A concurrent upload of the same name won the race; same answer as a repeat.
        row, created = await db.run_alone(record, bulk=True)
    if not created:
        response.status_code = status.HTTP_200_OK
    return ArtifactReceipt(
        run_id=run_id,
        attempt=attempt,
        name=row.name,
        sha256=row.sha256,
        bytes=row.bytes,
        created=created,
    )
