"""Ingest of completed runs, in-process on SQLite and PostgreSQL: verify, validate, insert once."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api import tasks
from coldbench.api.auth.models import AuditEvent
from coldbench.api.runs import ingest
from coldbench.api.runs.models import Cell, Run
from coldbench.api.settings import Settings
from tests.api.conftest import SentTasks
from tests.api.factories import make_api_key, make_host, make_job, record
from tests.api.test_endpoints import complete, lease, upload, upload_run

# Ingest inserts with each dialect's INSERT .. ON CONFLICT (api/runs/ingest.py).
pytestmark = pytest.mark.both_dialects


@pytest.fixture
def completed_run(client: TestClient, db_session: Session, settings: Settings) -> Run:
    _, secret = make_host(db_session, "a")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    manifest = upload_run(client, secret, run_id)
    assert complete(client, secret, run_id, manifest).status_code == 200
    return db_session.get(Run, run_id)


def _cells(db_session: Session, run_id: str) -> int:
    return db_session.scalar(sa.select(sa.func.count()).where(Cell.run_id == run_id))


def _ingest(db_session: Session, settings: Settings, client: TestClient, run_id: str) -> object:
    return ingest.ingest_run(
        db_session=db_session, settings=settings, store=client.app.state.store, run_id=run_id
    )


def test_ingest_inserts_every_record_once(
    client: TestClient, db_session: Session, settings: Settings, completed_run: Run
) -> None:
    settings.ingest_batch_size = 3
    job_id = _ingest(db_session, settings, client, completed_run.id)
    assert job_id == completed_run.job_id  # the only run: the job is ready for analysis
    # 2 warm-ups + 2 variants x 2 contexts x 2 rounds
    assert _cells(db_session, completed_run.id) == 10
    db_session.refresh(completed_run)
    assert completed_run.state == "processed" and completed_run.ingest_errors is None
    # The final count, not the last heartbeat's: the timed cells, as heartbeats count them
    # (the warm-ups are stored but not counted).
    assert completed_run.progress["cells_done"] == 8 and completed_run.progress["final"]
    # A redelivered task finds nothing to do.
    assert _ingest(db_session, settings, client, completed_run.id) is None
    assert _cells(db_session, completed_run.id) == 10


def test_reingest_after_a_partial_ingest_never_duplicates(
    client: TestClient, db_session: Session, settings: Settings, completed_run: Run
) -> None:
    _ingest(db_session, settings, client, completed_run.id)
    # As if the worker died after some batches: half the cells, the run still completed.
    ids = db_session.scalars(sa.select(Cell.id).where(Cell.run_id == completed_run.id)).all()
    db_session.execute(sa.delete(Cell).where(Cell.id.in_(ids[::2])))
    completed_run.state = "completed"
    db_session.commit()
    _ingest(db_session, settings, client, completed_run.id)
    rows = db_session.execute(
        sa.select(Cell.variant, Cell.round, Cell.context_tokens, Cell.status).where(
            Cell.run_id == completed_run.id, Cell.status != "warmup"
        )
    ).all()
    assert len(rows) == 8 and len(set(rows)) == 8
    assert _cells(db_session, completed_run.id) == 10


def test_invalid_lines_are_reported_and_the_rest_ingested(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, secret = make_host(db_session, "a")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    good = record(run_id, "base", 0, 64)
    lines = [
        json.dumps(good),
        "not json",
        json.dumps({**good, "round": 1, "cached_tokens": 5}),
        json.dumps({**good, "round": 2, "run_id": "someone-else"}),
    ]
    files = {
        "records.jsonl": ("\n".join(lines) + "\n").encode(),
        "provenance.json": b"{}",
    }
    for name, content in files.items():
        upload(client, secret, run_id, name, content)
    from tests.api.factories import manifest_for

    assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    _ingest(db_session, settings, client, run_id)
    run = db_session.get(Run, run_id)
    assert run.state == "processed" and _cells(db_session, run_id) == 1
    errors = run.ingest_errors
    assert errors[0].startswith("line 2: not JSON")
    assert errors[1].startswith("line 3: invalid record") and "cached_tokens=5" in errors[1]
    assert "line 4: run_id 'someone-else' is not this run" in errors[2]


def test_altered_store_fails_the_run(
    client: TestClient, db_session: Session, settings: Settings, completed_run: Run
) -> None:
    from coldbench.api.artifacts.models import Artifact

    records = db_session.scalars(
        sa.select(Artifact).where(
            Artifact.run_id == completed_run.id, Artifact.name == "records.jsonl"
        )
    ).one()
    path = client.app.state.store.path(records.sha256)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"\n")
    _ingest(db_session, settings, client, completed_run.id)
    db_session.refresh(completed_run)
    assert completed_run.state == "failed"
    assert "records.jsonl altered in the store" in completed_run.reason
    assert _cells(db_session, completed_run.id) == 0


def test_reprocess_sends_what_was_never_ingested(
    completed_run: Run, db_session: Session, sent_tasks: SentTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "_session", lambda: _borrowed(db_session))
    sent_tasks.calls.clear()
    tasks.reprocess_unprocessed.run()
    assert sent_tasks.named("ingest_run") == [(completed_run.id,)]


class _borrowed:
    """The test's session as a context manager that does not close it."""

    def __init__(self, db_session: Session) -> None:
        self.db_session = db_session

    def __enter__(self) -> Session:
        return self.db_session

    def __exit__(self, *exc: object) -> None:
        return None


def test_analysis_and_rendering_publish_evidence(
    client: TestClient, db_session: Session, settings: Settings, completed_run: Run
) -> None:
    from coldbench.api.evidence import service as evidence_service
    from coldbench.api.jobs.models import Job
    from coldbench.evidence.bundles.bundle import read_zip, verify_files

    store = client.app.state.store
    job_id = _ingest(db_session, settings, client, completed_run.id)
    assert evidence_service.analyze_job(db_session=db_session, store=store, job_id=job_id)
    job = db_session.get(Job, job_id)
    # Recomputed here from the cells: the candidate's records are 10% faster in every round.
    comparisons = job.summary["comparisons"]
    assert {c["variant"] for c in comparisons} == {"cand"}
    assert all(1.09 < c["ratio_median"] < 1.11 for c in comparisons), comparisons
    evidence_id = evidence_service.render_evidence(
        db_session=db_session, store=store, job_id=job_id
    )
    assert evidence_id and job.state == "done" and job.evidence_id == evidence_id
    # Both tasks are idempotent.
    assert (
        evidence_service.render_evidence(db_session=db_session, store=store, job_id=job_id)
        == evidence_id
    )
    assert not evidence_service.analyze_job(db_session=db_session, store=store, job_id=job_id)
    report = client.get(f"/e/{evidence_id}")
    assert report.status_code == 200 and "<html" in report.text.lower()
    assert client.get(f"/e/{evidence_id}.md").status_code == 200
    assert client.get(f"/e/{evidence_id}.json").json()["baseline"] == "base"
    files = read_zip(client.get(f"/e/{evidence_id}.zip").content)
    assert verify_files(files).is_intact
    assert {"records.jsonl", "provenance.json", "build-base.log", "report.html"} <= set(files)
    # Hosts are named as registered (here "a"), whatever hostname the machine reported.
    assert '"registered_name":"a"' in files["provenance.json"].decode()
    assert job.summary["runs"][0]["host"] == "a"


def test_analysis_failure_is_final_with_its_reason(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    completed_run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coldbench.api.evidence import service as evidence_service
    from coldbench.api.jobs.models import Job

    def refuse(**_kwargs: object) -> None:
        raise ValueError("summary needs at least one ok cell")

    monkeypatch.setattr("coldbench.api.evidence.service.build_bundle", refuse)
    job_id = _ingest(db_session, settings, client, completed_run.id)
    store = client.app.state.store
    assert not evidence_service.analyze_job(db_session=db_session, store=store, job_id=job_id)
    job = db_session.get(Job, job_id)
    assert job.state == "failed" and job.reason.endswith("needs at least one ok cell")
    # failed the one way every analysis failure is (evidence_service.fail_analysis): audited
    audited = db_session.scalars(
        sa.select(AuditEvent.detail).where(
            AuditEvent.kind == "job.analysis_failed", AuditEvent.subject_id == job_id
        )
    ).all()
    assert audited == [{"reason": job.reason}]


def test_numbers_a_column_or_json_cannot_hold_fail_their_lines_only(
    client: TestClient, db_session: Session, settings: Settings
) -> None:
    _, secret = make_host(db_session, "a")
    make_job(db_session, settings)
    run_id = lease(client, secret).json()["run_id"]
    good = record(run_id, "base", 0, 64)
    lines = [
        json.dumps(good),
        json.dumps({**good, "round": 1}).replace('"prefill_s": 0.064', '"prefill_s": 1e999'),
        json.dumps({**good, "round": 2**31}),
        json.dumps({**good, "round": 3, "reason": "x\u0000"}),
    ]
    assert '"prefill_s": 1e999' in lines[1]
    files = {"records.jsonl": ("\n".join(lines) + "\n").encode(), "provenance.json": b"{}"}
    for name, content in files.items():
        upload(client, secret, run_id, name, content)
    from tests.api.factories import manifest_for

    assert complete(client, secret, run_id, manifest_for(files)).status_code == 200
    _ingest(db_session, settings, client, run_id)
    run = db_session.get(Run, run_id)
    assert run.state == "processed" and _cells(db_session, run_id) == 1
    assert [error.split(":")[0] for error in run.ingest_errors] == ["line 2", "line 3", "line 4"]
    assert "too large for a 64-bit float" in run.ingest_errors[0]
    assert "less than or equal to 2147483647" in run.ingest_errors[1]
    assert "control character U+0000" in run.ingest_errors[2]


@pytest.mark.both_dialects
def test_an_ingest_the_database_refuses_fails_the_run_once_with_its_reason(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    completed_run: Run,
    sent_tasks: SentTasks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows the database refuses (here a value past every integer column, past validation):
    the task fails the run with the database's reason, once; nothing sends it again."""
    from coldbench.api.jobs.models import Job

    parse = ingest.parse_cells

    def beyond_every_column(raw: bytes, run: Run) -> tuple[list, list]:
        rows, problems = parse(raw, run)
        return [{**rows[0], "round": 2**64}, *rows[1:]], problems

    monkeypatch.setattr(ingest, "parse_cells", beyond_every_column)
    monkeypatch.setattr(tasks, "_session", lambda: _borrowed(db_session))
    monkeypatch.setattr(tasks, "_settings", lambda: settings)
    monkeypatch.setattr(tasks, "_store", lambda: client.app.state.store)
    sent_tasks.calls.clear()
    tasks.ingest_run.run(completed_run.id)
    db_session.expire_all()
    run = db_session.get(Run, completed_run.id)
    assert run.state == "failed" and run.reason.startswith("ingest failed: ")
    job = db_session.get(Job, run.job_id)
    assert job.state == "failed"
    # Shown where a submitter looks: the job's API answer carries the run's reason.
    key = make_api_key(db_session)
    shown = client.get(f"/api/v1/jobs/{job.id}", headers={"Authorization": f"Bearer {key}"})
    assert shown.json()["runs"][0]["reason"] == run.reason
    # Once: neither the task again nor beat's reprocessing sends anything more.
    tasks.ingest_run.run(completed_run.id)
    tasks.reprocess_unprocessed.run()
    assert sent_tasks.calls == []


def test_an_analysis_that_raises_fails_the_job_once_with_its_reason(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    completed_run: Run,
    sent_tasks: SentTasks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coldbench.api.jobs.models import Job

    def broken(**_kwargs: object) -> None:
        raise KeyError("records.jsonl")

    monkeypatch.setattr("coldbench.api.evidence.service.build_bundle", broken)
    monkeypatch.setattr(tasks, "_session", lambda: _borrowed(db_session))
    monkeypatch.setattr(tasks, "_store", lambda: client.app.state.store)
    job_id = _ingest(db_session, settings, client, completed_run.id)
    sent_tasks.calls.clear()
    tasks.analyze_job.run(job_id)
    job = db_session.get(Job, job_id)
    db_session.refresh(job)
    assert job.state == "failed"
    assert job.reason == "analysis failed: KeyError: 'records.jsonl'"
    tasks.reprocess_unprocessed.run()
    assert sent_tasks.calls == []
