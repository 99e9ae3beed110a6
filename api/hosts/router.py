"""Worker registration, heartbeat, and the host list."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, status

from coldbench.api.deps import (
    BearerDep,
    CurrentSubmitter,
    CurrentWorker,
    DatabaseDep,
    SessionDep,
    SettingsDep,
    WorkerClaim,
)
from coldbench.api.deps import bearer_token as _bearer_token
from coldbench.api.hosts import matching, service
from coldbench.api.hosts.schemas import HostOut
from coldbench.api.routing import StrictJSONRoute
from coldbench.api.runs import heartbeat as run_heartbeat
from coldbench.evidence.contract.protocol import (
    CalibrationAccepted,
    CalibrationReport,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)

router = APIRouter(route_class=StrictJSONRoute, tags=["hosts"])


@router.post(
    "/workers/register", status_code=status.HTTP_201_CREATED, response_model=RegisterResponse
)
def register(body: RegisterRequest, db_session: SessionDep, credentials: BearerDep):
    """Spend a one-use enrollment token; the secret in the answer is shown only once."""
    host, secret = service.register_host(
        db_session=db_session,
        enrollment_token=_bearer_token(credentials),
        name=body.name,
        fingerprint=body.fingerprint.model_dump(mode="json"),
        labels=body.labels,
        repositories=body.repositories,
        models=body.models,
    )
    return RegisterResponse(worker_id=host.id, secret=secret)


@router.post("/workers/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    body: HeartbeatRequest, db: DatabaseDep, settings: SettingsDep, worker: WorkerClaim
):
    # The token is checked by the heartbeat's own first statement. On PostgreSQL each of its
    # statements stands alone (api/runs/heartbeat.py); elsewhere it is one transaction.
    beat = partial(
        run_heartbeat.heartbeat_program,
        settings=settings,
        host_id=worker.id,
        token=worker.token,
        run_id=body.run_id,
        attempt=body.attempt,
        progress=body.progress.model_dump(mode="json") if body.progress else None,
        dialect=db.dialect_name,
    )
    cancel = await (db.run_alone if db.dialect_name == "postgresql" else db.run)(beat)
    return HeartbeatResponse(cancel=cancel)


@router.put("/workers/calibration", response_model=CalibrationAccepted)
def report_calibration(body: CalibrationReport, db_session: SessionDep, host: CurrentWorker):
    """The host's `coldbench calibrate` result; /hosts shows the latest."""
    service.store_calibration(db_session=db_session, host=host, calibration=body)
    return CalibrationAccepted(host=host.name, lines=service.calibration_lines(host))


@router.get("/hosts", response_model=list[HostOut])
def list_hosts(db_session: SessionDep, settings: SettingsDep, _submitter: CurrentSubmitter):
    return [
        HostOut(
            id=host.id,
            name=host.name,
            labels=host.labels,
            admin_labels=host.enrolled_labels,
            host_labels=host.host_labels,
            auto_labels=matching.auto_labels(host),
            repositories=host.repositories,
            models=host.models,
            fingerprint=host.fingerprint,
            last_heartbeat_at=host.last_heartbeat_at,
            health=service.host_health(host, settings=settings),
            calibration=host.calibration,
        )
        for host in service.list_hosts(db_session=db_session)
    ]
