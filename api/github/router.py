"""The webhook GitHub delivers pull-request events to: checked, recorded once, answered later.

The signature is checked before the body is parsed; the delivery is stored by its id (a
redelivery is answered 200 and does nothing) and handed to Celery after the commit.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from coldbench.api import dispatch
from coldbench.api.deps import CurrentSubmitter, DatabaseDep, SessionDep, SettingsDep
from coldbench.api.errors import NotFound
from coldbench.api.github import service
from coldbench.api.github.config import GitHubConfig
from coldbench.api.github.events import verify_delivery
from coldbench.api.github.schemas import PullRequestAsk
from coldbench.api.jobs import service as jobs_service
from coldbench.api.jobs.schemas import JobOut

router = APIRouter(tags=["github"])


@router.post("/github/webhook", status_code=status.HTTP_202_ACCEPTED)
async def webhook(request: Request, response: Response, db: DatabaseDep) -> dict[str, str]:
    config = _config(request)
    headers = {key.lower(): value for key, value in request.headers.items()}
    delivery = verify_delivery(config, headers, await request.body())
    if delivery.repository is None:
        # A GitHub App's `ping`, `installation.created`, ...: answered, nothing stored.
        response.status_code = status.HTTP_200_OK
        return {"delivery": delivery.delivery_id, "outcome": "nothing to do"}
    is_new, facts = await db.run_with_session(
        lambda db_session: service.record_delivery(db_session=db_session, delivery=delivery)
    )
    if not is_new:
        response.status_code = status.HTTP_200_OK
        return {"delivery": delivery.delivery_id, "outcome": "already received"}
    if facts is None:
        response.status_code = status.HTTP_200_OK
        return {"delivery": delivery.delivery_id, "outcome": "nothing to do"}
    dispatch.send_task("github_handle_delivery", delivery.delivery_id)
    return {"delivery": delivery.delivery_id, "outcome": "accepted"}


@router.post("/github/pulls", status_code=status.HTTP_201_CREATED, response_model=JobOut)
async def ask_for_pull_request(
    asked: PullRequestAsk,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    submitter: CurrentSubmitter,
    db_session: SessionDep,
):
    """A job on a pull request's base and head commits now (`coldbench submit --pr`), answered
    on the pull request like a `/coldbench` comment."""
    job, pull_request_id = await service.ask_for_pull_request(
        db=db,
        settings=settings,
        config=_config(request),
        asked=asked,
        asked_by=f"API key {submitter.name}",
    )
    dispatch.send_task("github_answer_pull_request", pull_request_id)
    return jobs_service.job_detail(db_session=db_session, job_id=job.id)


def _config(request: Request) -> GitHubConfig:
    config: GitHubConfig | None = request.app.state.github
    if config is None:
        raise NotFound("the GitHub integration is not configured (COLDBENCH_GITHUB_CONFIG)")
    return config
