"""With Redis unreachable, a completion is committed and answered at once; the beat task's
reprocessing sends its ingest later. And an upload cut by a killed server leaves only a
temporary file that the sweep removes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.artifacts.store import SPILL_BYTES, LocalArtifactStore
from coldbench.api.celery_app import make_celery
from coldbench.api.runs import ingest
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import bearer
from tests.api.factories import (
    fingerprint,
    make_host,
    make_job,
    manifest_for,
    provenance_json,
    records_jsonl,
)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_completion_does_not_wait_for_an_unreachable_broker(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import coldbench.api.celery_app

    down = make_celery(Settings(redis_url=f"redis://127.0.0.1:{_closed_port()}/0"))
    monkeypatch.setattr(coldbench.api.celery_app, "celery_app", down)
    _, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = client.post(
        "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 0}, headers=bearer(secret)
    ).json()["run_id"]
    files = {"records.jsonl": records_jsonl(run_id), "provenance.json": provenance_json(run_id)}
    for name, content in files.items():
        stored = client.put(
            f"/api/v1/runs/{run_id}/artifacts/{name}?attempt=1",
            content=content,
            headers={**bearer(secret), "X-Content-SHA256": sha256_hex(content)},
        )
        assert stored.status_code == 201
    with dispatch.use_sender(dispatch._celery_sender):  # the real sender, to the dead broker
        dispatch.send_task("warm_up")  # imports and connection pools, not what is measured
        started = time.monotonic()
        done = client.post(
            f"/api/v1/runs/{run_id}/complete",
            json={"attempt": 1, "status": "succeeded", "manifest": manifest_for(files)},
            headers=bearer(secret),
        )
        waited = time.monotonic() - started
    assert done.status_code == 200, done.text
    assert waited < 5.0, f"completion waited {waited:.1f} s for the broker"
    run = db_session.get(Run, run_id)
    db_session.refresh(run)
    assert run.state == "completed"
    # What the beat task `reprocess_unprocessed` sends again once the broker is back.
    assert run_id in ingest.unprocessed_run_ids(db_session=db_session)


class _SilentBroker:
    """A TCP server that accepts connections and never answers (a hung Redis)."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                self.held.append(self.server.accept()[0])

    def close(self) -> None:
        self.server.close()
        for connection in self.held:
            connection.close()


def test_completion_waits_about_a_second_for_a_broker_that_never_answers(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis accepting connections but not answering costs a completion its socket timeout
    (1 s, BROKER_TIMEOUT_S), not 5 s; the run is committed and reprocessed later."""
    import coldbench.api.celery_app

    broker = _SilentBroker()
    try:
        hung = make_celery(Settings(redis_url=f"redis://127.0.0.1:{broker.port}/0"))
        monkeypatch.setattr(coldbench.api.celery_app, "celery_app", hung)
        _, secret = make_host(db_session, "studio-1")
        make_job(db_session, settings)
        run_id = client.post(
            "/api/v1/leases",
            json={"fingerprint": fingerprint(), "wait_s": 0},
            headers=bearer(secret),
        ).json()["run_id"]
        files = {"records.jsonl": records_jsonl(run_id), "provenance.json": provenance_json(run_id)}
        for name, content in files.items():
            client.put(
                f"/api/v1/runs/{run_id}/artifacts/{name}?attempt=1",
                content=content,
                headers={**bearer(secret), "X-Content-SHA256": sha256_hex(content)},
            )
        with dispatch.use_sender(dispatch._celery_sender):
            dispatch.send_task("warm_up")  # imports and the first connection
            started = time.monotonic()
            done = client.post(
                f"/api/v1/runs/{run_id}/complete",
                json={"attempt": 1, "status": "succeeded", "manifest": manifest_for(files)},
                headers=bearer(secret),
            )
            waited = time.monotonic() - started
    finally:
        broker.close()
    assert done.status_code == 200, done.text
    assert waited < 3.0, f"completion waited {waited:.1f} s for a broker that never answers"
    assert run_id in ingest.unprocessed_run_ids(db_session=db_session)


def test_upload_cut_by_a_killed_server_is_swept(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    # A real process streams an upload into the store and is killed mid-body.
    script = (
        "import sys, time\n"
        "from coldbench.api.artifacts.store import SPILL_BYTES, LocalArtifactStore\n"
        "def chunks():\n"
        "    yield b'x' * SPILL_BYTES\n"
        "    print('streaming', flush=True)\n"
        "    time.sleep(60)\n"
        "    yield b'y'\n"
        f"LocalArtifactStore({str(root)!r}).put_chunks(chunks(), max_bytes=1 << 30)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "streaming"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    store = LocalArtifactStore(root)
    (left,) = list(store.tmp_dir.iterdir())
    assert left.stat().st_size == SPILL_BYTES  # held in memory until then, then written
    in_flight = store.tmp_dir / "upload-in-flight"
    in_flight.write_bytes(b"another upload, still streaming")
    assert store.sweep_temporary(older_than_s=3600) == []  # both too young to be abandoned
    old = time.time() - 7200
    os.utime(left, (old, old))
    assert store.sweep_temporary(older_than_s=3600) == [left.name]
    assert list(store.tmp_dir.iterdir()) == [in_flight]
    assert not [p for p in root.rglob("*") if p.is_file() and p.parent != store.tmp_dir]


def _abandoned(store: LocalArtifactStore) -> Path:
    store.tmp_dir.mkdir(parents=True, exist_ok=True)
    path = store.tmp_dir / "upload-abandoned"
    path.write_bytes(b"half an upload")
    old = time.time() - 2 * 3600
    os.utime(path, (old, old))
    return path


def test_server_start_and_the_beat_task_sweep_abandoned_uploads(
    settings: Settings, db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextlib import contextmanager

    from coldbench.api import tasks
    from coldbench.api.app import create_app

    store = LocalArtifactStore(settings.artifact_dir)
    path = _abandoned(store)
    with TestClient(create_app(settings)):
        assert not path.exists()

    path = _abandoned(store)

    @contextmanager
    def session():  # type: ignore[no-untyped-def]
        yield db_session

    monkeypatch.setattr(tasks, "_session", session)
    monkeypatch.setattr(tasks, "_settings", lambda: settings)
    monkeypatch.setattr(tasks, "_store", lambda: store)
    with dispatch.use_sender(lambda _name, _args: None):
        tasks.reprocess_unprocessed()
    assert not path.exists()
