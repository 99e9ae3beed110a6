"""Evidence rows and the rendered files they point to in the artifact store."""

from __future__ import annotations

import functools
import hmac
import logging
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from coldbench.api.artifacts import service as artifact_service
from coldbench.api.artifacts.store import ArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.errors import Conflict, NotFound, validation_message
from coldbench.api.evidence.models import Evidence
from coldbench.api.evidence.page import PAGE_FILE, render_stored_page
from coldbench.api.evidence.view import BundleView, view_of_files
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job, spec_as_run
from coldbench.api.runs.models import Cell, Run
from coldbench.evidence.bundles.bundle import (
    MANIFEST_FILE,
    BundleError,
    build_bundle,
    evidence_id_of,
    read_zip,
    zip_bytes,
)
from coldbench.evidence.contract.canonical import sha256_hex
from coldbench.evidence.contract.protocol import JobState, RunState
from coldbench.evidence.contract.schemas import Provenance, Record
from coldbench.evidence.contract.timeline import TIMELINE_FILE, Timeline
from coldbench.evidence.rendering.markdown import render_summary_md

log = logging.getLogger(__name__)

_RECORDS = TypeAdapter(list[Record])

EVIDENCE_ID = re.compile(r"^[0-9a-f]{16,64}$")

# URL suffix -> (file in the evidence row, media type)
EVIDENCE_FILES = {
    "": ("report.html", "text/html; charset=utf-8"),
    ".md": ("summary.md", "text/markdown; charset=utf-8"),
    ".json": ("summary.json", "application/json"),
    ".zip": ("bundle.zip", "application/zip"),
}


# The bundle's report.html opens offline: its scripts and styles are inline, nothing is fetched.
REPORT_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)
# Markdown, JSON and zip are data: nothing in them may run if a browser renders one anyway.
DATA_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"


def served_headers(suffix: str) -> dict[str, str]:
    """Security headers of an evidence file (`""` is report.html)."""
    return {
        "Content-Security-Policy": REPORT_CSP if suffix == "" else DATA_CSP,
        "X-Content-Type-Options": "nosniff",
    }


def checked_bytes(*, store: ArtifactStore, evidence_id: str, file_name: str, entry: Any) -> bytes:
    """The stored bytes of an evidence file after their digest and size are checked again:
    NotFound when the file is gone, Conflict naming what changed when it no longer matches."""
    if entry is None or not store.exists(entry["sha256"]):
        raise NotFound(f"evidence {evidence_id} has no {file_name}")
    data = store.read_bytes(entry["sha256"])
    actual = sha256_hex(data)
    if not hmac.compare_digest(actual, entry["sha256"]) or len(data) != entry["bytes"]:
        problem = f"now sha256 {actual}, {len(data)} bytes"
        log.error("evidence %s: %s altered in the store (%s)", evidence_id, file_name, problem)
        raise Conflict(
            f"evidence {evidence_id}: {file_name} no longer matches its digest "
            f"{entry['sha256']} ({problem}); it is not served"
        )
    return data


def get_evidence(*, db_session: Session, evidence_id: str) -> Evidence:
    if not EVIDENCE_ID.fullmatch(evidence_id):
        raise NotFound(f"no evidence {evidence_id!r}")
    row = db_session.get(Evidence, evidence_id)
    if row is None:
        raise NotFound(f"no evidence {evidence_id!r}")
    return row


@functools.lru_cache(maxsize=8)
def _bundle_view(bundle_sha256: str, read: Callable[[str], bytes]) -> BundleView:
    """Cached by the zip's digest (and the store's `read`): a digest names one content."""
    return view_of_files(read_zip(read(bundle_sha256)))


def bundle_view(*, store: ArtifactStore, evidence_id: str, entry: Any) -> BundleView:
    """The bundle of published evidence after its zip's digest is checked again (NotFound,
    Conflict as `checked_bytes`); BundleError, KeyError or ValueError when this version
    cannot read it."""
    checked_bytes(store=store, evidence_id=evidence_id, file_name="bundle.zip", entry=entry)
    return _bundle_view(entry["sha256"], store.read_bytes)


def evidence_page_url(base_url: str, evidence_id: str) -> str:
    return f"{base_url.rstrip('/')}/e/{evidence_id}"


def pr_markdown(
    *, db_session: Session, store: ArtifactStore, evidence_id: str, base_url: str
) -> str:
    """The one Markdown for a pull request: summary.md with the evidence id linked to its
    page at `base_url`. The evidence page copies it, `/e/{id}.md` serves it, the demo prints
    it, and a pull-request comment can post it. A bundle this version cannot read gives its
    own summary.md (checked), which names no id."""
    row = get_evidence(db_session=db_session, evidence_id=evidence_id)
    try:
        view = bundle_view(store=store, evidence_id=evidence_id, entry=row.files.get("bundle.zip"))
    except (BundleError, KeyError, ValueError):
        log.exception("evidence %s: bundle not readable; serving its summary.md", evidence_id)
        stored = checked_bytes(
            store=store,
            evidence_id=evidence_id,
            file_name="summary.md",
            entry=row.files.get("summary.md"),
        )
        return stored.decode("utf-8")
    return render_summary_md(
        view.summary,
        view.provenances,
        evidence_id=evidence_id,
        page_url=evidence_page_url(base_url, evidence_id),
    )


def split_evidence_path(path: str) -> tuple[str, str]:
    """`abc.md` -> ("abc", ".md"); `abc` -> ("abc", "")."""
    for suffix in (".md", ".json", ".zip", ".html"):
        if path.endswith(suffix):
            return path.removesuffix(suffix), "" if suffix == ".html" else suffix
    return path, ""


# --- analysis and rendering (Celery tasks call these) -------------------------------------


def _run_files(
    db_session: Session, store: ArtifactStore, run: Run
) -> tuple[Provenance | None, dict[str, bytes], Timeline | None, str | None]:
    """(provenance, build logs, timeline, problem) of one processed run, read from the store.
    A timeline that does not match its contract is left out (the statistics do not need it)."""
    provenance = None
    logs: dict[str, bytes] = {}
    timeline = None
    problem = None
    for artifact in artifact_service.run_artifacts(
        db_session=db_session, run_id=run.id, attempt=run.attempt
    ):
        if artifact.name == "provenance.json":
            try:
                provenance = Provenance.model_validate_json(store.read_bytes(artifact.sha256))
            except ValidationError as error:
                problem = validation_message(f"provenance.json of run {run.id}", error)
        elif artifact.name.startswith("build-") and artifact.name.endswith(".log"):
            logs[artifact.name] = store.read_bytes(artifact.sha256)
        elif artifact.name == TIMELINE_FILE:
            try:
                timeline = Timeline.model_validate_json(store.read_bytes(artifact.sha256))
            except ValidationError as error:
                log.warning("%s", validation_message(f"timeline.json of run {run.id}", error))
    if provenance is None and problem is None:
        problem = f"run {run.id} uploaded no provenance.json"
    if timeline is not None and timeline.run_id != run.id:
        timeline = None  # another run's file: never attributed to this one
    return provenance, logs, timeline, problem


def analyze_job(*, db_session: Session, store: ArtifactStore, job_id: str) -> bool:
    """Recompute the job's statistics from its raw cells and render its bundle files into the
    store; True when render_evidence should follow. Idempotent (deterministic output)."""
    job = db_session.get(Job, job_id)
    if job is None or job.state != JobState.ANALYZING:
        return False
    if job.bundle_files is not None:
        return True
    runs = [
        run
        for run in job_service.job_runs(db_session=db_session, job_id=job_id)
        if run.state == RunState.PROCESSED
    ]
    spec = spec_as_run(job, runs)
    if job.spec.needs_host_resolution:
        # Only the runs that measured the commits resolved (one host resolves a job's refs).
        runs = [run for run in runs if run.resolved_spec is not None and run.resolved_spec == spec]
    provenances: list[Provenance] = []
    build_logs: dict[str, bytes] = {}
    timelines = []
    problems: list[str] = []
    for run in runs:
        provenance, logs, timeline, problem = _run_files(db_session, store, run)
        if problem is not None:
            problems.append(problem)
            continue
        assert provenance is not None
        # The registry's name for the host: machines cloned from one image often report one
        # hostname, and the report must still tell the hosts apart.
        host = db_session.get(Host, run.host_id) if run.host_id else None
        if host is not None:
            provenance.host.registered_name = host.name
        provenances.append(provenance)
        if timeline is not None:
            timelines.append(timeline)
        for name, content in logs.items():
            # One run keeps the worker's names; several runs get the run id in each name.
            unique = name if len(runs) == 1 else f"{name.removesuffix('.log')}.{run.id}.log"
            build_logs[unique] = content
    kept_runs = {p.run_id for p in provenances}
    # One validation call over every cell: a large job has tens of thousands.
    records = _RECORDS.validate_python(
        db_session.scalars(
            sa.select(Cell.record)
            .where(Cell.job_id == job_id, Cell.run_id.in_(kept_runs))
            .order_by(Cell.run_id, Cell.line)
        ).all()
    )
    if not provenances or not records:
        reason = "; ".join(problems) or "the job's runs produced no records"
        fail_analysis(db_session=db_session, job_id=job_id, reason=reason)
        return False
    try:
        files, summary = build_bundle(
            records=records,
            provenances=provenances,
            spec=spec,
            build_logs=build_logs,
            timelines=timelines,
        )
    except ValueError as error:
        # Deterministic: the same cells fail the same way, so retrying cannot help.
        fail_analysis(db_session=db_session, job_id=job_id, reason=f"analysis failed: {error}")
        return False
    stored = {}
    for name, content in files.items():
        blob = store.put_bytes(content)
        stored[name] = {"sha256": blob.sha256, "bytes": blob.bytes}
    job.summary = summary.to_json_value()
    job.bundle_files = stored
    if problems:
        job.reason = "; ".join(problems)
    job.updated_at = utcnow()
    db_session.commit()
    return True


def fail_analysis(*, db_session: Session, job_id: str, reason: str) -> bool:
    """Analysis or publishing of `job_id` cannot proceed (the same input fails the same way
    every time): the job is failed with `reason`, once; True when it was. A job no longer
    being analysed is left as it is."""
    db_session.rollback()
    job = db_session.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is None or job.state != JobState.ANALYZING:
        db_session.rollback()
        return False
    job.state = JobState.FAILED
    job.reason = reason
    job.updated_at = utcnow()
    auth_service.record_audit(
        db_session=db_session,
        actor="server",
        kind="job.analysis_failed",
        subject_id=job_id,
        reason=reason,
    )
    db_session.commit()
    log.warning("job %s failed: %s", job_id, reason)
    return True


def render_evidence(*, db_session: Session, store: ArtifactStore, job_id: str) -> str | None:
    """Publish the job's analysed bundle (idempotent): its id, or None while there is none."""
    job = db_session.get(Job, job_id)
    if job is None:
        return None
    if job.evidence_id is not None:
        return job.evidence_id
    if job.bundle_files is None:
        return None
    files = {}
    for name, entry in job.bundle_files.items():
        problem = store.verify(entry["sha256"], entry["bytes"])
        if problem is not None:
            raise RuntimeError(f"bundle file {name} of job {job_id} {problem}")
        files[name] = store.read_bytes(entry["sha256"])
    return publish(db_session=db_session, store=store, job=job, files=files)


def publish(*, db_session: Session, store: ArtifactStore, job: Job, files: dict[str, bytes]) -> str:
    """Store the bundle's zip and its evidence page, add the Evidence row and mark the job
    done; the evidence id. `files` are the bundle's files, already in the store."""
    evidence_id = evidence_id_of(files[MANIFEST_FILE])
    manifest_sha256 = sha256_hex(files[MANIFEST_FILE])
    published = {}
    for name in ("report.html", "summary.md", "summary.json", MANIFEST_FILE):
        if name in files:
            published[name] = {"sha256": sha256_hex(files[name]), "bytes": len(files[name])}
    zipped = store.put_bytes(zip_bytes(files))
    published["bundle.zip"] = {"sha256": zipped.sha256, "bytes": zipped.bytes}
    try:
        page = render_stored_page(evidence_id, view_of_files(files), manifest_sha256)
    except (KeyError, ValueError):
        # The page is rendered per request then, falling back to the bundle's report.html.
        log.exception("evidence %s: page not rendered at publishing", evidence_id)
    else:
        blob = store.put_bytes(page)
        published[PAGE_FILE] = {"sha256": blob.sha256, "bytes": blob.bytes}
    if db_session.get(Evidence, evidence_id) is None:
        db_session.add(
            Evidence(
                id=evidence_id,
                job_id=job.id,
                manifest_sha256=manifest_sha256,
                files=published,
            )
        )
    job.evidence_id = evidence_id
    job.state = JobState.DONE
    job.updated_at = utcnow()
    auth_service.record_audit(
        db_session=db_session,
        actor="server",
        kind="evidence.published",
        subject_id=job.id,
        evidence_id=evidence_id,
    )
    db_session.commit()
    log.info("evidence %s published for job %s", evidence_id, job.id)
    return evidence_id
