"""Leases (long-poll) and run completion."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request, Response, status
from starlette.concurrency import run_in_threadpool

from coldbench.api.deps import DatabaseDep, SettingsDep, WorkerClaim
from coldbench.api.routing import StrictJSONRoute
from coldbench.api.runs import claim, completion
from coldbench.evidence.contract.protocol import (
    CompleteRequest,
    CompleteResponse,
    Lease,
    LeaseRequest,
)

router = APIRouter(route_class=StrictJSONRoute, tags=["runs"])


@router.post(
    "/leases",
    response_model=Lease,
    responses={204: {"description": "nothing fitting this host arrived within wait_s"}},
)
async def claim_lease(
    body: LeaseRequest,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    worker: WorkerClaim,
):
    # The long-poll waits on the event loop for a notification, holding no thread and no
    # database connection. Each claim joins the claims of concurrent requests in one
    # transaction, which also authenticates the token on the host's row it locks.
    lease = await claim.wait_for_lease(
        db=db,
        request=claim.ClaimRequest(
            host_id=worker.id,
            report=claim.HostReport(
                fingerprint=body.fingerprint.model_dump(mode="json"),
                repositories=body.repositories,
                models=body.models,
            ),
            settings=settings,
            dialect=db.dialect_name,
            token=worker.token,
        ),
        signal=request.app.state.work_signal,
        wait_s=body.wait_s,
        gone=request.is_disconnected,
    )
    if lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return lease


@router.post("/runs/{run_id}/complete", response_model=CompleteResponse)
async def complete(run_id: str, body: CompleteRequest, db: DatabaseDep, worker: WorkerClaim):
    arguments = {
        "host_id": worker.id,
        "run_id": run_id,
        "attempt": body.attempt,
        "status": body.status,
        "reason": body.reason,
        "manifest": body.manifest,
    }
    # The token is checked in the completion's own transaction, before it reads the run.
    written = await db.run(
        partial(
            completion.complete_program, **arguments, dialect=db.dialect_name, token=worker.token
        ),
        bulk=True,
    )
    if isinstance(written, completion.CompletionWritten):
        # Sending to Celery is blocking network I/O: not on the event loop.
        await run_in_threadpool(completion.send_completion_tasks, written)
        done = written.completed
    else:
        done = await db.run_with_session(
            lambda db_session: completion.complete_late(db_session=db_session, **arguments)
        )
    return CompleteResponse(run_id=done.run_id, attempt=done.attempt, state=done.state)
