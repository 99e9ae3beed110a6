"""Two API processes against one PostgreSQL database, one Redis broker and one S3 store (the
moto S3 server as a process): what one replica accepts, the other serves."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import S3Server
from tests.api.factories import fingerprint, job_payload
from tests.api.test_endpoints import complete, upload_run
from tests.stack import running_stack, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def test_job_submitted_on_one_replica_is_leased_completed_and_served_by_both(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    with running_stack(
        tmp_path,
        broker=True,
        server=False,
        api_key=None,
        settings={
            "COLDBENCH_ARTIFACT_URL": f"s3://{bucket}/coldbench",
            # Longer than the test's patience: only a notification from the other replica can
            # end the long-poll in time.
            "COLDBENCH_LEASE_POLL_S": "30",
            # Replicas behind one proxy share the secret that signs browser sessions.
            "COLDBENCH_WEB_SECRET": "replicas-share-this-secret",
            **s3_server.env,
        },
    ) as running:
        api_a, api_b = running.start_servers("api-a", "api-b")
        running.start_celery()
        key = running.cli("admin", "apikey", "replicas")
        token = running.cli("admin", "enroll")
        with api_b.client(token) as client:
            registered = client.post(
                "/api/v1/workers/register",
                json={"name": "host-1", "fingerprint": fingerprint(), "models": ["tiny-model"]},
            )
        assert registered.status_code == 201, registered.text
        secret = registered.json()["secret"]

        # A long-poll on replica B, woken by a submission on replica A (LISTEN/NOTIFY).
        waited: dict[str, Any] = {}

        def long_poll() -> None:
            with api_b.client(secret) as client:
                started = time.monotonic()
                waited["response"] = client.post(
                    "/api/v1/leases",
                    json={"fingerprint": fingerprint(), "wait_s": 20},
                )
                waited["s"] = time.monotonic() - started

        poller = threading.Thread(target=long_poll)
        poller.start()
        time.sleep(1.0)
        with api_a.client(key) as client:
            created = client.post("/api/v1/jobs", json=job_payload(model="tiny-model"))
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        poller.join(30)
        lease = waited["response"]
        assert lease.status_code == 200, lease.text
        assert lease.json()["job_id"] == job_id and waited["s"] < 10
        run_id = lease.json()["run_id"]

        with api_b.client(secret) as client:
            manifest = upload_run(client, secret, run_id)
            assert complete(client, secret, run_id, manifest).status_code == 200

        def evidence_id() -> str | None:
            with api_a.client(key) as client:
                return client.get(f"/api/v1/jobs/{job_id}").json()["evidence_id"]

        evidence = wait_until(evidence_id, 120, "the evidence (ingest, analysis, rendering)")
        served = {}
        for api in (api_a, api_b):
            with api.client() as client:
                # The proxy in front of both replicas passes on the one public host name, which
                # the PR Markdown's link to the evidence page is made of.
                client.headers["Host"] = "coldbench.test"
                for suffix in (".json", ".zip", ".md", ""):
                    response = client.get(f"/e/{evidence}{suffix}")
                    assert response.status_code == 200, (api.name, suffix, response.text[:300])
                    served[api.name, suffix] = response.content
        for suffix in (".json", ".zip", ".md"):
            assert served["api-a", suffix] == served["api-b", suffix]
        assert b"base" in served["api-a", ".json"]
        assert f"(http://coldbench.test/e/{evidence})".encode() in served["api-a", ".md"]

    # Everything lives in the bucket, under the prefix, by digest; nothing on local disk.
    keys = [
        item["Key"]
        for item in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    ]
    assert keys and all(k.startswith("coldbench/") for k in keys)
    assert len(keys) >= 3 + 5  # the run's three uploads and the rendered bundle's files
    assert not (tmp_path / "artifacts").exists()
