"""Reproductions uploaded to the service: `POST /api/v1/evidence/{id}/reproductions` keeps a
host's reproduction bundle of published evidence, and the page and PR Markdown gain its row with
the hosts' agreement; bad uploads (a wrong token, a digest that differs, a corrupt zip, another
job) are refused with what was wrong and store nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.reproductions.models import EvidenceReproduction
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import build_bundle, zip_bytes
from coldbench.evidence.contract.canonical import canonical_json, sha256_hex
from coldbench.evidence.contract.schemas import JobSpec
from tests.api.conftest import bearer
from tests.api.factories import job_payload, make_host, make_job
from tests.evidence.builders import provenance, simulate_run
from tests.web.builders import publish_bundle

pytestmark = pytest.mark.both_dialects

SPEC = job_payload(
    variants=[{"name": "base", "flags": {}}, {"name": "fast", "flags": {"clear_cache": False}}],
    contexts=[64, 128],
    rounds=8,
)


def _bundle(
    run_id: str, host: str, *, effect: float = 1.2, reproduces: str | None = None, **spec: Any
) -> dict[str, bytes]:
    measured = provenance(run_id=run_id, hostname=host)
    extra = {}
    if reproduces is not None:
        extra["reproduces.json"] = canonical_json({"evidence_id": reproduces, "source": "test"})
    files, _ = build_bundle(
        records=simulate_run(
            effects={"base": 1.0, "fast": effect}, contexts=(64, 128), rounds=8, run_id=run_id
        ),
        provenances=[measured],
        spec=JobSpec.model_validate({**SPEC, **spec}),
        extra_files=extra,
    )
    return files


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A bundle's zip inlines plotly.js (megabytes): the upload limit of a real server."""
    return settings.model_copy(update={"max_artifact_bytes": 64 << 20})


@pytest.fixture
def published(client: TestClient, db_session: Session, settings: Settings) -> str:
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings, **SPEC)
    files = _bundle("r-1", "studio-1")
    measured = provenance(run_id="r-1", hostname="studio-1")
    measured.host.registered_name = "studio-1"
    return publish_bundle(
        db_session,
        settings,
        job,
        records=simulate_run(
            effects={"base": 1.0, "fast": 1.2}, contexts=(64, 128), rounds=8, run_id="r-1"
        ),
        provenances=[measured],
        spec=JobSpec.model_validate_json(files["job.json"]),
    )


def _upload(
    client: TestClient, evidence_id: str, body: bytes, token: str, sha256: str | None = None
) -> Any:
    return client.post(
        f"/api/v1/evidence/{evidence_id}/reproductions",
        content=body,
        headers={
            **bearer(token),
            "X-Content-SHA256": sha256 or sha256_hex(body),
            "Content-Type": "application/zip",
        },
    )


def test_a_reproduction_adds_its_host_to_the_page_and_the_markdown(
    client: TestClient, db_session: Session, published: str
) -> None:
    page = client.get(f"/e/{published}")
    markdown = client.get(f"/e/{published}.md")
    assert page.headers["cache-control"] == "public, no-cache"
    assert "Reproduced on other hosts" not in page.text
    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    answer = _upload(client, published, body, secret)
    assert answer.status_code == 201, answer.text
    accepted = answer.json()
    assert accepted["host"] == "lab-2" and accepted["created"] is True
    assert any(line.startswith("  hosts agree within") for line in accepted["lines"])
    assert _upload(client, published, body, secret).json()["created"] is False  # idempotent
    assert _upload(client, published, body, secret).status_code == 200
    # The cached page is stale now: its ETag no longer matches, the new page has the row.
    again = client.get(f"/e/{published}", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 200 and again.headers["etag"] != page.headers["etag"]
    assert '<section id="cb-hosts">' in again.text and "lab-2" in again.text
    assert "hosts agree within" in again.text
    assert again.text.count("### Reproduced on other hosts") == 1  # in the Markdown box
    same = client.get(f"/e/{published}", headers={"If-None-Match": again.headers["etag"]})
    assert same.status_code == 304
    md = client.get(f"/e/{published}.md", headers={"If-None-Match": markdown.headers["etag"]})
    assert md.status_code == 200 and "### Reproduced on other hosts" in md.text
    assert "| fast | " in md.text and "lab-2" in md.text
    (row,) = db_session.query(EvidenceReproduction).all()
    assert row.evidence_id == published and row.hosts[0]["label"] == "lab-2"
    # the bundle's own files are unchanged
    json_file = client.get(f"/e/{published}.json")
    assert "immutable" in json_file.headers["cache-control"] and b"lab-2" not in json_file.content


def test_bad_uploads_are_refused_with_the_reason_and_store_nothing(
    client: TestClient, db_session: Session, published: str
) -> None:
    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    wrong = _upload(client, published, body, "cbw_nothing_" + "a" * 30)
    assert wrong.status_code == 401
    differs = _upload(client, published, body, secret, sha256="0" * 64)
    assert differs.status_code == 422 and "sha256" in differs.json()["detail"]
    corrupt = bytearray(body)
    corrupt[len(corrupt) // 2] ^= 0xFF
    broken = _upload(client, published, bytes(corrupt), secret)
    assert broken.status_code == 422 and "nothing stored" in broken.json()["detail"]
    other = zip_bytes(_bundle("x-1", "lab-2", reproduces=published, seed=7))
    another_job = _upload(client, published, other, secret)
    assert another_job.status_code == 409, another_job.text
    detail = another_job.json()["detail"]
    assert "another job" in detail and "job.seed: 0 vs 7" in detail
    unnamed = _upload(client, published, zip_bytes(_bundle("x-1", "lab-2")), secret)
    assert unnamed.status_code == 422 and "reproduces.json" in unnamed.json()["detail"]
    elsewhere = zip_bytes(_bundle("x-1", "lab-2", reproduces="f" * 24))
    assert _upload(client, published, elsewhere, secret).status_code == 409
    missing = _upload(client, "e" * 24, body, secret)
    assert missing.status_code == 404
    assert db_session.query(EvidenceReproduction).count() == 0
    page = client.get(f"/e/{published}")
    assert page.status_code == 200 and "cb-hosts" not in page.text
