"""The fault matrix against real processes: `coldbench server`, Celery worker and beat,
PostgreSQL, Redis. Each fault ends with every measured cell stored once: nothing lost, nothing
counted twice (docs/RELIABILITY.md has the table, with the faults covered elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from coldbench.api.artifacts.store import LocalArtifactStore
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.factories import fingerprint, job_payload, manifest_for, provenance_json, record
from tests.api.test_endpoints import complete, upload
from tests.stack import Server, Stack, running_stack, stop_process, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

MEASURED_CELLS = 8  # records_jsonl: 2 variants x 2 contexts x 2 rounds


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("faults"),
        broker=True,
        server=False,
        api_key=None,
        settings={
            "COLDBENCH_BEAT_REPROCESS_S": "2",
            "COLDBENCH_BEAT_EXPIRE_LEASES_S": "1",
            "COLDBENCH_LEASE_SWEEP_S": "1",
            "COLDBENCH_WEB_SECRET": "replicas-share-this-secret",
        },
    ) as started:
        started.start_celery()
        started.start_beat()
        yield started


@pytest.fixture(scope="module")
def api(running: Stack) -> Server:
    return running.start_server("api")


@pytest.fixture(scope="module")
def api_key(running: Stack) -> str:
    return running.cli("admin", "apikey", "faults")


def enroll(running: Stack, server: Server, label: str) -> str:
    """A host enrolled with label `label`, which only this test's jobs ask for."""
    token = running.cli("admin", "enroll", "--labels", label)
    with server.client(token) as client:
        response = client.post(
            "/api/v1/workers/register",
            json={"name": label.replace(":", "-"), "fingerprint": fingerprint(), "models": ["m"]},
        )
    assert response.status_code == 201, response.text
    return str(response.json()["secret"])


def submit_and_lease(server: Server, key: str, secret: str, label: str) -> tuple[str, str]:
    with server.client(key) as client:
        created = client.post("/api/v1/jobs", json=job_payload(model="m", host_labels=[label]))
    assert created.status_code == 201, created.text
    with server.client(secret) as client:
        lease = client.post("/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 10})
    assert lease.status_code == 200, lease.text
    assert lease.json()["job_id"] == created.json()["id"]
    return created.json()["id"], lease.json()["run_id"]


def run_files(run_id: str, *, shift: timedelta = timedelta(0)) -> dict[str, bytes]:
    """records.jsonl (warm-ups and 8 measured cells, timestamps shifted by `shift`) and
    provenance.json."""
    import json

    lines = [record(run_id, v, -1, 16, order=-1, status="warmup") for v in ("base", "cand")]
    order = 0
    for round_ in range(2):
        for context in (64, 128):
            for index, variant in enumerate(("base", "cand")):
                lines.append(
                    record(run_id, variant, round_, context, order=order, prefill_tps=1000 + index)
                )
                order += 1
    for line in lines:
        for key in ("started_at", "ended_at"):
            line[key] = (datetime.fromisoformat(line[key]) + shift).isoformat()
    records = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return {"records.jsonl": records, "provenance.json": provenance_json(run_id)}


def assert_exactly_once(running: Stack, run_id: str, timeout_s: float = 90) -> None:
    """The run is ingested, with each measured cell once (none lost, none twice)."""
    wait_until(
        lambda: running.scalar("select state from runs where id = :r", r=run_id) == "processed",
        timeout_s,
        f"run {run_id} to be processed",
    )
    rows = running.rows(
        "select variant, round, context_tokens from cells where run_id = :r and status = 'ok'",
        r=run_id,
    )
    assert len(rows) == len(set(rows)) == MEASURED_CELLS


def upload_all(server: Server, secret: str, run_id: str, files: dict[str, bytes]) -> None:
    with server.client(secret) as client:
        for name, content in files.items():
            response = upload(client, secret, run_id, name, content)
            assert response.status_code in (200, 201), response.text


def test_server_killed_mid_upload_publishes_nothing_partial(
    running: Stack, api: Server, api_key: str
) -> None:
    secret = enroll(running, api, "fault:upload-kill")
    _, run_id = submit_and_lease(api, api_key, secret, "fault:upload-kill")
    files = run_files(run_id)
    big = b"build output line\n" * 120_000  # about 2 MiB, sent slowly
    files["build-base.log"] = big

    def slow_body() -> Iterator[bytes]:
        for start in range(0, len(big), 64 * 1024):
            time.sleep(0.05)
            yield big[start : start + 64 * 1024]

    killer = threading.Timer(0.6, lambda: stop_process(api.process, sig=signal.SIGKILL))
    killer.start()
    with pytest.raises(httpx.HTTPError), api.client(secret) as client:
        client.put(
            f"/api/v1/runs/{run_id}/artifacts/build-base.log",
            params={"attempt": 1},
            content=slow_body(),
            headers={"X-Content-SHA256": sha256_hex(big)},
        )
    killer.join()
    restarted = running.start_server("api-restarted", port=api.port)
    api.process = restarted.process  # later tests of the module use the restarted server
    # Nothing of the cut upload was published: no row, no blob.
    assert running.scalar("select count(*) from artifacts where run_id = :r", r=run_id) == 0
    blob = running.root / "artifacts" / sha256_hex(big)[:2] / sha256_hex(big)[2:4]
    assert not blob.exists()
    # What the kill left is a spool file only, removed by the sweep (beat, server start) once
    # it is older than upload_tmp_max_age_s.
    store = LocalArtifactStore(running.root / "artifacts")
    left = list(store.tmp_dir.glob("upload-*"))
    assert left, "the cut upload left no spool file"
    for path in left:
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert sorted(store.sweep_temporary(older_than_s=3600)) == sorted(p.name for p in left)
    # The agent sends it again (its outbox), completes, and the run is ingested once.
    upload_all(restarted, secret, run_id, files)
    with restarted.client(secret) as client:
        assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    assert_exactly_once(running, run_id)


def test_duplicate_and_out_of_order_uploads_and_completes_count_once(
    running: Stack, api: Server, api_key: str
) -> None:
    secret = enroll(running, api, "fault:dup")
    _, run_id = submit_and_lease(api, api_key, secret, "fault:dup")
    files = run_files(run_id)
    manifest = manifest_for(files)
    with api.client(secret) as client:
        # Complete before the uploads: refused, nothing recorded as completed.
        early = complete(client, secret, run_id, manifest)
        assert early.status_code == 422 and "not uploaded" in early.json()["detail"]
        # Uploads in reverse order, each twice.
        for name in reversed(list(files)):
            assert upload(client, secret, run_id, name, files[name]).status_code == 201
            assert upload(client, secret, run_id, name, files[name]).status_code == 200
        # The same complete twice (a retried request), and concurrently.
        answers: list[int] = []

        def again() -> None:
            with api.client(secret) as other:
                answers.append(complete(other, secret, run_id, manifest).status_code)

        threads = [threading.Thread(target=again) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers == [200, 200, 200]
    assert_exactly_once(running, run_id)
    assert running.scalar("select count(*) from run_attempts where run_id = :r", r=run_id) == 1


def test_host_clock_hours_off_changes_nothing_the_server_decides(
    running: Stack, api: Server, api_key: str
) -> None:
    secret = enroll(running, api, "fault:clock")
    _, run_id = submit_and_lease(api, api_key, secret, "fault:clock")
    # The host's clock is 7 hours ahead: its records say so, and its requests carry a Date
    # header to match; leases and expiry follow the server's clock only.
    files = run_files(run_id, shift=timedelta(hours=7))
    future = (datetime.now(UTC) + timedelta(hours=7)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    with api.client(secret) as client:
        client.headers["Date"] = future
        beat = client.post("/api/v1/workers/heartbeat", json={"run_id": run_id, "attempt": 1})
        assert beat.status_code == 200 and beat.json() == {"cancel": False}
        for name, content in files.items():
            assert upload(client, secret, run_id, name, content).status_code == 201
        assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    expires = running.scalar(
        "select extract(epoch from (completed_at - leased_at)) from runs where id = :r", r=run_id
    )
    assert 0 <= expires < 600  # server timestamps, not the host's
    assert_exactly_once(running, run_id)
    stored = running.rows(
        "select record from cells where run_id = :r and status = 'ok' limit 1", r=run_id
    )
    assert stored[0][0]["started_at"].startswith(
        (datetime(2026, 11, 29, 9, tzinfo=UTC) + timedelta(hours=7)).isoformat()[:13]
    )


def test_redis_unreachable_completion_is_kept_and_ingested_once_redis_is_back(
    running: Stack, api_key: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]  # nothing listens here once the socket closes
    cut_off = running.start_server(
        "api-no-redis", env={"COLDBENCH_REDIS_URL": f"redis://127.0.0.1:{dead_port}/0"}
    )
    try:
        secret = enroll(running, cut_off, "fault:redis")
        _, run_id = submit_and_lease(cut_off, api_key, secret, "fault:redis")
        files = run_files(run_id)
        upload_all(cut_off, secret, run_id, files)
        with cut_off.client(secret, timeout=120) as client:
            done = complete(client, secret, run_id, manifest_for(files))
        # The completion is stored although its ingest task could not be sent ...
        assert done.status_code == 200, done.text
        assert running.scalar("select state from runs where id = :r", r=run_id) in (
            "completed",
            "processed",
        )
    finally:
        stop_process(cut_off.process)
    # ... and beat's reprocess_unprocessed, on the reachable Redis, has it ingested once.
    assert_exactly_once(running, run_id)


def test_postgres_connections_dropped_mid_flight(running: Stack, api: Server, api_key: str) -> None:
    secret = enroll(running, api, "fault:pg")

    def terminate_all() -> int:
        return int(
            running.scalar(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                "where datname = current_database() and pid != pg_backend_pid()"
            )
        )

    # A long-poll is waiting when every connection (the pool's, the LISTEN one, Celery's) is
    # dropped; the listener reconnects and a submission still wakes it.
    waited: dict[str, Any] = {}

    def long_poll() -> None:
        with api.client(secret) as client:
            waited["response"] = client.post(
                "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 20}
            )

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(1.0)
    assert terminate_all() >= 1
    time.sleep(1.5)
    with api.client(api_key) as client:
        created = client.post("/api/v1/jobs", json=job_payload(model="m", host_labels=["fault:pg"]))
    assert created.status_code == 201, created.text
    poller.join(30)
    lease = waited["response"]
    assert lease.status_code == 200, lease.text
    run_id = lease.json()["run_id"]
    files = run_files(run_id)
    upload_all(api, secret, run_id, files)
    terminate_all()
    with api.client(secret) as client:
        assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    # Dropped again while Celery ingests: the task retries and counts nothing twice.
    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: running.scalar("select count(*) from cells where run_id = :r", r=run_id),
            10,
            "the ingest to begin",
        )
    terminate_all()
    assert_exactly_once(running, run_id)


def test_artifact_store_full_refuses_clearly_and_keeps_no_partial_evidence(
    running: Stack, api_key: str
) -> None:
    full = running.start_server("api-full", env={"COLDBENCH_ARTIFACT_MIN_FREE_BYTES": str(1 << 60)})
    secret = enroll(running, full, "fault:full")
    job_id, run_id = submit_and_lease(full, api_key, secret, "fault:full")
    files = run_files(run_id)
    spool = running.root / "artifacts" / "tmp"
    # (A server killed mid-upload by another test may have left its own temporary file.)
    spooled_before = set(spool.glob("*"))
    with full.client(secret) as client:
        refused = upload(client, secret, run_id, "records.jsonl", files["records.jsonl"])
        assert refused.status_code == 507
        assert refused.json()["detail"].startswith("the artifact store is full")
        assert "nothing stored" in refused.json()["detail"]
        incomplete = complete(client, secret, run_id, manifest_for(files))
        assert incomplete.status_code == 422
    assert running.scalar("select count(*) from artifacts where run_id = :r", r=run_id) == 0
    assert set(spool.glob("*")) == spooled_before  # the refused body left no file
    assert running.scalar("select state from runs where id = :r", r=run_id) == "leased"
    stop_process(full.process)
    # Space again (an operator freed some): the agent's retried uploads go through.
    roomy = running.start_server("api-roomy")
    try:
        upload_all(roomy, secret, run_id, files)
        with roomy.client(secret) as client:
            assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
        assert_exactly_once(running, run_id)
        evidence = wait_until(
            lambda: running.scalar("select evidence_id from jobs where id = :j", j=job_id),
            120,
            "the evidence",
        )
        with roomy.client() as client:
            assert client.get(f"/e/{evidence}.json").status_code == 200
    finally:
        stop_process(roomy.process)


def test_rendering_into_a_full_store_publishes_no_evidence_until_there_is_room(
    running: Stack, api: Server, api_key: str
) -> None:
    # A second Celery worker whose store is "full" takes part of the work; while it fails,
    # no evidence row or id may appear for a job with missing files.
    celery_full = running.start_celery(
        "celery-full", env={"COLDBENCH_ARTIFACT_MIN_FREE_BYTES": str(1 << 60)}
    )
    secret = enroll(running, api, "fault:render-full")
    job_id, run_id = submit_and_lease(api, api_key, secret, "fault:render-full")
    files = run_files(run_id)
    upload_all(api, secret, run_id, files)
    with api.client(secret) as client:
        assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    assert_exactly_once(running, run_id)
    # Watch the invariant while the full worker holds the task (it may take it every time and
    # keep failing: then nothing publishes until it stops, which is the point), then stop it.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = running.rows(
            "select j.state, j.evidence_id, count(e.id) from jobs j "
            "left join evidence e on e.job_id = j.id where j.id = :j group by j.id",
            j=job_id,
        )[0]
        state, evidence_id, rows = row
        # Published means complete: the id, the row and every file are there together.
        assert (evidence_id is None) == (rows == 0) == (state != "done"), row
        if evidence_id is not None:
            break
        time.sleep(0.3)
    stop_process(celery_full)
    evidence = wait_until(
        lambda: running.scalar("select evidence_id from jobs where id = :j", j=job_id),
        120,
        "the evidence",
    )
    with api.client() as client:
        for suffix in (".json", ".zip", ".md"):
            assert client.get(f"/e/{evidence}{suffix}").status_code == 200


def test_a_long_poll_whose_agent_left_claims_nothing(
    running: Stack, api: Server, api_key: str
) -> None:
    secret = enroll(running, api, "fault:gone")
    with pytest.raises(httpx.ReadTimeout), api.client(secret, timeout=1.5) as client:
        # The agent gives up (killed, or its own timeout) while the server still waits.
        client.post("/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 20})
    with api.client(api_key) as client:
        created = client.post(
            "/api/v1/jobs", json=job_payload(model="m", host_labels=["fault:gone"])
        )
    assert created.status_code == 201, created.text
    time.sleep(4)
    states = running.rows("select state from runs where job_id = :j", j=created.json()["id"])
    assert [state for (state,) in states] == ["queued"]
