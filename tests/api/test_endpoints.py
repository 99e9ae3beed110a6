"""The HTTP API: credentials, leases, uploads, completion, jobs. Leases, heartbeats, uploads,
completion and expiry run statements that differ by dialect: those tests run on SQLite and
PostgreSQL (`both_dialects`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.artifacts.models import Artifact
from coldbench.api.database import utcnow
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
from tests.evidence.builders import calibration_sample


@dataclass
class World:
    worker: str
    other_worker: str
    submitter: str
    run_id: str
    job_id: str
    host_id: str


def lease(client: TestClient, secret: str, **body: Any) -> Any:
    payload = {"fingerprint": fingerprint(), "wait_s": 0, **body}
    return client.post("/api/v1/leases", json=payload, headers=bearer(secret))


def upload(
    client: TestClient,
    secret: str,
    run_id: str,
    name: str,
    content: bytes,
    *,
    attempt: int = 1,
    sha256: str | None = None,
) -> Any:
    return client.put(
        f"/api/v1/runs/{run_id}/artifacts/{name}",
        params={"attempt": attempt},
        content=content,
        headers={**bearer(secret), "X-Content-SHA256": sha256 or sha256_hex(content)},
    )


def upload_run(client: TestClient, secret: str, run_id: str, attempt: int = 1) -> dict[str, Any]:
    files = {
        "records.jsonl": records_jsonl(run_id),
        "provenance.json": provenance_json(run_id),
        "build-base.log": b"built\n",
    }
    for name, content in files.items():
        assert upload(client, secret, run_id, name, content, attempt=attempt).status_code == 201
    return manifest_for(files)


def complete(
    client: TestClient, secret: str, run_id: str, manifest: dict[str, Any], **body: Any
) -> Any:
    payload = {"attempt": 1, "status": "succeeded", "reason": None, "manifest": manifest, **body}
    return client.post(f"/api/v1/runs/{run_id}/complete", json=payload, headers=bearer(secret))


@pytest.fixture
def world(client: TestClient, db_session: Session, settings: Settings) -> World:
    host, secret = make_host(db_session, "studio-1")
    _, other_secret = make_host(db_session, "studio-2")
    key = make_api_key(db_session)
    job = make_job(db_session, settings)
    response = lease(client, secret)
    assert response.status_code == 200, response.text
    return World(secret, other_secret, key, response.json()["run_id"], job.id, host.id)


# --- credentials -----------------------------------------------------------------------

WORKER_CALLS = [
    ("post", "/api/v1/workers/heartbeat", {"run_id": "{run}", "attempt": 1}),
    ("post", "/api/v1/leases", {"fingerprint": {}, "wait_s": 0}),
    ("put", "/api/v1/runs/{run}/artifacts/records.jsonl?attempt=1", b"x"),
    ("put", "/api/v1/workers/calibration", calibration_sample()),
    (
        "post",
        "/api/v1/runs/{run}/complete",
        {"attempt": 1, "status": "failed", "manifest": {"files": {}}},
    ),
]
SUBMITTER_CALLS = [
    ("post", "/api/v1/jobs", job_payload()),
    ("get", "/api/v1/jobs", None),
    ("get", "/api/v1/jobs/{job}", None),
    ("post", "/api/v1/jobs/{job}/cancel", None),
    ("get", "/api/v1/hosts", None),
]


def _call(client: TestClient, world: World, call: tuple[str, str, Any], token: str | None) -> Any:
    method, path, body = call
    path = path.replace("{run}", world.run_id).replace("{job}", world.job_id)
    headers = bearer(token) if token is not None else {}
    if isinstance(body, bytes):
        headers["X-Content-SHA256"] = sha256_hex(body)
        return client.request(method, path, content=body, headers=headers)
    if isinstance(body, dict) and body.get("run_id") == "{run}":
        body = {**body, "run_id": world.run_id}
    return client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("call", WORKER_CALLS + SUBMITTER_CALLS, ids=lambda c: c[0] + c[1])
def test_no_and_wrong_credentials_are_refused(
    client: TestClient, world: World, call: tuple[str, str, Any]
) -> None:
    assert _call(client, world, call, None).status_code == 401
    assert _call(client, world, call, "cbw_0123456789abcdef_" + "x" * 43).status_code == 401
    assert _call(client, world, call, "nonsense").status_code == 401
    # A submitter key is not a worker secret and the other way round.
    other_kind = world.submitter if call in WORKER_CALLS else world.worker
    response = _call(client, world, call, other_kind)
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "call", [c for c in WORKER_CALLS if "{run}" in c[1] or "run_id" in str(c[2])], ids=str
)
def test_another_workers_run_is_forbidden(
    client: TestClient, world: World, call: tuple[str, str, Any]
) -> None:
    response = _call(client, world, call, world.other_worker)
    assert response.status_code == 403, response.text
    assert "not leased to this worker" in response.json()["detail"]


@pytest.mark.parametrize("call", WORKER_CALLS + SUBMITTER_CALLS, ids=lambda c: c[0] + c[1])
def test_the_right_credential_is_accepted(
    client: TestClient, world: World, call: tuple[str, str, Any]
) -> None:
    token = world.worker if call in WORKER_CALLS else world.submitter
    response = _call(client, world, call, token)
    # The lease call is answered 204: this host already holds a run.
    assert response.status_code in (200, 201, 204), response.text


def test_registration_token_is_single_use(client: TestClient, db_session: Session) -> None:
    from coldbench.api.auth import service as auth_service

    token = auth_service.create_enrollment_token(db_session=db_session, labels=["lab:home"])
    body = {
        "name": "mac-1",
        "fingerprint": fingerprint(backend="metal"),
        "labels": ["gpu:m3"],
        "repositories": {"mlx-lm": {"recipes": ["editable"]}},
        "models": ["llama-3b"],
    }
    first = client.post("/api/v1/workers/register", json=body, headers=bearer(token))
    assert first.status_code == 201, first.text
    secret = first.json()["secret"]
    assert secret.startswith(f"cbw_{first.json()['worker_id']}_")
    again = client.post("/api/v1/workers/register", json=body, headers=bearer(token))
    assert again.status_code == 401
    assert "already used" in again.json()["detail"]
    assert client.post("/api/v1/workers/register", json=body).status_code == 401
    hosts = client.get("/api/v1/hosts", headers=bearer(make_api_key(db_session))).json()
    (mac,) = [h for h in hosts if h["name"] == "mac-1"]
    assert mac["labels"] == ["gpu:m3", "lab:home"]
    assert "backend:metal" in mac["auto_labels"] and mac["health"] == "ready"
    # Only the digest is stored.
    from coldbench.api.hosts.models import Host

    assert db_session.get(Host, mac["id"]).secret_sha256 == sha256_hex(secret.encode())


def test_silent_host_is_listed_offline(client: TestClient, db_session: Session) -> None:
    host, _ = make_host(db_session, "quiet")
    host.last_heartbeat_at = utcnow() - timedelta(minutes=10)
    db_session.commit()
    hosts = client.get("/api/v1/hosts", headers=bearer(make_api_key(db_session))).json()
    assert [h["health"] for h in hosts] == ["offline"]


def test_register_refuses_unsafe_names(client: TestClient, db_session: Session) -> None:
    from coldbench.api.auth import service as auth_service

    token = auth_service.create_enrollment_token(db_session=db_session)
    body = {"name": "../etc", "fingerprint": {}, "labels": [], "repositories": {}, "models": []}
    response = client.post("/api/v1/workers/register", json=body, headers=bearer(token))
    assert response.status_code == 422


# --- leases ----------------------------------------------------------------------------


@pytest.mark.both_dialects
def test_one_run_per_host_and_distinct_hosts(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, first = make_host(db_session, "a")
    _, second = make_host(db_session, "b")
    _, third = make_host(db_session, "c")
    job = make_job(db_session, settings, hosts=2)
    make_job(db_session, settings)
    got = lease(client, first).json()
    assert got["job_id"] == job.id and got["attempt"] == 1 and got["lease_ttl_s"] == 60
    assert lease(client, first).status_code == 204  # one run per host at a time
    second_lease = lease(client, second).json()
    assert second_lease["job_id"] == job.id and second_lease["run_id"] != got["run_id"]
    third_lease = lease(client, third).json()
    assert third_lease["job_id"] != job.id
    runs = db_session.scalars(sa.select(Run).where(Run.job_id == job.id)).all()
    assert len({run.host_id for run in runs}) == 2


@pytest.mark.both_dialects
def test_host_never_takes_a_second_slot_of_one_job(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, secret = make_host(db_session, "a")
    make_host(db_session, "b")
    job = make_job(db_session, settings, hosts=2)
    run_id = lease(client, secret).json()["run_id"]
    manifest = upload_run(client, secret, run_id)
    assert complete(client, secret, run_id, manifest).status_code == 200
    assert lease(client, secret).status_code == 204
    assert db_session.scalar(
        sa.select(sa.func.count()).where(Run.job_id == job.id, Run.state == "queued")
    )


@pytest.mark.both_dialects
def test_lease_matches_labels_repository_recipes_and_models(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, plain = make_host(db_session, "plain")
    _, mac = make_host(
        db_session,
        "mac",
        labels=["lab:home"],
        repositories={"mlx-lm": {"recipes": ["editable"]}},
        models=["llama-3b"],
    )
    job = make_job(
        db_session,
        settings,
        adapter="mlx-lm",
        repository="mlx-lm",
        variants=[
            {"name": "main", "ref": "main", "recipe": "editable"},
            {"name": "pr", "ref": "pr"},
        ],
        model="llama-3b",
        host_labels=["lab:home"],
    )
    assert lease(client, plain).status_code == 204
    assert lease(client, mac).json()["job_id"] == job.id


@pytest.mark.both_dialects
def test_expired_lease_requeues_and_late_complete_is_refused(
    client: TestClient, db_session: Session, world: World, settings: Settings
) -> None:
    manifest = upload_run(client, world.worker, world.run_id)
    run = db_session.get(Run, world.run_id)
    run.lease_expires_at = utcnow() - timedelta(seconds=1)
    db_session.commit()
    expiry.expire_leases(db_session=db_session, settings=settings)  # the periodic sweep
    taken = lease(client, world.other_worker).json()
    assert taken["run_id"] == world.run_id and taken["attempt"] == 2
    lost = db_session.scalars(
        sa.select(RunAttempt).where(RunAttempt.run_id == world.run_id, RunAttempt.attempt == 1)
    ).one()
    assert lost.state == "expired" and "no heartbeat" in lost.reason
    # The lost worker learns it from its heartbeat and its complete is refused but kept.
    beat = client.post(
        "/api/v1/workers/heartbeat",
        json={"run_id": world.run_id, "attempt": 1},
        headers=bearer(world.worker),
    )
    assert beat.json() == {"cancel": True}
    late = complete(client, world.worker, world.run_id, manifest)
    assert late.status_code == 409 and "no longer current" in late.json()["detail"]
    db_session.refresh(lost)
    assert lost.late_complete["manifest"]["files"]["records.jsonl"]
    late_upload = upload(client, world.worker, world.run_id, "extra.log", b"x", attempt=1)
    assert late_upload.status_code == 409


@pytest.mark.both_dialects
def test_expiry_stops_after_max_attempts(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, secret = make_host(db_session, "a")
    job = make_job(db_session, settings)
    for attempt in range(1, settings.max_attempts + 1):
        assert lease(client, secret).json()["attempt"] == attempt
        run = db_session.scalars(sa.select(Run).where(Run.job_id == job.id)).one()
        run.lease_expires_at = utcnow() - timedelta(seconds=1)
        db_session.commit()
        expiry.expire_leases(db_session=db_session, settings=settings)
    db_session.refresh(run)
    assert run.state == "expired" and f"lost {settings.max_attempts} attempts" in run.reason
    assert lease(client, secret).status_code == 204
    db_session.refresh(job)
    assert job.state == "failed"


@pytest.mark.both_dialects
def test_heartbeat_extends_lease_and_reports_cancel(
    client: TestClient, db_session: Session, world: World
) -> None:
    before = db_session.get(Run, world.run_id).lease_expires_at
    progress = {"cells_done": 3, "cells_total": 8, "variant": "base", "context_tokens": 64}
    beat = client.post(
        "/api/v1/workers/heartbeat",
        json={"run_id": world.run_id, "attempt": 1, "progress": progress},
        headers=bearer(world.worker),
    )
    assert beat.json() == {"cancel": False}
    db_session.expire_all()
    run = db_session.get(Run, world.run_id)
    assert run.lease_expires_at >= before and run.progress["cells_done"] == 3
    detail = client.get(f"/api/v1/jobs/{world.job_id}", headers=bearer(world.submitter)).json()
    assert detail["runs"][0]["progress"]["cells_total"] == 8
    assert detail["runs"][0]["host_name"] == "studio-1"
    cancelled = client.post(
        f"/api/v1/jobs/{world.job_id}/cancel", headers=bearer(world.submitter)
    ).json()
    assert cancelled["state"] == "cancelled"
    beat = client.post(
        "/api/v1/workers/heartbeat",
        json={"run_id": world.run_id, "attempt": 1},
        headers=bearer(world.worker),
    )
    assert beat.json() == {"cancel": True}


# --- artifacts -------------------------------------------------------------------------


def _blobs(settings: Settings) -> list[str]:
    root = settings.artifact_dir
    return sorted(
        p.name for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "tmp"
    )


@pytest.mark.both_dialects
def test_checksum_mismatch_stores_nothing(
    client: TestClient, db_session: Session, world: World, settings: Settings
) -> None:
    response = upload(
        client, world.worker, world.run_id, "records.jsonl", b"abc", sha256=sha256_hex(b"abd")
    )
    assert response.status_code == 422 and "does not match" in response.json()["detail"]
    assert _blobs(settings) == []
    spool = settings.artifact_dir / "tmp"  # a small body never reached it
    assert not spool.exists() or list(spool.iterdir()) == []
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Artifact)) == 0


@pytest.mark.both_dialects
def test_reupload_is_idempotent_and_another_digest_conflicts(
    client: TestClient, db_session: Session, world: World, settings: Settings
) -> None:
    first = upload(client, world.worker, world.run_id, "records.jsonl", b"line\n")
    assert first.status_code == 201 and first.json()["created"] is True
    again = upload(client, world.worker, world.run_id, "records.jsonl", b"line\n")
    assert again.status_code == 200 and again.json()["created"] is False
    other = upload(client, world.worker, world.run_id, "records.jsonl", b"other\n")
    assert other.status_code == 409 and "already uploaded" in other.json()["detail"]
    sha = sha256_hex(b"line\n")
    assert _blobs(settings) == [sha]
    assert (settings.artifact_dir / sha[:2] / sha[2:4] / sha).read_bytes() == b"line\n"


@pytest.mark.both_dialects
def test_too_large_is_refused_up_front_and_while_streaming(
    client: TestClient, world: World, settings: Settings
) -> None:
    big = b"x" * (settings.max_artifact_bytes + 1)
    response = upload(client, world.worker, world.run_id, "big.log", big)
    assert response.status_code == 413
    # Without Content-Length (chunked), the count while streaming catches it.
    response = client.put(
        f"/api/v1/runs/{world.run_id}/artifacts/big.log",
        params={"attempt": 1},
        content=iter([big[:40_000], big[40_000:]]),
        headers={**bearer(world.worker), "X-Content-SHA256": sha256_hex(big)},
    )
    assert response.status_code == 413, response.text
    assert _blobs(settings) == []


@pytest.mark.parametrize("name", [".hidden", "a" * 129, "a..b", "sp ace"])
def test_bad_artifact_names_are_refused(client: TestClient, world: World, name: str) -> None:
    assert upload(client, world.worker, world.run_id, name, b"x").status_code in (404, 422)


def test_missing_digest_header_is_refused(client: TestClient, world: World) -> None:
    response = client.put(
        f"/api/v1/runs/{world.run_id}/artifacts/a.log",
        params={"attempt": 1},
        content=b"x",
        headers=bearer(world.worker),
    )
    assert response.status_code == 422 and "X-Content-SHA256" in response.json()["detail"]


# --- completion ------------------------------------------------------------------------


@pytest.mark.both_dialects
def test_complete_requires_every_manifest_file(
    client: TestClient, world: World, sent_tasks: Any
) -> None:
    manifest = upload_run(client, world.worker, world.run_id)
    manifest["files"]["build-cand.log"] = {"sha256": sha256_hex(b"nope"), "bytes": 4}
    manifest["files"]["records.jsonl"]["bytes"] += 1
    response = complete(client, world.worker, world.run_id, manifest)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "build-cand.log (not uploaded)" in detail and "records.jsonl (uploaded with" in detail
    assert sent_tasks.calls == []


@pytest.mark.both_dialects
def test_complete_stores_state_and_sends_ingest_after_commit(
    client: TestClient, db_session: Session, world: World, sent_tasks: Any
) -> None:
    manifest = upload_run(client, world.worker, world.run_id)
    response = complete(client, world.worker, world.run_id, manifest)
    assert response.status_code == 200 and response.json()["state"] == "completed"
    assert sent_tasks.named("ingest_run") == [(world.run_id,)]
    # Repeating the same complete is harmless.
    assert complete(client, world.worker, world.run_id, manifest).status_code == 200
    assert len(sent_tasks.named("ingest_run")) == 1
    assert db_session.get(Run, world.run_id).state == "completed"


@pytest.mark.both_dialects
def test_reported_failure_is_final(
    client: TestClient, db_session: Session, world: World, settings: Settings
) -> None:
    response = complete(
        client, world.worker, world.run_id, {"files": {}}, status="failed", reason="OOM"
    )
    assert response.json()["state"] == "failed"
    run = db_session.get(Run, world.run_id)
    expiry.expire_leases(db_session=db_session, settings=settings)
    db_session.refresh(run)
    assert run.state == "failed" and run.reason == "OOM"
    assert lease(client, world.other_worker).status_code == 204


# --- jobs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "repeated: a"),
        ({"baseline": "zzz"}, "baseline 'zzz' is not one of"),
        ({"contexts": [64, 10**7]}, "exceed the limit"),
        ({"contexts": list(range(1, 40))}, "contexts; at most"),
        ({"rounds": 10**6}, "rounds=1000000; at most"),
        ({"decode_tokens": 10**6}, "decode_tokens=1000000; at most"),
        ({"host_labels": ["gpu:h200"]}, "lacks labels gpu:h200"),
        (
            {"adapter": "mlx-lm", "repository": "vllm", "variants": [{"name": "a", "ref": "m"}]},
            "allowed repositories: studio-1: mlx-lm (recipes editable)",
        ),
        (
            {"adapter": "mlx-lm", "repository": "mlx-lm", "variants": [{"name": "a"}]},
            "variant a names no ref of mlx-lm",
        ),
        (
            {
                "adapter": "mlx-lm",
                "repository": "mlx-lm",
                "variants": [{"name": "a", "ref": "main", "recipe": "x"}],
            },
            "defines no recipe x for mlx-lm",
        ),
        ({"model": "llama-70b"}, "has no model 'llama-70b'"),
        ({"corpus": "code"}, "has no corpus 'code'"),
        ({"corpus": "../etc/passwd"}, "corpus"),
        ({"hosts": 2}, "only 1 can run it: studio-1"),
        ({"variants": [{"name": "a", "ref": "main"}]}, "names no repository"),
        (
            {"mode": "ablation", "features": ["compile", "compile=false"]},
            "ablation features name the same flag twice: compile",
        ),
        (
            {"variants": [{"name": f"v{i}"} for i in range(40)]},
            "40 variants; at most 32 allowed",
        ),
        ({"variants": [{"name": "a", "flags": {"x": "y"}, "command": "rm -rf /"}]}, "command"),
        ({"residency": "both"}, "'both': choose 'auto', 'side-by-side' or 'in-turns'"),
        (
            {"residency": "in-turns", "fresh_process": True},
            "fresh_process (a process per cell) keeps no process resident",
        ),
    ],
)
def test_job_validation_messages(
    client: TestClient, db_session: Session, overrides: dict[str, Any], message: str
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    key = make_api_key(db_session)
    response = client.post("/api/v1/jobs", json=job_payload(**overrides), headers=bearer(key))
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]


def test_a_job_asks_for_its_residency_through_the_api(
    client: TestClient, db_session: Session
) -> None:
    """The residency is part of the job spec: the API stores what was asked, auto when left out."""
    make_host(db_session, "studio-1")
    key = make_api_key(db_session)
    for asked, stored in (
        (None, "auto"),
        ("in-turns", "in-turns"),
        ("side-by-side", "side-by-side"),
    ):
        payload = job_payload() if asked is None else job_payload(residency=asked)
        response = client.post("/api/v1/jobs", json=payload, headers=bearer(key))
        assert response.status_code == 201, response.text
        job = client.get(f"/api/v1/jobs/{response.json()['id']}", headers=bearer(key)).json()
        assert job["spec"]["residency"] == stored, job


def test_every_problem_of_a_job_is_refused_in_one_answer(
    client: TestClient, db_session: Session
) -> None:
    """One submission says all it can know: the flags the engine does not take (a host would
    refuse them later), and the service's limits, each problem with its field."""
    make_host(db_session, "studio-1")
    key = make_api_key(db_session)
    payload = job_payload(
        variants=[
            {"name": "base", "flags": {"prefill_step_size": 64}},
            {"name": "cand", "flags": {"bogus_flag": 3, "clear_cache": "sometimes"}},
        ],
        contexts=[64, 10_000_000],
        rounds=100_000,
    )
    response = client.post("/api/v1/jobs", json=payload, headers=bearer(key))
    assert response.status_code == 422, response.text
    body = response.json()
    assert [(e["field"], e["detail"].split(":")[0]) for e in body["errors"]] == [
        (
            "variants.1.flags",
            "the embedded adapter has no flag bogus_flag (prefill_step_size, "
            "clear_cache, compile, fused_swiglu, fused_add_rms_norm)",
        ),
        ("variants.1.flags", "clear_cache=sometimes"),
        ("contexts", "contexts [10000000] exceed the limit of 262144 tokens"),
        ("rounds", "rounds=100000; at most 100 allowed"),
    ], body
    assert body["field"] == "variants.1.flags" and "; rounds: rounds=100000" in body["detail"]
    # Field problems are all said too, in words (not pydantic's).
    bad = client.post(
        "/api/v1/jobs",
        json=job_payload(precision=0.7, model="a model", host_labels=["b@d"]),
        headers=bearer(key),
    ).json()
    assert sorted((e["field"], e["detail"]) for e in bad["errors"]) == [
        ("host_labels.0", "'b@d': not a host label (letters, digits, _ . : = -)"),
        ("model", "'a model': not a model name: preset:NAME or a model name of the hosts"),
        ("precision", "0.7: give at most 0.5"),
    ]


def test_a_job_naming_a_corpus_goes_to_a_host_that_has_it(
    client: TestClient, db_session: Session
) -> None:
    make_host(db_session, "plain")
    make_host(db_session, "with-code", labels=["corpus:code"])
    key = make_api_key(db_session)
    response = client.post(
        "/api/v1/jobs", json=job_payload(corpus="code", hosts=2), headers=bearer(key)
    )
    assert response.status_code == 422, response.text
    assert "only 1 can run it: with-code" in response.json()["detail"]
    response = client.post("/api/v1/jobs", json=job_payload(corpus="code"), headers=bearer(key))
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["corpus"] == "code"


def test_job_without_any_host_is_refused(client: TestClient, db_session: Session) -> None:
    key = make_api_key(db_session)
    response = client.post("/api/v1/jobs", json=job_payload(), headers=bearer(key))
    assert response.status_code == 422 and "no host is registered" in response.json()["detail"]


def test_job_create_list_get_cancel(client: TestClient, db_session: Session) -> None:
    make_host(db_session, "a")
    make_host(db_session, "b")
    key = make_api_key(db_session)
    created = client.post("/api/v1/jobs", json=job_payload(hosts=2), headers=bearer(key))
    assert created.status_code == 201
    job = created.json()
    assert job["state"] == "queued" and len(job["runs"]) == 2 and job["evidence_id"] is None
    assert job["spec"]["baseline"] == "base"
    # The submission answers from what it wrote (no reads after its commit): the same detail
    # a later GET reads back from the database.
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(key)).json() == job
    listed = client.get("/api/v1/jobs", headers=bearer(key)).json()
    assert [j["id"] for j in listed] == [job["id"]]
    other_key = make_api_key(db_session, "someone else")
    refused = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(other_key))
    assert refused.status_code == 403
    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(key)).json()
    assert cancelled["state"] == "cancelled"
    assert {run["state"] for run in cancelled["runs"]} == {"cancelled"}
    assert client.get("/api/v1/jobs/nope", headers=bearer(key)).status_code == 404


# --- service endpoints -----------------------------------------------------------------


def test_healthz_and_metrics(client: TestClient, world: World) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    upload(client, world.worker, world.run_id, "records.jsonl", b"12345")
    text = client.get("/metrics").text
    assert 'coldbench_runs{state="leased"} 1.0' in text
    assert "coldbench_artifact_bytes 5.0" in text
    assert 'coldbench_http_requests_total{method="GET",route="/healthz",status="200"}' in text


def test_evidence_routes_serve_stored_files(
    client: TestClient, db_session: Session, world: World
) -> None:
    from coldbench.api.evidence.models import Evidence

    store = client.app.state.store
    files = {}
    for name, content in {
        "report.html": b"<html>report</html>",
        "summary.md": b"# summary",
        "summary.json": b"{}",
        "bundle.zip": b"PK",
    }.items():
        blob = store.put_bytes(content)
        files[name] = {"sha256": blob.sha256, "bytes": blob.bytes}
    evidence_id = "ab" * 12
    db_session.add(
        Evidence(id=evidence_id, job_id=world.job_id, manifest_sha256="0" * 64, files=files)
    )
    db_session.commit()
    assert client.get(f"/e/{evidence_id}").text == "<html>report</html>"
    assert client.get(f"/e/{evidence_id}.md").text == "# summary"
    assert client.get(f"/e/{evidence_id}.json").json() == {}
    zipped = client.get(f"/e/{evidence_id}.zip")
    assert zipped.content == b"PK" and "attachment" in zipped.headers["content-disposition"]
    assert client.get("/e/" + "cd" * 12).status_code == 404
    assert client.get("/e/..%2f..%2fetc").status_code == 404


# --- admin -----------------------------------------------------------------------------

ADMIN_TOKEN = "an admin token chosen by the operator"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/admin/enrollments", {"labels": ["lab:x"]}),
        ("/api/v1/admin/apikeys", {"name": "b"}),
    ],
)
def test_admin_endpoints_need_the_admin_token(
    client: TestClient, world: World, settings: Settings, path: str, body: dict[str, Any]
) -> None:
    disabled = client.post(path, json=body, headers=bearer(ADMIN_TOKEN))
    assert disabled.status_code == 401 and "disabled" in disabled.json()["detail"]
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    assert client.post(path, json=body).status_code == 401
    for wrong in ("x", world.submitter, world.worker):
        assert client.post(path, json=body, headers=bearer(wrong)).status_code == 401
    created = client.post(path, json=body, headers=bearer(ADMIN_TOKEN))
    assert created.status_code == 201
    secret = created.json().get("token") or created.json()["key"]
    assert secret.startswith(("cbe_", "cbk_"))


def test_admin_enrollment_token_registers_a_host(client: TestClient, settings: Settings) -> None:
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    token = client.post(
        "/api/v1/admin/enrollments", json={"labels": ["lab:x"]}, headers=bearer(ADMIN_TOKEN)
    ).json()["token"]
    body = {"name": "remote", "fingerprint": {}, "labels": [], "repositories": {}, "models": []}
    registered = client.post("/api/v1/workers/register", json=body, headers=bearer(token))
    assert registered.status_code == 201


def test_a_host_reports_its_calibration_and_the_host_list_carries_it(
    client: TestClient, world: World
) -> None:
    sample = calibration_sample()
    answer = client.put("/api/v1/workers/calibration", json=sample, headers=bearer(world.worker))
    assert answer.status_code == 200, answer.text
    assert answer.json()["host"] == "studio-1"
    assert answer.json()["lines"][0] == "A/A jobs with a faster/slower verdict: 0 of 10 (0%)"
    hosts = client.get("/api/v1/hosts", headers=bearer(world.submitter)).json()
    by_name = {h["name"]: h for h in hosts}
    assert by_name["studio-1"]["calibration"]["resolvable"] == 0.008
    assert by_name["studio-2"]["calibration"] is None
    bad = client.put(
        "/api/v1/workers/calibration",
        json={**sample, "planted_detected": "many"},
        headers=bearer(world.worker),
    )
    assert bad.status_code == 422 and "planted_detected" in bad.text
    again = client.get("/api/v1/hosts", headers=bearer(world.submitter)).json()
    assert {h["name"]: h for h in again}["studio-1"]["calibration"]["resolvable"] == 0.008


def test_the_agent_reports_a_calibration_with_its_own_secret(
    client: TestClient, world: World, tmp_path: Any
) -> None:
    """coldbench.worker.agent.Agent.report_calibration against this app (requests forwarded to
    it)."""
    import httpx

    from coldbench.evidence.contract.calibration import HostCalibration
    from coldbench.worker.agent import Agent, AgentError
    from coldbench.worker.config import HostConfig

    config = HostConfig(name="studio-1", labels=(), models={}, repositories={}, state_dir=tmp_path)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = client.request(
            request.method, request.url.path, content=request.content, headers=request.headers
        )
        return httpx.Response(answer.status_code, content=answer.content)

    transport = httpx.MockTransport(forward)
    agent = Agent("http://testserver", config, transport=transport)
    agent.secret = {"api": "http://testserver", "worker_id": world.host_id, "secret": world.worker}
    agent.report_calibration(HostCalibration.model_validate(calibration_sample()))
    hosts = client.get("/api/v1/hosts", headers=bearer(world.submitter)).json()
    assert {h["name"]: h for h in hosts}["studio-1"]["calibration"]["aa_jobs"] == 10
    stranger = Agent("http://testserver", config, transport=transport)
    stranger.secret = {"api": "http://testserver", "worker_id": "x", "secret": "cbw_wrong"}
    with pytest.raises(AgentError, match="calibration refused \\(401\\)"):
        stranger.report_calibration(HostCalibration.model_validate(calibration_sample()))
