"""Leases (long-poll) and run completion."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from api.deps import CurrentWorker, CurrentWorkerId, SessionDep, SettingsDep
from api.routing import StrictJSONRoute
from api.runs import service
from evidence.protocol import CompleteRequest, CompleteResponse, Lease, LeaseRequest

router = APIRouter(route_class=StrictJSONRoute, tags=["runs"])


@router.post(
    "/leases",
    response_model=Lease,
    responses={204: {"description": "nothing fitting this host arrived within wait_s"}},
)
async def claim_lease(
    body: LeaseRequest,
    request: Request,
    db_session: SessionDep,
    settings: SettingsDep,
    host: CurrentWorker,
):
    # Async: the long-poll waits on the event loop for a notification, holding no thread and
    # no database connection; each claim runs in the thread pool.
    lease = await service.wait_for_lease(
        db_session=db_session,
        settings=settings,
        host=host,
        signal=request.app.state.work_signal,
        report=service.HostReport(
            fingerprint=body.fingerprint.model_dump(mode="json"),
            repositories=body.repositories,
            models=body.models,
        ),
        wait_s=body.wait_s,
        gone=request.is_disconnected,
    )
    if lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return lease


@router.post("/runs/{run_id}/complete", response_model=CompleteResponse)
def complete(run_id: str, body: CompleteRequest, db_session: SessionDep, host_id: CurrentWorkerId):
    done = service.complete_run(
        db_session=db_session,
        host_id=host_id,
        run_id=run_id,
        attempt=body.attempt,
        status=body.status,
        reason=body.reason,
        manifest=body.manifest,
    )
    return CompleteResponse(run_id=done.run_id, attempt=done.attempt, state=done.state)
