"""Ingest: re-verify a completed run's stored artifacts, validate its records, insert cells.

Idempotent: cells are unique per (run, line) and per measured (run, variant, round, context),
and inserts skip rows that exist, so a redelivered task after a crash mid-ingest (batches are
committed one by one) completes the run without counting anything twice.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from coldbench.api.artifacts import service as artifact_service
from coldbench.api.artifacts.models import Artifact
from coldbench.api.artifacts.store import ArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.errors import validation_message
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Cell, Run
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import JOB_FILE
from coldbench.evidence.contract.boundary import strict_json_loads
from coldbench.evidence.contract.protocol import RunState
from coldbench.evidence.contract.schemas import JobSpec, Record
from coldbench.evidence.spec.resolution import resolution_problem

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"


def parse_cells(raw: bytes, run: Run) -> tuple[list[dict[str, Any]], list[str]]:
    """Cell rows for every valid line, and `line N: why` for every invalid one."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], [f"{RECORDS_FILE} is not UTF-8 ({error.reason} at byte {error.start})"]
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            # pydantic's parser and validation in one call; a line it refuses is read again
            # strictly, for the message that says why (evidence/contract/records.py
            # parse_record_line).
            record = Record.model_validate_json(line)
        except ValidationError:
            try:
                record = Record.model_validate(strict_json_loads(line))
            except json.JSONDecodeError as error:
                problems.append(f"line {line_no}: not JSON ({error.msg})")
                continue
            except ValidationError as error:
                problems.append(f"line {line_no}: {validation_message('record', error)}")
                continue
        if record.run_id != run.id:
            problems.append(f"line {line_no}: run_id {record.run_id!r} is not this run {run.id}")
            continue
        rows.append(
            {
                "run_id": run.id,
                "job_id": run.job_id,
                "attempt": run.attempt,
                "line": line_no,
                "variant": record.variant,
                "round": record.round,
                "order": record.order,
                "context_tokens": record.context_tokens,
                "status": record.status,
                "reason": record.reason,
                "cached_tokens": record.cached_tokens,
                "prefill_s": record.prefill_s,
                "prefill_tps": record.prefill_tps,
                "decode_s": record.decode_s,
                "decode_tps": record.decode_tps,
                "peak_memory_bytes": record.peak_memory_bytes,
                "prompt_sha256": record.prompt_sha256,
                "output_sha256": record.output_sha256,
                "record": record.to_json_dict(),
            }
        )
    return rows, problems


def _resolved_spec(
    store: ArtifactStore, artifacts: list[Artifact], job_spec: JobSpec
) -> tuple[JobSpec | None, str | None]:
    """(the spec the host resolved, None) from the run's job.json, or (None, what is wrong).

    A run that never measured (refused: its job.json is the job's own spec) resolved nothing.
    """
    uploaded = next((a for a in artifacts if a.name == JOB_FILE), None)
    if uploaded is None:
        return None, f"the job left commits to resolve but the run uploaded no {JOB_FILE}"
    try:
        resolved = JobSpec.model_validate_json(store.read_bytes(uploaded.sha256))
    except ValidationError as error:
        return None, validation_message(f"{JOB_FILE} of the run", error)
    if resolved == job_spec:
        return None, None
    problem = resolution_problem(job_spec, resolved)
    if problem is not None:
        return None, f"{JOB_FILE} refused: {problem}"
    return resolved, None


def _insert_missing(db_session: Session, rows: list[dict[str, Any]]) -> None:
    dialect = db_session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    db_session.execute(insert(Cell).values(rows).on_conflict_do_nothing())


def _fail(db_session: Session, run: Run, reason: str) -> str | None:
    run.state = RunState.FAILED
    run.reason = reason
    auth_service.record_audit(
        db_session=db_session,
        actor="server",
        kind="run.ingest_failed",
        subject_id=run.id,
        reason=reason,
    )
    analyze = job_service.refresh_job_state(db_session=db_session, job_id=run.job_id)
    db_session.commit()
    log.warning("ingest of run %s failed: %s", run.id, reason)
    return run.job_id if analyze else None


def fail_ingest(*, db_session: Session, run_id: str, reason: str) -> str | None:
    """Ingest of `run_id` cannot proceed (the same input fails the same way every time): the
    run is failed with `reason`, once, and its job's state follows; returns the job id when
    its analysis should start. Nothing happens to a run that is no longer completed."""
    db_session.rollback()
    run = db_session.get(Run, run_id, with_for_update=True, populate_existing=True)
    if run is None or run.state != RunState.COMPLETED:
        db_session.rollback()
        return None
    return _fail(db_session, run, reason)


def ingest_run(
    *, db_session: Session, settings: Settings, store: ArtifactStore, run_id: str
) -> str | None:
    """Ingest one completed run; returns its job id when the job is ready for analysis."""
    run = db_session.get(Run, run_id)
    if run is None or run.state != RunState.COMPLETED:
        return None  # unknown, not finished, or already ingested: nothing to do
    artifacts = artifact_service.run_artifacts(
        db_session=db_session, run_id=run.id, attempt=run.attempt
    )
    problems = []
    for artifact in artifacts:
        problem = store.verify(artifact.sha256, artifact.bytes)
        if problem is not None:
            problems.append(f"{artifact.name} {problem}")
    if problems:
        return _fail(
            db_session, run, "stored artifacts failed verification: " + "; ".join(problems)
        )
    records = next((a for a in artifacts if a.name == RECORDS_FILE), None)
    if records is None:
        return _fail(db_session, run, f"no {RECORDS_FILE} was uploaded")
    job_spec = db_session.get_one(Job, run.job_id).spec
    if job_spec.needs_host_resolution:
        resolved, problem = _resolved_spec(store, artifacts, job_spec)
        if problem is not None:
            return _fail(db_session, run, problem)
        run.resolved_spec = resolved
    rows, invalid = parse_cells(store.read_bytes(records.sha256), run)
    db_session.commit()  # end the read transaction before the batches
    for start in range(0, len(rows), settings.ingest_batch_size):
        _insert_missing(db_session, rows[start : start + settings.ingest_batch_size])
        db_session.commit()
        if settings.ingest_batch_pause_s:
            time.sleep(settings.ingest_batch_pause_s)
    # Locked: of two deliveries of this task racing here, only one marks the run processed.
    run = db_session.get(Run, run_id, with_for_update=True, populate_existing=True)
    if run is None or run.state != RunState.COMPLETED:
        db_session.rollback()
        return None
    run.state = RunState.PROCESSED
    run.processed_at = utcnow()
    # The final count replaces the last heartbeat's (which may predate the last cells); the
    # cells a heartbeat counts are the timed ones, never the discarded warm-ups.
    timed = sum(1 for row in rows if row["status"] != "warmup" and row["round"] >= 0)
    run.progress = {
        **(run.progress or {}),
        "cells_done": timed,
        "cells_total": timed,
        "final": True,
    }
    run.ingest_errors = invalid or None
    auth_service.record_audit(
        db_session=db_session,
        actor="server",
        kind="run.processed",
        subject_id=run.id,
        cells=len(rows),
        invalid_lines=len(invalid),
    )
    analyze = job_service.refresh_job_state(db_session=db_session, job_id=run.job_id)
    db_session.commit()
    log.info("ingested run %s: %d cells, %d invalid lines", run.id, len(rows), len(invalid))
    return run.job_id if analyze else None


def unprocessed_run_ids(*, db_session: Session) -> list[str]:
    """Runs whose raw results are stored but were never ingested (a lost task, a crash)."""
    return list(db_session.scalars(sa.select(Run.id).where(Run.state == RunState.COMPLETED)))
