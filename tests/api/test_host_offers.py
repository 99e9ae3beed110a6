"""What hosts registered (repositories, adapters, options) decides at submit which jobs the API
accepts; each refusal names the field to change, in the message and in the JSON body."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.hosts.models import Host
from tests.api.conftest import bearer
from tests.api.factories import fingerprint, job_payload, make_api_key, make_host

SERVER = {
    "adapter": "openai-server",
    "recipes": ["editable"],
    "options": {
        "fast": {"type": "bool", "proof": True},
        "prefill_step_size": {"type": "int", "min": 1, "max": 8192},
    },
}


def _server_job(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "adapter": "openai-server",
        "repository": "mlx-server",
        "variants": [
            {"name": "off", "ref": "main", "flags": {"fast": 0}},
            {"name": "on", "ref": "main", "flags": {"fast": 1, "prefill_step_size": 4096}},
        ],
    }
    return job_payload(**{**fields, **overrides})


@pytest.fixture
def key(db_session: Session) -> str:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    make_host(db_session, "studio-2", labels=["lab:home"], repositories={"mlx-server": SERVER})
    return make_api_key(db_session)


def _submit(client: TestClient, key: str, payload: dict[str, Any]) -> Any:
    return client.post("/api/v1/jobs", json=payload, headers=bearer(key))


def test_a_job_some_host_can_run_is_accepted(client: TestClient, key: str) -> None:
    response = _submit(client, key, _server_job())
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        (
            job_payload(adapter="mlx-lm", repository="evil", variants=[{"name": "a", "ref": "m"}]),
            "repository",
            "studio-1 does not allow repository 'evil'; studio-2 does not allow",
        ),
        (
            job_payload(
                adapter="mlx-lm", repository="mlx-server", variants=[{"name": "a", "ref": "m"}]
            ),
            "adapter",
            "studio-2 drives mlx-server with the openai-server adapter, not mlx-lm",
        ),
        (
            _server_job(variants=[{"name": "a", "ref": "m", "flags": {"turbo": 1}}]),
            "variants.0.flags",
            "declares no option turbo for mlx-server "
            "(options: fast (bool), prefill_step_size (int 1..8192))",
        ),
        (
            _server_job(
                variants=[
                    {"name": "a", "ref": "m"},
                    {"name": "b", "ref": "m", "flags": {"prefill_step_size": 65536}},
                ]
            ),
            "variants.1.flags",
            "refuses prefill_step_size=65536: 65536 is above the maximum 8192",
        ),
        (
            _server_job(variants=[{"name": "a", "ref": "m", "flags": {"fast": 2}}]),
            "variants.0.flags",
            "refuses fast=2: 2 is not true, false, 1 or 0",
        ),
        (
            _server_job(mode="ablation", features=["prefill_step_size=0"]),
            "features",
            "refuses prefill_step_size=0: 0 is below the minimum 1",
        ),
        (
            job_payload(host_labels=["gpu:h200"]),
            "host_labels",
            "studio-1 lacks labels gpu:h200; studio-2 lacks labels gpu:h200",
        ),
        (job_payload(model="llama-8b"), "model", "studio-1 has no model 'llama-8b'"),
    ],
    ids=[
        "repository",
        "adapter",
        "unknown-option",
        "int-bounds",
        "bool",
        "feature",
        "labels",
        "model",
    ],
)
def test_a_job_no_host_can_run_is_refused_naming_the_field(
    client: TestClient, key: str, payload: dict[str, Any], field: str, message: str
) -> None:
    response = _submit(client, key, payload)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field
    assert body["detail"].startswith("no registered host can run this job: ")
    assert message in body["detail"]
    assert "\n" not in body["detail"]


def test_spec_errors_carry_their_field(client: TestClient, key: str) -> None:
    response = _submit(client, key, job_payload(contexts=[64, 64]))
    assert response.status_code == 422
    assert response.json()["field"] == "contexts"
    response = _submit(client, key, job_payload(baseline="nope"))
    assert response.json()["field"] == "baseline"
    assert "baseline 'nope' is not one of the variants" in response.json()["detail"]
    response = _submit(client, key, job_payload(rounds=100000))
    assert response.json()["field"] == "rounds"
    # Errors about no field keep the old body: just the detail.
    response = client.get("/api/v1/jobs/nope", headers=bearer(key))
    assert response.status_code == 404 and set(response.json()) == {"detail"}


def test_a_lease_request_updates_what_the_host_offers(
    client: TestClient, db_session: Session, key: str
) -> None:
    """An edited worker.toml is seen at the next lease, not only at the next enrollment."""
    _host, secret = make_host(
        db_session, "studio-3", repositories={"old": {"recipes": ["editable"]}}
    )
    offer = {"adapter": "openai-server", "recipes": ["editable"], "options": {}}
    response = client.post(
        "/api/v1/leases",
        json={
            "fingerprint": fingerprint(),
            "wait_s": 0,
            "repositories": {"new-server": offer},
            "models": ["llama-8b"],
        },
        headers=bearer(secret),
    )
    assert response.status_code == 204, response.text
    db_session.expire_all()
    host = db_session.query(Host).filter_by(name="studio-3").one()
    assert host.repositories == {"new-server": offer}
    assert host.models == ["llama-8b"]
    # An agent that sends neither keeps what it registered.
    response = client.post(
        "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 0}, headers=bearer(secret)
    )
    assert response.status_code == 204
    db_session.expire_all()
    assert db_session.query(Host).filter_by(name="studio-3").one().models == ["llama-8b"]


def test_registration_refuses_a_malformed_option_naming_it(
    client: TestClient, db_session: Session
) -> None:
    from coldbench.api.auth import service as auth_service

    token = auth_service.create_enrollment_token(db_session=db_session, labels=[])
    body = {
        "name": "studio-9",
        "fingerprint": fingerprint(),
        "repositories": {"srv": {**SERVER, "options": {"fast": {"type": "bool", "min": 0}}}},
    }
    response = client.post("/api/v1/workers/register", json=body, headers=bearer(token))
    assert response.status_code == 422
    assert "a bool option has no bounds" in response.text
    assert "options" in response.text
