"""Submitter endpoints: create, list, read and cancel jobs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, status

from api.deps import CurrentSubmitter, SessionDep, SettingsDep
from api.jobs import service
from api.jobs.schemas import JobListItem, JobOut
from api.routing import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute, tags=["jobs"])


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def create_job(
    db_session: SessionDep,
    settings: SettingsDep,
    submitter: CurrentSubmitter,
    payload: dict[str, Any] = Body(..., description="a coldbench.job/1 JobSpec"),
):
    job = service.create_job(
        db_session=db_session, settings=settings, payload=payload, submitted_by=submitter.id
    )
    return service.job_detail(db_session=db_session, job_id=job.id)


@router.get("/jobs", response_model=list[JobListItem])
def list_jobs(db_session: SessionDep, _submitter: CurrentSubmitter, limit: int = 100):
    return [
        JobListItem(
            id=job.id,
            state=job.state,
            mode=job.spec.get("mode", "ab"),
            created_at=job.created_at,
            evidence_id=job.evidence_id,
        )
        for job in service.list_jobs(db_session=db_session, limit=min(max(limit, 1), 500))
    ]


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: str, db_session: SessionDep, _submitter: CurrentSubmitter):
    return service.job_detail(db_session=db_session, job_id=job_id)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, db_session: SessionDep, submitter: CurrentSubmitter):
    service.cancel_job(db_session=db_session, job_id=job_id, submitted_by=submitter.id)
    return service.job_detail(db_session=db_session, job_id=job_id)
