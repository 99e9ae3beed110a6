"""Admin endpoints: the HTTP twins of `coldbench admin enroll`, `apikey`, `labels` and `revoke`."""

from __future__ import annotations

from fastapi import APIRouter, status

from coldbench.api.auth import service
from coldbench.api.auth.schemas import (
    ApiKeyRequest,
    ApiKeyResponse,
    ApiKeyRevokedResponse,
    EnrollmentRequest,
    EnrollmentResponse,
    HostLabelsResponse,
    HostRevokedResponse,
    LabelsRequest,
)
from coldbench.api.deps import AdminKey, SessionDep, SettingsDep
from coldbench.api.hosts import service as host_service
from coldbench.api.routing import StrictJSONRoute
from coldbench.api.runs import expiry

router = APIRouter(route_class=StrictJSONRoute, prefix="/admin", tags=["admin"])


@router.post("/enrollments", status_code=status.HTTP_201_CREATED, response_model=EnrollmentResponse)
def create_enrollment(body: EnrollmentRequest, db_session: SessionDep, _admin: AdminKey):
    """A one-use enrollment token for one host (shown once)."""
    token = service.create_enrollment_token(db_session=db_session, labels=body.labels)
    return EnrollmentResponse(token=token)


@router.post("/apikeys", status_code=status.HTTP_201_CREATED, response_model=ApiKeyResponse)
def create_api_key(body: ApiKeyRequest, db_session: SessionDep, _admin: AdminKey):
    """A submitter API key (shown once)."""
    return ApiKeyResponse(key=service.create_api_key(db_session=db_session, name=body.name))


@router.post("/apikeys/{key_id}/revoke", response_model=ApiKeyRevokedResponse)
def revoke_api_key(key_id: str, db_session: SessionDep, _admin: AdminKey):
    """Refuse the key from now on (401); idempotent."""
    key = service.revoke_api_key(db_session=db_session, key_or_id=key_id, actor="admin:http")
    assert key.revoked_at is not None
    return ApiKeyRevokedResponse(id=key.id, name=key.name, revoked_at=key.revoked_at)


@router.put("/hosts/{host}/labels", response_model=HostLabelsResponse)
def set_host_labels(host: str, body: LabelsRequest, db_session: SessionDep, _admin: AdminKey):
    """Replace the admin's labels of a host (by name or worker id); the labels the host
    derives itself are kept; `host:`, `backend:`, `os:` are automatic."""
    row = host_service.set_labels(
        db_session=db_session, name_or_id=host, labels=body.labels, actor="admin:http"
    )
    return HostLabelsResponse(
        id=row.id,
        name=row.name,
        labels=row.labels,
        admin_labels=row.enrolled_labels,
        host_labels=row.host_labels,
    )


@router.post("/hosts/{host}/revoke", response_model=HostRevokedResponse)
def revoke_host(host: str, db_session: SessionDep, settings: SettingsDep, _admin: AdminKey):
    """Refuse the host's secret from now on (401) and queue its leased run again."""
    row, runs = expiry.revoke_host(
        db_session=db_session, settings=settings, name_or_id=host, actor="admin:http"
    )
    assert row.revoked_at is not None
    return HostRevokedResponse(
        id=row.id, name=row.name, revoked_at=row.revoked_at, requeued_runs=runs
    )
