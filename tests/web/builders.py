"""Builders for page tests: the CSRF field of a page, a browser login, published evidence."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.artifacts.store import LocalArtifactStore
from api.auth import service as auth_service
from api.evidence.models import Evidence
from api.jobs.models import Job
from api.settings import Settings
from evidence.bundle import MANIFEST_FILE, build_bundle, evidence_id_of, zip_bytes
from evidence.schemas import Provenance, Record
from tests.evidence.builders import provenance, simulate_run

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF field in the page"
    return match.group(1)


def login(client: TestClient, api_key: str, next_path: str = "/") -> None:
    page = client.get("/login")
    response = client.post(
        "/login",
        data={"api_key": api_key, "csrf_token": csrf_of(page.text), "next": next_path},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text


def publish_evidence(
    db_session: Session,
    settings: Settings,
    job: Job,
    *,
    hosts: tuple[str, ...] = ("studio-1",),
    effects: dict[str, float] | None = None,
    host_effects: dict[str, dict[str, float]] | None = None,
    machine_hostname: str | None = None,
) -> str:
    """Evidence of a simulated run per host, stored and published the way the API's
    render_evidence does (bundle files and zip in the store, an Evidence row, the job's
    summary). `hosts` are registered names; `machine_hostname` is what every machine reports
    (default: its registered name)."""
    effects = effects or {"base": 1.0, "fast": 1.2}
    records = []
    provenances = []
    for index, host in enumerate(hosts):
        run_id = f"r-{index + 1}"
        records += simulate_run(
            effects=(host_effects or {}).get(host, effects),
            contexts=(64, 128),
            rounds=8,  # enough for a verdict over two contexts (evidence.stats)
            run_id=run_id,
            seed=index,
        )
        measured = provenance(run_id=run_id, hostname=machine_hostname or host)
        measured.host.registered_name = host
        provenances.append(measured)
    return publish_bundle(
        db_session, settings, job, records=records, provenances=provenances, baseline="base"
    )


def publish_bundle(
    db_session: Session,
    settings: Settings,
    job: Job,
    *,
    records: list[Record],
    provenances: list[Provenance],
    **build: Any,
) -> str:
    """The bundle of these records stored and published as render_evidence does."""
    files, summary = build_bundle(records=records, provenances=provenances, **build)
    store = LocalArtifactStore(settings.artifact_dir)
    stored: dict[str, Any] = {}
    for name in ("report.html", "summary.md", "summary.json", MANIFEST_FILE):
        blob = store.put_bytes(files[name])
        stored[name] = {"sha256": blob.sha256, "bytes": blob.bytes}
    zipped = store.put_bytes(zip_bytes(files))
    stored["bundle.zip"] = {"sha256": zipped.sha256, "bytes": zipped.bytes}
    evidence_id = evidence_id_of(files[MANIFEST_FILE])
    db_session.add(
        Evidence(
            id=evidence_id,
            job_id=job.id,
            manifest_sha256=stored[MANIFEST_FILE]["sha256"],
            files=stored,
        )
    )
    job.evidence_id = evidence_id
    job.summary = summary.to_json_value()
    job.state = "done"
    auth_service.record_audit(
        db_session=db_session, actor="test", kind="evidence.published", subject_id=job.id
    )
    db_session.commit()
    return evidence_id
