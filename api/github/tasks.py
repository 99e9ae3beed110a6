"""Celery tasks of the GitHub integration: act on a delivery, answer a pull request, and the
beat's catch-up of what a lost task left undone. Each is idempotent."""

from __future__ import annotations

import logging
from functools import lru_cache

from coldbench.api import dispatch
from coldbench.api.celery_app import celery_app
from coldbench.api.github import answer, service
from coldbench.api.github.config import GitHubConfig, load_github_config
from coldbench.api.tasks import TASK_OPTIONS, _session, _settings, _store

log = logging.getLogger(__name__)

# A delivery not handled this long after it arrived lost its task: the beat sends it again.
DELIVERY_RETRY_AFTER_S = 60.0


@lru_cache
def _config() -> GitHubConfig | None:
    path = _settings().github_config
    return load_github_config(path) if path else None


@celery_app.task(name="coldbench.github_handle_delivery", **TASK_OPTIONS)
def github_handle_delivery(delivery_id: str) -> None:
    config = _config()
    if config is None:
        return
    with _session() as db_session:
        pull_request_id = service.handle_delivery(
            db_session=db_session, settings=_settings(), config=config, delivery_id=delivery_id
        )
    if pull_request_id is not None:
        dispatch.send_task("github_answer_pull_request", pull_request_id)


@celery_app.task(name="coldbench.github_answer_pull_request", **TASK_OPTIONS)
def github_answer_pull_request(pull_request_id: int) -> None:
    config = _config()
    if config is None:
        return
    with _session() as db_session:
        answer.answer_pull_request(
            db_session=db_session, config=config, store=_store(), pull_request_id=pull_request_id
        )


@celery_app.task(name="coldbench.github_catch_up", **TASK_OPTIONS)
def github_catch_up() -> None:
    """Beat: deliveries whose task was lost, and pull requests whose answer is behind."""
    if _config() is None:
        return
    with _session() as db_session:
        deliveries = service.unhandled_delivery_ids(
            db_session=db_session, older_than_s=DELIVERY_RETRY_AFTER_S
        )
        pulls = answer.unanswered_pull_request_ids(db_session=db_session)
    for delivery_id in deliveries:
        dispatch.send_task("github_handle_delivery", delivery_id)
    for pull_request_id in pulls:
        dispatch.send_task("github_answer_pull_request", pull_request_id)
