"""Schemathesis against the app's own OpenAPI schema, as every principal: no 5xx.

Every operation, with valid and invalid inputs (positive and negative generation), sent as the
anonymous caller, a submitter, a worker holding a lease and the admin; on SQLite and on
PostgreSQL (whose 32-bit integer columns are the edge SQLite lacks). Bounded: a fixed number of
derandomized examples per operation, well under a minute per database.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from sqlalchemy.orm import Session

from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import bearer
from tests.api.factories import fingerprint, job_payload, make_api_key, make_host, make_job

ADMIN_TOKEN = "an admin token for the fuzzer"
EXAMPLES_PER_OPERATION = 15


@pytest.fixture
def principals(client: TestClient, db_session: Session, settings: Settings) -> dict[str, Any]:
    settings.admin_token_sha256 = sha256_hex(ADMIN_TOKEN.encode())
    settings.lease_wait_max_s = 0  # a long-poll answers at once: the fuzzer is not a host
    _, worker = make_host(db_session, "studio-1")
    make_job(db_session, settings)
    leased = client.post(
        "/api/v1/leases", json={"fingerprint": fingerprint(), "wait_s": 0}, headers=bearer(worker)
    )
    assert leased.status_code == 200, leased.text
    return {
        "anonymous": {},
        "submitter": bearer(make_api_key(db_session)),
        "worker": bearer(worker),
        "admin": bearer(ADMIN_TOKEN),
    }


def test_no_operation_answers_5xx_for_any_principal(
    client: TestClient, principals: dict[str, Any]
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures: list[str] = []
    for operation in operations:
        _probe(operation, principals, failures)()
    assert failures == [], "\n".join(failures[:20])


WORKER_EXAMPLES_PER_OPERATION = 40


def test_the_worker_protocol_answers_no_5xx_to_an_enrolled_host(
    client: TestClient, db_session: Session, settings: Settings, principals: dict[str, Any]
) -> None:
    """Every operation a host's secret opens, with the secret of a host holding a lease, more
    examples each; afterwards every submitter's job still finds its hosts (nothing a host
    sent poisoned what others read)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    worker_paths = ("/api/v1/workers/", "/api/v1/leases", "/api/v1/runs/")
    operations = [
        result.ok()
        for result in schema.get_all_operations()
        if result.ok().path.startswith(worker_paths)
    ]
    assert len(operations) >= 5
    failures: list[str] = []
    for operation in operations:
        _probe(
            operation,
            {"worker": principals["worker"]},
            failures,
            examples=WORKER_EXAMPLES_PER_OPERATION,
        )()
    assert failures == [], "\n".join(failures[:20])
    # The fuzzed host reported whatever models it liked; a clean host takes the job, judged
    # beside the fuzzed one's stored columns.
    make_host(db_session, "studio-2")
    submitted = client.post("/api/v1/jobs", json=job_payload(), headers=principals["submitter"])
    assert submitted.status_code == 201, submitted.text
    assert client.get("/api/v1/hosts", headers=principals["submitter"]).status_code == 200


def _probe(
    operation: Any,
    principals: dict[str, Any],
    failures: list[str],
    *,
    examples: int = EXAMPLES_PER_OPERATION,
) -> Any:
    """A bounded hypothesis test of one operation: its valid and invalid cases, any principal."""
    label = f"{operation.method.upper()} {operation.path}"
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # report, do not spend minutes shrinking
    )
    @given(case=cases, who=st.sampled_from(sorted(principals)))
    def probe(case: Any, who: str) -> None:
        try:
            response = case.call(headers={**(case.headers or {}), **principals[who]}, timeout=30)
        except Exception as error:  # noqa: BLE001 - every escape is a finding
            failures.append(f"{label} as {who}: {error!r}")
            return
        if response.status_code >= 500:
            failures.append(
                f"{label} as {who}: {response.status_code} {response.text[:200]} "
                f"<- {case.as_curl_command()}"
            )

    return probe
