"""Sizes are refused before any per-item work, and bad input never makes a 500."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.settings import Settings
from tests.api.conftest import bearer
from tests.api.factories import fingerprint, job_payload, make_api_key, make_host, make_job


@pytest.fixture
def secrets_(client: TestClient, db_session: Session, settings: Settings) -> dict[str, str]:
    _, worker = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    leased = client.post(
        "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 0}, headers=bearer(worker)
    )
    assert leased.status_code == 200, leased.text
    return {"worker": worker, "key": make_api_key(db_session), "run": leased.json()["run_id"]}


# --- 5. size checks first ------------------------------------------------------------------


def test_a_body_over_the_limit_is_refused_unread(
    client: TestClient, secrets_: dict[str, str], settings: Settings
) -> None:
    too_big = b'{"x": "' + b"a" * settings.max_request_body_bytes + b'"}'
    declared = client.post(
        "/api/v1/jobs",
        content=too_big,
        headers={**bearer(secrets_["key"]), "Content-Type": "application/json"},
    )
    assert declared.status_code == 413, declared.text
    assert "limit" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it streams
        for start in range(0, len(too_big), 65536):
            yield too_big[start : start + 65536]

    streamed = client.post(
        "/api/v1/jobs",
        content=chunks(),
        headers={**bearer(secrets_["key"]), "Content-Type": "application/json"},
    )
    assert streamed.status_code == 413, streamed.text
    assert "limit" in streamed.json()["detail"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"variants": [{"name": f"v{i}"} for i in range(20_000)]}, "20000 variants"),
        (
            {"mode": "ablation", "features": [f"f{i}" for i in range(4_000)]},
            "4000 ablation features",
        ),
        ({"contexts": list(range(1, 5_000))}, "4999 contexts"),
        ({"host_labels": [f"l{i}" for i in range(5_000)]}, "5000 host labels"),
    ],
)
def test_long_lists_are_refused_by_their_length_first(
    client: TestClient,
    secrets_: dict[str, str],
    settings: Settings,
    overrides: dict[str, Any],
    message: str,
) -> None:
    settings.max_request_body_bytes = 8 << 20  # the list, not the body, must be what is refused
    response = client.post(
        "/api/v1/jobs", json=job_payload(**overrides), headers=bearer(secrets_["key"])
    )
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]


def test_duplicate_checks_are_linear() -> None:
    """The per-item checks count once (a Counter), not once per item (list.count)."""
    import coldbench.evidence.contract.schemas
    import coldbench.evidence.contract.variant

    for module in (coldbench.evidence.contract.schemas, coldbench.evidence.contract.variant):
        source = open(module.__file__, encoding="utf-8").read()  # noqa: SIM115
        assert ".count(" not in source, module.__name__


# --- 6. no 500s -------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [2**31, 2**63, 10**30])
def test_attempt_beyond_the_integer_column_is_422(
    client: TestClient, secrets_: dict[str, str], attempt: int
) -> None:
    run, worker = secrets_["run"], bearer(secrets_["worker"])
    calls = [
        client.post(
            f"/api/v1/runs/{run}/complete",
            json={"attempt": attempt, "status": "failed", "manifest": {}},
            headers=worker,
        ),
        client.post(
            "/api/v1/workers/heartbeat", json={"run_id": run, "attempt": attempt}, headers=worker
        ),
        client.put(
            f"/api/v1/runs/{run}/artifacts/records.jsonl?attempt={attempt}",
            content=b"x",
            headers={**worker, "X-Content-SHA256": "0" * 64},
        ),
    ]
    assert [call.status_code for call in calls] == [422, 422, 422], [c.text for c in calls]


@pytest.mark.parametrize("constant", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_in_json_are_422(
    client: TestClient, secrets_: dict[str, str], constant: str
) -> None:
    worker, key = bearer(secrets_["worker"]), bearer(secrets_["key"])
    run = secrets_["run"]
    bodies = [
        ("/api/v1/jobs", key, '{"schema": "coldbench.job/1", "precision": %s}'),
        ("/api/v1/jobs", key, '{"variants": [{"name": "a", "flags": {"x": %s}}]}'),
        ("/api/v1/leases", worker, '{"fingerprint": {"cores": %s}, "wait_s": 0}'),
        ("/api/v1/workers/heartbeat", worker, '{"run_id": "' + run + '", "attempt": %s}'),
        (
            f"/api/v1/runs/{run}/complete",
            worker,
            '{"attempt": 1, "status": "failed", "manifest": {"x": %s}}',
        ),
    ]
    for path, headers, template in bodies:
        response = client.post(
            path,
            content=(template % constant).encode(),
            headers={**headers, "Content-Type": "application/json"},
        )
        assert response.status_code == 422, (path, response.text)
        assert "non-finite" in response.text or constant in response.text


# Routers whose routes are not StrictJSONRoute yet, by their module: their JSON is still held
# to the door's text rule (api/routing.py: DoorMiddleware, before every route), not yet to the
# strict parser's refusal of NaN and 1e999. api/github is another engineer's to change.
NOT_YET_STRICT = {"coldbench.api.github.router"}


def _api_routes(routes: list[Any], module: str = "coldbench.api.app") -> list[tuple[APIRoute, str]]:
    """Every APIRoute of the app with the module of the router holding it, included routers'
    too (FastAPI keeps an included router's routes in that router)."""
    found: list[tuple[APIRoute, str]] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append((route, module))
        elif hasattr(route, "original_router"):
            router = route.original_router
            owner = next(
                (
                    name
                    for name, loaded in sys.modules.items()
                    if name.startswith("coldbench.api.")
                    and getattr(loaded, "router", None) is router
                ),
                "?",
            )
            found += _api_routes(router.routes, owner)
    return found


def test_every_route_parses_json_strictly(client: TestClient) -> None:
    from coldbench.api.routing import StrictJSONRoute

    routes = _api_routes(client.app.routes)  # type: ignore[attr-defined]
    assert len(routes) >= 20
    loose = sorted(
        f"{module}: {route.path}"
        for route, module in routes
        if not isinstance(route, StrictJSONRoute) and module not in NOT_YET_STRICT
    )
    assert loose == []
