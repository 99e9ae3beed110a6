"""The embedded default end to end: `coldbench server` and `coldbench celery worker|beat` as
child processes on SQLite and kombu's SQLAlchemy transport, driven over HTTP."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.factories import (
    fingerprint,
    job_payload,
    manifest_for,
    provenance_json,
    records_jsonl,
)
from tests.stack import running_stack

pytestmark = pytest.mark.slow


def test_embedded_default_from_submit_to_evidence(tmp_path: Path) -> None:
    with running_stack(tmp_path, database="sqlite", server=False, api_key=None) as stack:
        enrollment = stack.cli("admin", "enroll", "--labels", "lab:test")
        key = stack.cli("admin", "apikey", "tester")
        stack.start_server()
        stack.start_celery("worker")
        stack.start_beat()
        with httpx.Client(base_url=stack.url, timeout=30) as http:
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
                assert time.monotonic() < deadline, stack.log("worker")
                time.sleep(0.5)
            assert detail["runs"][0]["state"] == "processed"
            report = http.get(detail["evidence_url"])
            assert report.status_code == 200 and "text/html" in report.headers["content-type"]
            assert http.get(detail["evidence_url"] + ".md").status_code == 200
            assert "coldbench_runs" in http.get("/metrics").text
        assert (tmp_path / ".coldbench" / "broker.db").is_file()
        assert "beat: Starting" in stack.log("beat", tail=100_000)
