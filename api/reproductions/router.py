"""`POST /api/v1/evidence/{id}/reproductions`: a host uploads its reproduction's bundle zip."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response, status
from starlette.concurrency import run_in_threadpool

from coldbench.api import dispatch
from coldbench.api.artifacts.service import validate_upload_request
from coldbench.api.deps import CurrentWorker, SessionDep, SettingsDep, StoreDep
from coldbench.api.evidence import service as evidence_service
from coldbench.api.reproductions import service
from coldbench.api.routing import StrictJSONRoute
from coldbench.evidence.contract.protocol import CONTENT_SHA256_HEADER, ReproductionAccepted

router = APIRouter(route_class=StrictJSONRoute, tags=["evidence"])


@router.post(
    "/evidence/{evidence_id}/reproductions",
    response_model=ReproductionAccepted,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "this host already uploaded this bundle"}},
)
async def upload_reproduction(
    evidence_id: str,
    request: Request,
    response: Response,
    db_session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    host: CurrentWorker,
    x_content_sha256: Annotated[str | None, Header(alias=CONTENT_SHA256_HEADER)] = None,
):
    # The token (CurrentWorker), the digest header and the evidence are checked before the
    # body is read.
    expected = validate_upload_request("bundle.zip", x_content_sha256)
    await run_in_threadpool(
        evidence_service.get_evidence, db_session=db_session, evidence_id=evidence_id
    )
    # Spooled to a temporary file as the artifacts are (hashed and counted as it streams),
    # never held whole in memory while it arrives; stored only once its checks pass.
    async with store.spooled(
        request.stream(), expected_sha256=expected, max_bytes=settings.max_artifact_bytes
    ) as bundle_path:
        added = await run_in_threadpool(
            service.add_reproduction,
            db_session=db_session,
            store=store,
            host=host,
            evidence_id=evidence_id,
            bundle_path=bundle_path,
        )
    # After the commit: each pull request whose comment shows this evidence is answered again
    # (marked due in the same commit, so the beat sends what a lost task leaves undone).
    for pull_request_id in added.pull_request_ids:
        dispatch.send_task("github_answer_pull_request", pull_request_id)
    row, created = added.row, added.created
    comparison = await run_in_threadpool(
        service.host_comparison, db_session=db_session, store=store, evidence_id=evidence_id
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    from coldbench.evidence.bundles.compare import comparison_lines

    return ReproductionAccepted(
        evidence_id=evidence_id,
        reproduction_id=row.id,
        host=host.name,
        created=created,
        lines=comparison_lines(comparison) if comparison is not None else [],
    )
