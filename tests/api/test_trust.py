"""Host identity, labels, presets and revocation: what a host or a submitter can not claim."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.hosts import service as host_service
from coldbench.api.hosts.models import Host
from coldbench.api.runs import expiry
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import bearer
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_api_key,
    make_host,
    make_job,
    manifest_for,
    provenance_json,
    records_jsonl,
)

ADMIN_TOKEN = "an admin token chosen by the operator"


def lease(client: TestClient, secret: str, **body: Any) -> Any:
    payload = {"fingerprint": fingerprint(), "wait_s": 0, **body}
    return client.post("/api/v1/leases", json=payload, headers=bearer(secret))


def register(client: TestClient, token: str, name: str, **body: Any) -> Any:
    payload = {
        "name": name,
        "fingerprint": fingerprint(hostname=name),
        "labels": [],
        "repositories": {},
        "models": ["preset:tiny"],
        **body,
    }
    return client.post("/api/v1/workers/register", json=payload, headers=bearer(token))


def upload(client: TestClient, secret: str, run_id: str, name: str, content: bytes) -> Any:
    return client.put(
        f"/api/v1/runs/{run_id}/artifacts/{name}",
        params={"attempt": 1},
        content=content,
        headers={**bearer(secret), "X-Content-SHA256": sha256_hex(content)},
    )


# --- 1. a name is never a key to someone else's host ------------------------------------


def test_enrolling_an_existing_name_cannot_take_the_host_over(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    victim, victim_secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = lease(client, victim_secret).json()["run_id"]

    token = auth_service.create_enrollment_token(db_session=db_session)
    taken = register(client, token, "studio-1")
    assert taken.status_code == 409, taken.text
    assert "studio-1 is already enrolled" in taken.json()["detail"]
    # The refused registration spent nothing: the token still works for another name.
    assert register(client, token, "studio-9").status_code == 201

    # The victim's secret keeps working and its run is still its own.
    files = {"records.jsonl": records_jsonl(run_id), "provenance.json": provenance_json(run_id)}
    for name, content in files.items():
        assert upload(client, victim_secret, run_id, name, content).status_code == 201
    done = client.post(
        f"/api/v1/runs/{run_id}/complete",
        json={"attempt": 1, "status": "succeeded", "manifest": manifest_for(files)},
        headers=bearer(victim_secret),
    )
    assert done.status_code == 200, done.text
    assert db_session.get(Run, run_id).host_id == victim.id


# --- 2. labels come from enrollment and the admin, never from a lease --------------------


def test_a_lease_request_cannot_claim_labels(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    _, intruder = make_host(db_session, "intruder")
    make_job(db_session, settings, host_labels=["host:studio-1"])
    refused = lease(client, intruder, labels=["host:studio-1"])
    assert refused.status_code == 422  # the field is gone: labels are not the host's to send
    assert lease(client, intruder).status_code == 204
    assert (
        "host:studio-1"
        not in db_session.scalars(sa.select(Host.labels).where(Host.name == "intruder")).one()
    )


def test_registration_cannot_claim_another_hosts_automatic_label(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    token = auth_service.create_enrollment_token(db_session=db_session, labels=["lab:home"])
    body = register(client, token, "intruder", labels=["host:studio-1", "gpu:m3"])
    assert body.status_code == 201, body.text
    intruder = db_session.get(Host, body.json()["worker_id"])
    assert intruder.labels == ["gpu:m3", "lab:home"]
    make_job(db_session, settings, host_labels=["host:studio-1"])
    assert lease(client, body.json()["secret"]).status_code == 204


def test_backend_and_os_labels_are_fixed_at_registration(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    """A host registered as a CPU Linux box cannot report its way into jobs pinned to Metal
    on macOS: its lease's fingerprint is stored, its automatic labels are not recomputed."""
    _, secret = make_host(db_session, "box")  # backend cpu, Linux
    token = auth_service.create_enrollment_token(db_session=db_session)
    mac = register(client, token, "mac", fingerprint=fingerprint(backend="metal", os="macOS 15"))
    assert mac.status_code == 201, mac.text
    make_job(db_session, settings, host_labels=["backend:metal", "os:macos"])
    expiry.revoke_host(db_session=db_session, settings=settings, name_or_id="mac", actor="test")
    disguised = fingerprint(hostname="box", backend="metal", os="macOS 15.1")
    assert lease(client, secret, fingerprint=disguised).status_code == 204
    host = db_session.scalars(sa.select(Host).where(Host.name == "box")).one()
    db_session.refresh(host)
    assert host.fingerprint["backend"] == "metal"  # what it reported, kept for the record
    assert host.system_labels == ["backend:cpu", "os:linux"]
    listed = client.get("/api/v1/hosts", headers=bearer(make_api_key(db_session))).json()
    assert listed[0]["auto_labels"] == ["host:box", "backend:cpu", "os:linux"]
    # Submission judges with the same labels: no host can run a Metal job.
    refused = client.post(
        "/api/v1/jobs",
        json=job_payload(host_labels=["backend:metal"]),
        headers=bearer(make_api_key(db_session, "k2")),
    )
    assert refused.status_code == 422 and "lacks labels backend:metal" in refused.text


def test_admin_sets_labels_over_http(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    _, secret = make_host(db_session, "studio-1", enrolled_labels=["lab:home"])
    path = "/api/v1/admin/hosts/studio-1/labels"
    assert client.put(path, json={"labels": ["gpu:m3"]}).status_code == 401
    for bad in (["host:other"], ["bad label"]):
        refused = client.put(path, json={"labels": bad}, headers=bearer(ADMIN_TOKEN))
        assert refused.status_code == 422, refused.text
    changed = client.put(path, json={"labels": ["gpu:m3"]}, headers=bearer(ADMIN_TOKEN))
    assert changed.status_code == 200, changed.text
    assert changed.json()["labels"] == ["gpu:m3"]
    missing = client.put(
        "/api/v1/admin/hosts/nobody/labels", json={"labels": []}, headers=bearer(ADMIN_TOKEN)
    )
    assert missing.status_code == 404
    key = make_api_key(db_session)
    job = client.post("/api/v1/jobs", json=job_payload(host_labels=["gpu:m3"]), headers=bearer(key))
    assert job.status_code == 201, job.text
    assert lease(client, secret).json()["job_id"] == job.json()["id"]


# --- 3. presets only where the host allows them -------------------------------------------


def test_presets_run_only_on_hosts_that_allow_them(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, strict = make_host(db_session, "strict", models=["llama-3b"])
    key = make_api_key(db_session)
    for model in ("preset:tiny", "preset:no-such-preset"):
        refused = client.post("/api/v1/jobs", json=job_payload(model=model), headers=bearer(key))
        assert refused.status_code == 422, refused.text
        assert f"has no model '{model}'" in refused.json()["detail"]
    _, open_ = make_host(db_session, "open", models=["preset:tiny"])
    job = client.post("/api/v1/jobs", json=job_payload(model="preset:tiny"), headers=bearer(key))
    assert job.status_code == 201
    assert lease(client, strict).status_code == 204
    assert lease(client, open_).json()["job_id"] == job.json()["id"]


# --- revocation -------------------------------------------------------------------------


def test_revoked_host_gets_401_and_its_run_is_requeued(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    host, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    assert client.post("/api/v1/admin/hosts/studio-1/revoke").status_code == 401
    revoked = client.post("/api/v1/admin/hosts/studio-1/revoke", headers=bearer(ADMIN_TOKEN))
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["requeued_runs"] == [run_id]
    assert lease(client, secret).status_code == 401
    assert upload(client, secret, run_id, "records.jsonl", b"x").status_code == 401
    run = db_session.get(Run, run_id)
    db_session.refresh(run)
    assert run.state == "queued" and run.host_id is None
    attempt = db_session.scalars(sa.select(RunAttempt).where(RunAttempt.run_id == run_id)).one()
    assert attempt.state == "expired" and "revoked" in (attempt.reason or "")
    # Another host takes the requeued run; the revoked name can be enrolled again, afresh.
    token = auth_service.create_enrollment_token(db_session=db_session)
    again = register(client, token, "studio-1")
    assert again.status_code == 201 and again.json()["worker_id"] != host.id
    assert lease(client, again.json()["secret"]).json()["run_id"] == run_id


def test_agent_routes_check_the_secret_and_revocation_on_every_request(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    """Heartbeat, upload and complete authenticate from the host's id, secret digest and
    revocation alone (not the whole host): a forged secret for a real id, a well-formed token
    of an unknown id and a revoked host's secret are all 401, each time."""
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    host, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    forged = f"cbw_{host.id}_" + "A" * 43
    unknown = "cbw_" + "0" * 16 + "_" + secret.rsplit("_", 1)[1]

    def calls(token: str) -> list[Any]:
        records = records_jsonl(run_id)
        return [
            client.post(
                "/api/v1/workers/heartbeat",
                json={"run_id": run_id, "attempt": 1},
                headers=bearer(token),
            ),
            upload(client, token, run_id, "records.jsonl", records),
            client.post(
                f"/api/v1/runs/{run_id}/complete",
                json={"attempt": 1, "status": "failed", "reason": "OOM", "manifest": {"files": {}}},
                headers=bearer(token),
            ),
        ]

    for token in (forged, unknown):
        assert [r.status_code for r in calls(token)] == [401, 401, 401]
    beat, uploaded, completed = calls(secret)
    assert beat.status_code == 200 and beat.json()["cancel"] is False, beat.text
    assert uploaded.status_code == 201, uploaded.text
    assert completed.status_code == 200 and completed.json()["state"] == "failed", completed.text
    revoked = client.post("/api/v1/admin/hosts/studio-1/revoke", headers=bearer(ADMIN_TOKEN))
    assert revoked.status_code == 200, revoked.text
    assert [r.status_code for r in calls(secret)] == [401, 401, 401]


def test_a_run_that_does_not_exist_is_named_only_to_its_caller_s_host(
    client: TestClient, db_session: Session
) -> None:
    """Upload and complete read the run and check the token in one statement: a wrong token
    is refused whether or not the run exists (nothing said about it), a right one hears 404."""
    host, secret = make_host(db_session, "studio-1")
    forged = f"cbw_{host.id}_" + "A" * 43
    missing = "0" * 16

    def calls(token: str) -> list[int]:
        return [
            upload(client, token, missing, "records.jsonl", b"x").status_code,
            client.post(
                f"/api/v1/runs/{missing}/complete",
                json={"attempt": 1, "status": "failed", "reason": "OOM", "manifest": {"files": {}}},
                headers=bearer(token),
            ).status_code,
        ]

    assert calls(forged) == [401, 401]
    assert calls(secret) == [404, 404]


def test_revoked_api_key_gets_401(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    key = make_api_key(db_session)
    key_id = key.split("_")[1]
    assert client.get("/api/v1/jobs", headers=bearer(key)).status_code == 200
    revoked = client.post(f"/api/v1/admin/apikeys/{key_id}/revoke", headers=bearer(ADMIN_TOKEN))
    assert revoked.status_code == 200, revoked.text
    assert client.get("/api/v1/jobs", headers=bearer(key)).status_code == 401
    again = client.post(f"/api/v1/admin/apikeys/{key_id}/revoke", headers=bearer(ADMIN_TOKEN))
    assert again.status_code == 200
    unknown = client.post(
        "/api/v1/admin/apikeys/" + "0" * 16 + "/revoke", headers=bearer(ADMIN_TOKEN)
    )
    assert unknown.status_code == 404


@pytest.mark.parametrize("what", ["host", "apikey"])
def test_admin_revoke_cli(tmp_path: Any, coldbench_cmd: list[str], what: str) -> None:
    import os
    import subprocess

    env = {**os.environ, "COLDBENCH_STATE_DIR": str(tmp_path / "state")}

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*coldbench_cmd, "admin", *args], env=env, capture_output=True, text=True, check=False
        )

    if what == "apikey":
        key = admin("apikey", "someone").stdout.strip()
        subject = key.split("_")[1]
    else:
        from coldbench.api.database import make_engine, make_sessionmaker
        from coldbench.api.settings import Settings as ServiceSettings

        admin("enroll")  # creates and migrates the embedded database
        settings = ServiceSettings(state_dir=tmp_path / "state")
        with make_sessionmaker(make_engine(settings.sqlalchemy_url))() as session:
            make_host(session, "studio-1")
        subject = "studio-1"
    done = admin("revoke", what, subject)
    assert done.returncode == 0, done.stderr
    assert "revoked" in done.stderr
    unknown = admin("revoke", what, "nobody")
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1


def test_the_admins_labels_replace_only_the_admins_and_keep_the_hosts_own(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    """Issue 46, 3: the admin's labels and those the host derives itself are two sets; a
    corpus job still finds the host after the admin's change."""
    make_host(
        db_session, "studio-1", labels=["corpus:code", "chip:m3"], enrolled_labels=["lab:old"]
    )
    row = host_service.set_labels(
        db_session=db_session, name_or_id="studio-1", labels=["team:a"], actor="admin:test"
    )
    assert row.enrolled_labels == ["team:a"]
    assert row.host_labels == ["chip:m3", "corpus:code"]
    assert row.labels == ["chip:m3", "corpus:code", "team:a"]
    key = make_api_key(db_session)
    listed = client.get("/api/v1/hosts", headers=bearer(key)).json()[0]
    assert listed["admin_labels"] == ["team:a"]
    assert listed["host_labels"] == ["chip:m3", "corpus:code"]
    assert "backend:cpu" in listed["auto_labels"]
    spec = job_payload(corpus="code", host_labels=["team:a", "chip:m3"])
    submitted = client.post("/api/v1/jobs", json=spec, headers=bearer(key))
    assert submitted.status_code == 201, submitted.text
