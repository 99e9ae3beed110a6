"""Submitter endpoints: create, list, read and cancel jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, status

from coldbench.api.deps import (
    CurrentSubmitter,
    DatabaseDep,
    SessionDep,
    SettingsDep,
    SubmitterClaim,
)
from coldbench.api.jobs import service
from coldbench.api.jobs.schemas import JobListItem, JobOut
from coldbench.api.routing import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute, tags=["jobs"])


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobOut)
async def create_job(
    db: DatabaseDep,
    settings: SettingsDep,
    submitter: SubmitterClaim,
    payload: dict[str, Any] = Body(
        ...,
        description="a coldbench.job/1 JobRequest: `until` defaults to `decided` (measure "
        "until every prefill comparison is decided); `rounds` left out, the service sets the "
        "job's default (4 first looks of 10 process blocks, 40 rounds; with until=rounds, 10) "
        "and, measuring until decided without `budget_minutes`, its default_budget_minutes",
    ),
):
    # Joins the submissions of concurrent requests in one transaction (a group commit), which
    # also checks each request's API key.
    submission = service.Submission(
        settings, payload, submitter.id, dialect=db.dialect_name, token=submitter.token
    )
    submitted = await db.run_grouped(service.submit_group_program, submission)
    if isinstance(submitted, service.Submitted):
        return service.submitted_out(submitted.job, submitted.runs, [], notice=submitted.notice)
    job, runs, steps = await db.run_with_session(
        lambda db_session: service.create_bisection(
            db_session=db_session, spec=submitted.spec, submitted_by=submitter.id
        )
    )
    return service.submitted_out(job, runs, steps)


@router.get("/jobs", response_model=list[JobListItem])
def list_jobs(
    db_session: SessionDep,
    _submitter: CurrentSubmitter,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[str | None, Query(max_length=32, pattern=r"^[0-9a-f]+$")] = None,
):
    """Newest first; pass the last id of a page as `before` for the next one."""
    return service.list_job_items(db_session=db_session, limit=limit, before=before)


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(
    job_id: str, db_session: SessionDep, settings: SettingsDep, _submitter: CurrentSubmitter
):
    return service.job_detail(db_session=db_session, job_id=job_id, settings=settings)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: str, db_session: SessionDep, submitter: CurrentSubmitter):
    service.cancel_job(db_session=db_session, job_id=job_id, submitted_by=submitter.id)
    return service.job_detail(db_session=db_session, job_id=job_id)
