"""The one Celery app: Redis when COLDBENCH_REDIS_URL is set, else kombu's SQLAlchemy transport
on `.coldbench/broker.db` with a SQLite result backend (the embedded default).

Every task acknowledges late and is rejected back to the queue when its worker dies, so a task
interrupted by a crash runs again; the tasks themselves are idempotent.
"""

from __future__ import annotations

from celery import Celery

from coldbench.api.settings import Settings, get_settings

# Connecting to the broker and waiting for its answer: a loopback or LAN Redis answers in
# milliseconds, and a request that sends a task after its commit waits at most this long for a
# Redis that is gone or hung (beat sends the task again later).
BROKER_TIMEOUT_S = 1.0


def make_celery(settings: Settings) -> Celery:
    if not settings.redis_url:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
    app = Celery("coldbench", broker=settings.broker_url, backend=settings.result_backend_url)
    visibility_s = settings.celery_visibility_timeout_s
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        beat_schedule={
            "expire-leases": {
                "task": "coldbench.expire_leases",
                "schedule": settings.beat_expire_leases_s,
            },
            "reprocess-unprocessed": {
                "task": "coldbench.reprocess_unprocessed",
                "schedule": settings.beat_reprocess_s,
            },
            "github-catch-up": {
                "task": "coldbench.github_catch_up",
                "schedule": settings.beat_reprocess_s,
            },
        },
        include=["coldbench.api.tasks", "coldbench.api.github.tasks"],
        # A request that completes a run sends its task after the commit: with the broker
        # unreachable it must fail fast (the beat task `reprocess_unprocessed` sends the task
        # again later), not hold the request for 20 s of reconnect attempts.
        broker_connection_timeout=BROKER_TIMEOUT_S,
        task_publish_retry_policy={
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
    )
    if settings.redis_url:
        app.conf.broker_transport_options = {
            "socket_connect_timeout": BROKER_TIMEOUT_S,
            "socket_timeout": BROKER_TIMEOUT_S,
            # An unacknowledged task (its worker was killed) is delivered again after this.
            "visibility_timeout": visibility_s,
            # Look for such tasks often enough that a short timeout is honoured.
            "unacked_restore_interval": max(1, min(10, visibility_s // 2)),
            "unacked_restore_throttle": 1,
        }
        if settings.celery_key_prefix:
            app.conf.broker_transport_options["global_keyprefix"] = settings.celery_key_prefix
    return app


celery_app = make_celery(get_settings())
