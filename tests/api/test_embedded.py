"""The embedded default end to end: `coldbench server` and `coldbench celery worker|beat` as
child processes on SQLite and kombu's SQLAlchemy transport, driven over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from evidence.canonical import sha256_hex
from tests.api.factories import (
    fingerprint,
    job_payload,
    manifest_for,
    provenance_json,
    records_jsonl,
)

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_embedded_default_from_submit_to_evidence(tmp_path: Path, coldbench_cmd: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}

    def admin(*args: str) -> str:
        done = subprocess.run(
            [*coldbench_cmd, "admin", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    enrollment = admin("enroll", "--labels", "lab:test")
    key = admin("apikey", "tester")
    port = _free_port()
    children = []
    logs = []
    for name, args in (
        ("server", ["server", "--port", str(port)]),
        ("worker", ["celery", "worker", "--pool", "solo"]),
        ("beat", ["celery", "beat"]),
    ):
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
        logs.append(log)
        children.append(
            subprocess.Popen(
                [*coldbench_cmd, *args],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.3)
            registered = http.post(
                "/api/v1/workers/register",
                json={
                    "name": "local",
                    "fingerprint": fingerprint(),
                    "labels": [],
                    "repositories": {},
                    "models": ["preset:tiny"],
                },
                headers={"Authorization": f"Bearer {enrollment}"},
            )
            assert registered.status_code == 201, registered.text
            worker = {"Authorization": f"Bearer {registered.json()['secret']}"}
            submitter = {"Authorization": f"Bearer {key}"}
            job = http.post("/api/v1/jobs", json=job_payload(), headers=submitter).json()
            leased = http.post(
                "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 5}, headers=worker
            ).json()
            assert leased["job_id"] == job["id"]
            run_id = leased["run_id"]
            files = {
                "records.jsonl": records_jsonl(run_id),
                "provenance.json": provenance_json(run_id),
            }
            for name, content in files.items():
                stored = http.put(
                    f"/api/v1/runs/{run_id}/artifacts/{name}",
                    params={"attempt": 1},
                    content=content,
                    headers={**worker, "X-Content-SHA256": sha256_hex(content)},
                )
                assert stored.status_code == 201, stored.text
            done = http.post(
                f"/api/v1/runs/{run_id}/complete",
                json={"attempt": 1, "status": "succeeded", "manifest": manifest_for(files)},
                headers=worker,
            )
            assert done.status_code == 200, done.text
            deadline = time.monotonic() + 90
            while (detail := http.get(f"/api/v1/jobs/{job['id']}", headers=submitter).json())[
                "state"
            ] != "done":
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(0.5)
            assert detail["runs"][0]["state"] == "processed"
            report = http.get(detail["evidence_url"])
            assert report.status_code == 200 and "text/html" in report.headers["content-type"]
            assert http.get(detail["evidence_url"] + ".md").status_code == 200
            assert "coldbench_runs" in http.get("/metrics").text
        assert (tmp_path / ".coldbench" / "broker.db").is_file()
        assert "beat: Starting" in (tmp_path / "beat.log").read_text()
    finally:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(5)
        for log in logs:
            log.close()
