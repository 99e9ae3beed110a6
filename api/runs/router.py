"""Leases (long-poll) and run completion."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import CurrentWorker, SessionDep, SettingsDep
from api.runs import service
from evidence.protocol import CompleteRequest, CompleteResponse, Lease, LeaseRequest

router = APIRouter(tags=["runs"])


@router.post(
    "/leases",
    response_model=Lease,
    responses={204: {"description": "nothing fitting this host arrived within wait_s"}},
)
def claim_lease(
    body: LeaseRequest, db_session: SessionDep, settings: SettingsDep, host: CurrentWorker
):
    lease = service.claim_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        fingerprint=body.fingerprint.model_dump(mode="json"),
        labels=body.labels,
        wait_s=body.wait_s,
        repositories=body.repositories,
        models=body.models,
    )
    if lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return lease


@router.post("/runs/{run_id}/complete", response_model=CompleteResponse)
def complete(run_id: str, body: CompleteRequest, db_session: SessionDep, host: CurrentWorker):
    run = service.complete_run(
        db_session=db_session,
        host=host,
        run_id=run_id,
        attempt=body.attempt,
        status=body.status,
        reason=body.reason,
        manifest=body.manifest,
    )
    return CompleteResponse(run_id=run.id, attempt=run.attempt, state=run.state)
