"""Reproductions: an uploaded bundle checked against the evidence it names, kept, and set
beside the original's hosts (coldbench.evidence.bundles.compare)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coldbench.api.artifacts.store import ArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.errors import Conflict, Invalid
from coldbench.api.evidence import service as evidence_service
from coldbench.api.github.models import PullRequest, PullRequestJob
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.reproductions.models import EvidenceReproduction
from coldbench.evidence.bundles.bundle import BundleError, read_zip, verify_files
from coldbench.evidence.bundles.compare import (
    REPRODUCES_FILE,
    CompareError,
    HostComparison,
    HostRun,
    Source,
    compare_hosts,
    host_run_document,
    host_run_of,
    host_runs,
    identity_difference,
    job_identity,
)
from coldbench.evidence.contract.boundary import (
    TextRefused,
    Utf8Lines,
    door_check_json,
    door_json_loads,
)
from coldbench.evidence.contract.canonical import sha256_hex, sha256_json

log = logging.getLogger(__name__)


def _door(files: dict[str, bytes]) -> None:
    """The door's rule on every JSON file of the bundle (what the service parses and keeps)."""
    try:
        for name, content in sorted(files.items()):
            if name.endswith(".json"):
                door_check_json(content, what=name)
            elif name.endswith(".jsonl"):
                lines = Utf8Lines(name)
                lines.feed(content)
                lines.close()
    except TextRefused as refused:
        raise Invalid(f"{refused.field}: {refused.problem}; nothing stored") from None


@functools.lru_cache(maxsize=8)
def _original_hosts(bundle_sha256: str, read: Callable[[str], bytes]) -> tuple[HostRun, ...]:
    """The published evidence's hosts, from its zip (cached by the zip's digest)."""
    return tuple(host_runs(Source(name="the evidence", files=read_zip(read(bundle_sha256)))))


def original_hosts(*, db_session: Session, store: ArtifactStore, evidence_id: str) -> list[HostRun]:
    """The hosts of published evidence, its zip's digest checked again first."""
    row = evidence_service.get_evidence(db_session=db_session, evidence_id=evidence_id)
    entry = row.files.get("bundle.zip")
    evidence_service.checked_bytes(
        store=store, evidence_id=evidence_id, file_name="bundle.zip", entry=entry
    )
    return list(_original_hosts(entry["sha256"], store.read_bytes))


def reproductions_of(*, db_session: Session, evidence_id: str) -> list[EvidenceReproduction]:
    return list(
        db_session.scalars(
            sa.select(EvidenceReproduction)
            .where(EvidenceReproduction.evidence_id == evidence_id)
            .order_by(EvidenceReproduction.created_at, EvidenceReproduction.id)
        )
    )


def reproductions_digest(rows: list[EvidenceReproduction]) -> str:
    """What names the set of reproductions a page shows (part of its ETag); "" for none."""
    return sha256_hex(",".join(row.id for row in rows).encode())[:12] if rows else ""


def host_comparison(
    *, db_session: Session, store: ArtifactStore, evidence_id: str
) -> HostComparison | None:
    """The evidence's hosts beside every uploaded reproduction's; None where there is none."""
    rows = reproductions_of(db_session=db_session, evidence_id=evidence_id)
    if not rows:
        return None
    hosts = original_hosts(db_session=db_session, store=store, evidence_id=evidence_id)
    hosts += [host_run_of(document) for row in rows for document in row.hosts]
    return compare_hosts(hosts)


def with_hosts_markdown(
    markdown: str, *, db_session: Session, store: ArtifactStore, evidence_id: str
) -> str:
    """The evidence's PR Markdown with the reproducing hosts' section at its end (as
    `/e/{id}.md` and a pull request's comment show it); unchanged where none was uploaded."""
    from coldbench.evidence.bundles.compare import comparison_markdown

    comparison = host_comparison(db_session=db_session, store=store, evidence_id=evidence_id)
    if comparison is None:
        return markdown
    return markdown + "\n" + "\n".join(comparison_markdown(comparison)) + "\n"


def _checked_upload(files: dict[str, bytes], evidence_id: str) -> tuple[str, list[HostRun]]:
    """(the upload's evidence id, its hosts) of a bundle that reproduces `evidence_id`."""
    _door(files)
    verification = verify_files(files)
    if not verification.is_intact:
        raise Invalid(
            "the bundle is not intact: " + "; ".join(verification.problems[:3]) + "; nothing stored"
        )
    assert verification.evidence_id is not None
    if verification.evidence_id == evidence_id:
        raise Conflict(f"the upload is evidence {evidence_id} itself, not a reproduction of it")
    raw = files.get(REPRODUCES_FILE)
    if raw is None:
        raise Invalid(
            f"the bundle has no {REPRODUCES_FILE}: upload the bundle `coldbench reproduce` "
            "wrote; nothing stored"
        )
    try:
        named = door_json_loads(raw, what=REPRODUCES_FILE).get("evidence_id")
    except (ValueError, AttributeError, TextRefused):
        raise Invalid(f"{REPRODUCES_FILE} is not a JSON object; nothing stored") from None
    if named != evidence_id:
        raise Conflict(
            f"the bundle reproduces evidence {named}, not {evidence_id}: upload it to "
            f"/api/v1/evidence/{named}/reproductions"
        )
    try:
        return verification.evidence_id, host_runs(Source(name="the upload", files=files))
    except CompareError as error:
        raise Invalid(f"{error}; nothing stored") from None


@dataclass(frozen=True)
class Added:
    """What an upload did: the row, whether it is new, and the pull requests whose comment
    shows the evidence (due an answer again; the caller sends their tasks after the commit)."""

    row: EvidenceReproduction
    created: bool
    pull_request_ids: list[int] = field(default_factory=list)


def _already_there(existing: EvidenceReproduction, evidence_id: str, host: Host) -> Added:
    """A row with the upload's id: the same upload again (its row), or another host's."""
    if existing.evidence_id == evidence_id and existing.host_id == host.id:
        return Added(existing, False)
    raise Conflict(f"reproduction {existing.id} was already uploaded by another host")


def _announced_again(db_session: Session, evidence_id: str) -> list[int]:
    """The pull requests whose comment already shows `evidence_id`, marked due an answer in
    the caller's transaction (the beat's catch-up sends what a lost task leaves undone)."""
    ids = list(
        db_session.scalars(
            sa.select(PullRequest.id)
            .join(PullRequestJob, PullRequestJob.pull_request_id == PullRequest.id)
            .join(Job, Job.id == PullRequestJob.job_id)
            .where(Job.evidence_id == evidence_id, PullRequest.comment_id.is_not(None))
            .distinct()
            .order_by(PullRequest.id)
        )
    )
    if ids:
        db_session.execute(
            sa.update(PullRequest).where(PullRequest.id.in_(ids)).values(answer_due=True)
        )
    return ids


def add_reproduction(
    *,
    db_session: Session,
    store: ArtifactStore,
    host: Host,
    evidence_id: str,
    bundle_path: Path,
) -> Added:
    """Keep the zip at `bundle_path` (the upload's spool file) as `host`'s reproduction of
    `evidence_id`. The same bundle sent again by the same host, even at the same moment,
    answers its row; another host's answers Conflict. Nothing is stored unless the zip is
    readable, intact, names this evidence in reproduces.json and is the same job (Invalid,
    Conflict saying what differs)."""
    evidence_service.get_evidence(db_session=db_session, evidence_id=evidence_id)
    bundle = bundle_path.read_bytes()
    try:
        files = read_zip(bundle)
    except BundleError as error:
        raise Invalid(f"the upload is not a readable bundle zip: {error}; nothing stored") from None
    reproduction_id, hosts = _checked_upload(files, evidence_id)
    existing = db_session.get(EvidenceReproduction, reproduction_id)
    if existing is not None:
        return _already_there(existing, evidence_id, host)
    originals = original_hosts(db_session=db_session, store=store, evidence_id=evidence_id)
    reference = job_identity(originals[0].spec, originals[0].provenance)
    for run in hosts:
        identity = job_identity(run.spec, run.provenance)
        difference = identity_difference(reference, identity)
        if difference is not None:
            raise Conflict(
                f"the upload is another job than evidence {evidence_id} (spec digests "
                f"{sha256_json(identity)[:12]} and {sha256_json(reference)[:12]}): "
                f"{difference}; nothing stored"
            )
        # The registry's name, as a job's own runs are shown (api/evidence/service.py).
        run.provenance.host.registered_name = host.name
        run.label = host.name
    blob = store.put_bytes(bundle)
    row = EvidenceReproduction(
        id=reproduction_id,
        evidence_id=evidence_id,
        host_id=host.id,
        manifest_sha256=sha256_hex(files["manifest.json"]),
        bundle_sha256=blob.sha256,
        bundle_bytes=blob.bytes,
        identity_sha256=sha256_json(reference),
        hosts=[host_run_document(run) for run in hosts],
    )
    try:
        db_session.add(row)
        auth_service.record_audit(
            db_session=db_session,
            actor=f"host:{host.id}",
            kind="evidence.reproduced",
            subject_id=evidence_id,
            reproduction_id=reproduction_id,
        )
        pull_request_ids = _announced_again(db_session, evidence_id)
        db_session.commit()
    except IntegrityError:
        # The same bundle uploaded at the same moment: both found no row, the other's insert
        # committed first (raised by the flush before a query or by the commit). Its row
        # answers as a repeat would (the blob is the same bytes).
        db_session.rollback()
        existing = db_session.get(EvidenceReproduction, reproduction_id)
        if existing is None:
            raise
        return _already_there(existing, evidence_id, host)
    log.info("evidence %s reproduced by host %s: %s", evidence_id, host.name, reproduction_id)
    return Added(row, True, pull_request_ids)


def section_html(comparison: HostComparison) -> str:
    """The evidence page's hosts section (escaped by the template)."""
    from coldbench.api.pages.templates import templates
    from coldbench.evidence.analysis.agreement import RULE
    from coldbench.evidence.bundles.compare import interval_text
    from coldbench.evidence.rendering.markdown import reproduction_machines

    machines = reproduction_machines([h.provenance for h in comparison.hosts])
    return (
        templates()
        .get_template("_evidence_reproductions.html")
        .render(
            identity=comparison.identity_sha256,
            hosts=[h.label for h in comparison.hosts],
            rows=[
                {
                    "context": row.context_tokens,
                    "variant": row.variant,
                    "cells": [f"{interval_text(r)} {verdict}" for _, r, verdict in row.hosts],
                    "agree": row.outcome.agree,
                    "statement": row.outcome.statement,
                    "detail": row.outcome.test.detail if row.outcome.test else "-",
                }
                for row in comparison.rows
            ],
            rule=RULE,
            machines=[
                f"evidence {h.evidence_id}: {text}"
                for h, text in zip(comparison.hosts, machines, strict=True)
            ],
        )
    )


def with_reproductions(page: bytes, comparison: HostComparison) -> bytes:
    """The evidence page with the hosts section after its Markdown box and the section's
    Markdown at the end of the box's text (the page's own header marks both places)."""
    import html

    from coldbench.evidence.bundles.compare import comparison_markdown

    markdown = "\n\n" + "\n".join(comparison_markdown(comparison)) + "\n"
    page = page.replace(b"</textarea>", html.escape(markdown).encode() + b"</textarea>", 1)
    box = page.find(b'<details id="cb-markdown-box">')
    end = page.find(b"</details>", box)
    if box < 0 or end < 0:
        return page
    end += len(b"</details>")
    return page[:end] + b"\n" + section_html(comparison).encode() + page[end:]
