"""Builders for page tests: the CSRF field of a page, a browser login, published evidence."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.artifacts.store import LocalArtifactStore
from coldbench.api.evidence import service as evidence_service
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import build_bundle
from coldbench.evidence.contract.schemas import Provenance, Record
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
            rounds=8,  # enough for a verdict over two contexts (coldbench.evidence.analysis.stats)
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
    """The bundle of these records stored and published by the code render_evidence runs."""
    files, summary = build_bundle(records=records, provenances=provenances, **build)
    store = LocalArtifactStore(settings.artifact_dir)
    for content in files.values():
        store.put_bytes(content)
    job.summary = summary.to_json_value()
    return evidence_service.publish(db_session=db_session, store=store, job=job, files=files)
