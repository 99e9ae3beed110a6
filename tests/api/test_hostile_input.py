"""Hostile bytes from an enrolled host or a submitter: each request that carries them is
refused with one line (422), nothing is stored, and every other host and submitter carries on.

The boundary types are `evidence/contract/boundary.py`'s: no control characters in text, finite
floats, integers within their columns, bounded extra fields, strict JSON.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.app import create_app
from coldbench.api.auth import service as auth_service
from coldbench.api.database import make_engine, make_sessionmaker
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings
from tests.api.conftest import SentTasks, bearer
from tests.api.factories import (
    fingerprint,
    job_payload,
    make_api_key,
    make_host,
    make_job,
    manifest_for,
)
from tests.api.test_endpoints import complete, lease, upload

NUL = "\u0000"
# Fingerprints a host might send, each one thing PostgreSQL, JSON or a page cannot hold.
HOSTILE_FINGERPRINTS: list[Any] = [
    {**fingerprint(), f"x{NUL}": "y"},  # NUL in an extra field's name
    {**fingerprint(), "vendor": f"acme{NUL}"},  # NUL in an extra field's value
    {**fingerprint(), "chip": f"M3{NUL}"},  # NUL in a declared field
    {**fingerprint(), "chip": "M3\n# Verdict: faster"},  # a line break in one-line text
    {**fingerprint(), "os": "Linux\x1b[31m"},  # an escape sequence
    {**fingerprint(), "cores": 2**64},  # beyond BIGINT
    {**fingerprint(), **{f"extra_{i}": i for i in range(40)}},  # too many extra fields
    {**fingerprint(), "nested": {"a": [{"b": NUL}]}},  # deep inside an extra field
]
# Raw JSON bodies whose numbers JSON (and PostgreSQL's JSON) cannot hold.
NON_FINITE = ["1e999", "-1e999", "NaN", "Infinity"]


def _raw_post(client: TestClient, path: str, text: str, secret: str) -> Any:
    return client.post(
        path, content=text, headers={**bearer(secret), "Content-Type": "application/json"}
    )


def _one_line_422(response: Any) -> None:
    """422 with messages of one line each (a service's one line, or the request validation's
    list of problems), none echoing the hostile byte."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    messages = [detail] if isinstance(detail, str) else [item["msg"] for item in detail]
    assert messages and all("\n" not in m and NUL not in m for m in messages), detail


@pytest.mark.parametrize("hostile", HOSTILE_FINGERPRINTS)
def test_a_hostile_fingerprint_is_refused_at_registration_and_lease(
    client: TestClient, db_session: Session, settings: Settings, hostile: dict[str, Any]
) -> None:
    token = auth_service.create_enrollment_token(db_session=db_session)
    body = {"name": "intruder", "fingerprint": hostile, "models": ["preset:tiny"]}
    _one_line_422(client.post("/api/v1/workers/register", json=body, headers=bearer(token)))
    # The token was not spent, and a clean registration still works.
    body["fingerprint"] = fingerprint()
    assert (
        client.post("/api/v1/workers/register", json=body, headers=bearer(token)).status_code == 201
    )
    _, secret = make_host(db_session, "studio-1")
    _one_line_422(lease(client, secret, fingerprint=hostile))
    stored = db_session.scalars(sa.select(Host.fingerprint).where(Host.name == "studio-1")).one()
    assert stored == fingerprint(hostname="studio-1")
    # Every submission still finds its hosts.
    key = make_api_key(db_session)
    assert client.post("/api/v1/jobs", json=job_payload(), headers=bearer(key)).status_code == 201


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_numbers_are_refused_in_every_body(
    client: TestClient, db_session: Session, settings: Settings, number: str
) -> None:
    _, secret = make_host(db_session, "studio-1")
    key = make_api_key(db_session)
    spec = json.dumps(job_payload()).replace('"flags": {}', f'"flags": {{"kv_bits": {number}}}')
    _one_line_422(_raw_post(client, "/api/v1/jobs", spec, key))
    progress = (
        '{"run_id": "r", "attempt": 1, "progress": {"cells_done": 0, "cells_total": 1, '
        f'"speed": {number}}}}}'
    )
    _one_line_422(_raw_post(client, "/api/v1/workers/heartbeat", progress, secret))
    fingerprint_text = json.dumps(fingerprint()).replace('"cores": 2', f'"cores": {number}')
    _one_line_422(
        _raw_post(client, "/api/v1/leases", f'{{"fingerprint": {fingerprint_text}}}', secret)
    )
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 0


def test_a_non_finite_flag_from_the_form_parser_is_refused_with_its_field(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    from coldbench.api.errors import Invalid
    from coldbench.api.jobs import service as job_service

    make_host(db_session, "studio-1")
    payload = job_payload()
    payload["variants"][1]["flags"] = {"prefill_step_size": float("inf")}
    with pytest.raises(Invalid) as refused:
        job_service.create_job(db_session=db_session, settings=settings, payload=payload)
    assert refused.value.field is not None
    assert refused.value.field.startswith("variants.1.flags")
    assert "prefill_step_size" in refused.value.message


def test_hostile_heartbeats_and_completions_are_refused(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, secret = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    hostile_progress = [
        {"cells_done": 1, "cells_total": 2, "variant": f"base{NUL}"},
        {"cells_done": 2**31, "cells_total": 2},
        {"cells_done": 1, "cells_total": 2, "invalid": [{"reason": f"oom{NUL}"}]},
        {"cells_done": 1, "cells_total": 2, f"k{NUL}": 1},
    ]
    for progress in hostile_progress:
        beat = {"run_id": run_id, "attempt": 1, "progress": progress}
        _one_line_422(client.post("/api/v1/workers/heartbeat", json=beat, headers=bearer(secret)))
    content = b"x\n"
    assert upload(client, secret, run_id, "records.jsonl", content).status_code == 201
    assert upload(client, secret, run_id, "provenance.json", content).status_code == 201
    manifest = manifest_for({"records.jsonl": content, "provenance.json": content})
    hostile_manifest = {**manifest, "provenance": {"host": {"chip": f"M3{NUL}"}}}
    _one_line_422(complete(client, secret, run_id, hostile_manifest))
    _one_line_422(complete(client, secret, run_id, manifest, reason=f"oom{NUL}"))
    run = db_session.get(Run, run_id)
    db_session.refresh(run)
    assert run.state == "leased" and run.progress is None
    # The same requests without the hostile bytes are accepted.
    assert complete(client, secret, run_id, manifest).status_code == 200


def test_submitted_bisect_steps_are_refused(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    key = make_api_key(db_session)
    payload = job_payload(
        mode="bisect",
        adapter="mlx-lm",
        repository="mlx-lm",
        variants=[{"name": "cfg"}],
        contexts=[64],
        bisect={
            "good": "v1",
            "bad": "main",
            "direction": "slower",
            "steps": [
                {"lo": "a" * 40, "hi": "b" * 40, "decision": "lower", "evidence_id": "f" * 24}
            ],
        },
    )
    refused = client.post("/api/v1/jobs", json=payload, headers=bearer(key))
    _one_line_422(refused)
    assert refused.json()["field"] == "bisect.steps"
    assert "recorded by the service" in refused.json()["detail"]


# --- isolation: one host misbehaves while 20 others lease and submit ------------------------

GOOD_HOSTS = 20
ROUNDS = 3


@pytest.mark.postgres
def test_one_hostile_host_fails_only_its_own_requests(live_db: str, tmp_path: Path) -> None:
    """On PostgreSQL with real commits and the app's own async engine: 20 hosts lease (their
    claims grouped in shared transactions) and submit jobs while one enrolled host sends every
    hostile body it can, concurrently. Only the hostile host's requests are refused."""
    settings = Settings(
        database_url=live_db,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        rehearse_at_start=False,
        lease_wait_max_s=1,
        lease_poll_s=0.2,
        # The subject is isolation, not the bounded wait: on a loaded 2-core machine 21
        # threads' requests can wait over the default 1 s for the database and get a 503
        # (retry later) that no hostile byte caused.
        db_request_timeout_s=30,
    )
    engine = make_engine(live_db)
    sessions = make_sessionmaker(engine)
    with sessions() as db_session:
        good = [make_host(db_session, f"good-{i:02d}")[1] for i in range(GOOD_HOSTS)]
        _, hostile = make_host(db_session, "hostile")
        keys = [make_api_key(db_session, f"key-{i:02d}") for i in range(GOOD_HOSTS)]
        for _ in range(GOOD_HOSTS):
            make_job(db_session, settings)
    statuses: dict[str, list[int]] = {"good": [], "hostile": []}
    lock = threading.Lock()
    start = threading.Barrier(GOOD_HOSTS + 1)

    def note(who: str, status: int) -> None:
        with lock:
            statuses[who].append(status)

    with dispatch.use_sender(SentTasks()), TestClient(create_app(settings)) as client:

        def honest(index: int) -> None:
            start.wait()
            for round_ in range(ROUNDS):
                leased = lease(client, good[index], wait_s=1)
                note("good", leased.status_code)
                submitted = client.post(
                    "/api/v1/jobs",
                    json=job_payload(seed=index * ROUNDS + round_),
                    headers=bearer(keys[index]),
                )
                note("good", submitted.status_code)

        def misbehave() -> None:
            start.wait()
            for _ in range(ROUNDS):
                for hostile_fingerprint in HOSTILE_FINGERPRINTS:
                    note(
                        "hostile",
                        lease(client, hostile, fingerprint=hostile_fingerprint).status_code,
                    )
                for number in NON_FINITE:
                    text = f'{{"fingerprint": {{"hostname": "h", "cores": {number}}}}}'
                    note("hostile", _raw_post(client, "/api/v1/leases", text, hostile).status_code)
                beat = {"progress": {"cells_done": 0, "cells_total": 1, "variant": NUL}}
                beat_response = client.post(
                    "/api/v1/workers/heartbeat", json=beat, headers=bearer(hostile)
                )
                note("hostile", beat_response.status_code)

        with ThreadPoolExecutor(GOOD_HOSTS + 1) as pool:
            futures = [pool.submit(honest, i) for i in range(GOOD_HOSTS)]
            futures.append(pool.submit(misbehave))
            for future in futures:
                future.result()
        listed = client.get("/api/v1/hosts", headers=bearer(keys[0]))
    assert listed.status_code == 200 and len(listed.json()) == GOOD_HOSTS + 1
    assert len(statuses["good"]) == 2 * GOOD_HOSTS * ROUNDS
    assert set(statuses["good"]) <= {200, 201, 204}, statuses["good"]
    assert statuses["good"].count(201) == GOOD_HOSTS * ROUNDS  # every submission stored
    assert set(statuses["hostile"]) == {422}, statuses["hostile"]
    with sessions() as db_session:
        leased = db_session.scalar(
            sa.select(sa.func.count()).select_from(Run).where(Run.state == "leased")
        )
        hostile_row = db_session.scalars(sa.select(Host).where(Host.name == "hostile")).one()
    engine.dispose()
    assert leased == GOOD_HOSTS  # each honest host holds one run, none doubled
    assert hostile_row.fingerprint == fingerprint(hostname="hostile")
