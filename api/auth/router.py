"""Admin endpoints: the HTTP twins of `coldbench admin enroll` and `coldbench admin apikey`."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.auth import service
from api.auth.schemas import ApiKeyRequest, ApiKeyResponse, EnrollmentRequest, EnrollmentResponse
from api.deps import AdminKey, SessionDep

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post("/enrollments", status_code=status.HTTP_201_CREATED, response_model=EnrollmentResponse)
def create_enrollment(body: EnrollmentRequest, db_session: SessionDep, _admin: AdminKey):
    """A one-use enrollment token for one host (shown once)."""
    token = service.create_enrollment_token(db_session=db_session, labels=body.labels)
    return EnrollmentResponse(token=token)


@router.post("/apikeys", status_code=status.HTTP_201_CREATED, response_model=ApiKeyResponse)
def create_api_key(body: ApiKeyRequest, db_session: SessionDep, _admin: AdminKey):
    """A submitter API key (shown once)."""
    return ApiKeyResponse(key=service.create_api_key(db_session=db_session, name=body.name))
