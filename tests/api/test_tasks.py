"""Celery tasks run by real Celery worker processes against real Redis (db 15) and PostgreSQL."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from coldbench.api import dispatch
from coldbench.api.app import create_app
from coldbench.api.celery_app import make_celery
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Cell, Run
from coldbench.api.settings import Settings
from tests.api.factories import make_host, make_job
from tests.api.test_endpoints import complete, lease, upload_run
from tests.conftest import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

VISIBILITY_TIMEOUT_S = 3


class CeleryWorker:
    """`coldbench celery worker` as a child process in its own process group."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coldbench", "celery", "worker", "--pool", "solo"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no chance to acknowledge or requeue anything."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.log.close()


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Pipeline:
    client: TestClient
    settings: Settings
    sessionmaker: Any
    env: dict[str, str]
    tmp_path: Path
    workers: list[CeleryWorker]

    def start_worker(self, **env: str) -> CeleryWorker:
        log_path = self.tmp_path / f"celery-{len(self.workers)}.log"
        worker = CeleryWorker({**self.env, **env}, log_path)
        self.workers.append(worker)
        return worker

    def finished_run(self, name: str = "a") -> str:
        """A run leased, uploaded and completed through the HTTP API; returns its id."""
        with self.sessionmaker() as db_session:
            _, secret = make_host(db_session, name)
            make_job(db_session, self.settings, rounds=2)
        run_id = lease(self.client, secret).json()["run_id"]
        manifest = upload_run(self.client, secret, run_id)
        assert complete(self.client, secret, run_id, manifest).status_code == 200
        return run_id

    def run_state(self, run_id: str) -> str:
        with self.sessionmaker() as db_session:
            return db_session.get(Run, run_id).state

    def evidence_id(self, run_id: str) -> str | None:
        with self.sessionmaker() as db_session:
            return db_session.scalar(
                sa.select(Job.evidence_id).join(Run, Run.job_id == Job.id).where(Run.id == run_id)
            )

    def cell_count(self, run_id: str) -> int:
        with self.sessionmaker() as db_session:
            return db_session.scalar(sa.select(sa.func.count()).where(Cell.run_id == run_id))


@pytest.fixture
def pipeline(live_db: str, live_sessionmaker: Any, tmp_path: Path) -> Iterator[Pipeline]:
    # Several test sessions may share Redis db 15 at once: this test's keys carry its prefix,
    # and only those are cleared.
    prefix = f"coldbench-test-{secrets.token_hex(4)}:"
    broker = redis.Redis.from_url(REDIS_URL)
    settings = Settings(
        database_url=live_db,
        redis_url=REDIS_URL,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        celery_visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        celery_key_prefix=prefix,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
    env.update(
        COLDBENCH_DATABASE_URL=live_db,
        COLDBENCH_REDIS_URL=REDIS_URL,
        COLDBENCH_ARTIFACT_DIR=str(settings.artifact_dir),
        COLDBENCH_STATE_DIR=str(settings.state_dir),
        COLDBENCH_CELERY_VISIBILITY_TIMEOUT_S=str(VISIBILITY_TIMEOUT_S),
        COLDBENCH_CELERY_KEY_PREFIX=prefix,
    )
    sender = make_celery(settings)

    def send(name: str, args: tuple[object, ...]) -> None:
        sender.send_task(dispatch.TASK_PREFIX + name, args=args)

    app = create_app(settings)
    workers: list[CeleryWorker] = []
    try:
        with dispatch.use_sender(send), TestClient(app) as client:
            yield Pipeline(client, settings, live_sessionmaker, env, tmp_path, workers)
    finally:
        for worker in workers:
            worker.stop()
        app.state.engine.dispose()
        keys = list(broker.scan_iter(match=f"{prefix}*"))
        if keys:
            broker.delete(*keys)
        broker.close()


def test_upload_stored_without_a_worker_is_ingested_once_one_starts(pipeline: Pipeline) -> None:
    run_id = pipeline.finished_run()
    time.sleep(0.5)
    assert pipeline.run_state(run_id) == "completed" and pipeline.cell_count(run_id) == 0
    worker = pipeline.start_worker()
    wait_for(lambda: pipeline.run_state(run_id) == "processed", 60, "the run to be ingested")
    assert pipeline.cell_count(run_id) == 10
    assert "coldbench.ingest_run" in worker.output()
    # The worker goes on: analysis from the raw cells, then the rendered evidence.
    evidence_id = wait_for(lambda: pipeline.evidence_id(run_id), 90, "the evidence")
    summary = pipeline.client.get(f"/e/{evidence_id}.json").json()
    assert summary["baseline"] == "base" and summary["runs"][0]["run_id"] == run_id
    assert pipeline.client.get(f"/e/{evidence_id}.zip").status_code == 200


def test_worker_killed_mid_ingest_redelivers_without_duplicates(pipeline: Pipeline) -> None:
    slow = pipeline.start_worker(
        COLDBENCH_INGEST_BATCH_SIZE="1", COLDBENCH_INGEST_BATCH_PAUSE_S="0.5"
    )
    wait_for(lambda: "ready" in slow.output(), 60, "the first Celery worker to start")
    run_id = pipeline.finished_run()
    wait_for(lambda: pipeline.cell_count(run_id) >= 2, 30, "the ingest to begin")
    slow.kill()
    partial = pipeline.cell_count(run_id)
    assert 2 <= partial < 10 and pipeline.run_state(run_id) == "completed"
    fresh = pipeline.start_worker()
    # The unacknowledged task comes back after the visibility timeout.
    wait_for(lambda: pipeline.run_state(run_id) == "processed", 60, "the redelivered ingest")
    assert "coldbench.ingest_run" in fresh.output()
    with pipeline.sessionmaker() as db_session:
        rows = db_session.execute(
            sa.select(Cell.variant, Cell.round, Cell.context_tokens, Cell.line).where(
                Cell.run_id == run_id
            )
        ).all()
    assert len(rows) == 10 and len({row.line for row in rows}) == 10


def test_a_starting_worker_builds_what_every_report_reuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's worker_init (sent before a prefork pool forks) imports scipy.stats and prepares
    the report's plotly template, inlined plotly.js and templates, so the first job's analysis
    does not pay them."""
    from celery.signals import worker_init

    import coldbench.api.tasks  # noqa: F401 (connects the signal's receivers)
    from coldbench.evidence.analysis import stats
    from coldbench.evidence.rendering import report

    imported: list[object] = []
    scipy_stats = stats._scipy_stats
    monkeypatch.setattr(stats, "_scipy_stats", lambda: imported.append(scipy_stats()))
    cached = (report._template, report._plotly_js_inline, report._environment)
    for function in cached:
        function.cache_clear()
    worker_init.send(sender=None)
    assert [function.cache_info().currsize for function in cached] == [1, 1, 1]
    assert [module.__name__ for module in imported] == ["scipy.stats"]  # type: ignore[attr-defined]
