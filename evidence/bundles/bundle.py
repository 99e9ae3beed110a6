"""Evidence bundles: write a folder (and its zip), read either, verify every byte.

A bundle is a flat folder: `records.jsonl`, `provenance.json` (canonical JSON), `build-*.log`,
`job.json` (when the spec is known), `timeline.json` (where the run's time went; one
`timeline.<run>.json` per run in a job of several runs), `summary.json`, `summary.md`,
`report.html` and `manifest.json`. The manifest lists every other file with its sha256 and size
and carries the provenance inline. The evidence id is the first 24 hex digits of the sha256 of
manifest.json's bytes, so it commits to every file of the bundle.

Consequence worth knowing: the rendered views inside a bundle (summary.md, report.html) cannot
show their own bundle's evidence id (it would have to hash itself). They say where to find it;
the renderers take `evidence_id` so a server or the CLI can show it when rendering for display.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coldbench.evidence.analysis.stats import N_RESAMPLES
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.boundary import strict_json_loads
from coldbench.evidence.contract.canonical import canonical_json, sha256_hex
from coldbench.evidence.contract.records import RECORDS_FILE, parse_records, records_bytes
from coldbench.evidence.contract.schemas import (
    FileEntry,
    JobSpec,
    Manifest,
    Provenance,
    Record,
    error_line,
    is_valid_name,
)
from coldbench.evidence.contract.summary_schema import Summary, first_difference, summary_json_bytes
from coldbench.evidence.contract.timeline import Timeline, is_timeline_file, timeline_file_name
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
PROVENANCE_FILE = "provenance.json"
SUMMARY_JSON_FILE = "summary.json"
SUMMARY_MD_FILE = "summary.md"
REPORT_FILE = "report.html"
JOB_FILE = "job.json"
REQUIRED_FILES = (RECORDS_FILE, PROVENANCE_FILE)
EVIDENCE_ID_HEX = 24
# A zip is read into memory: refuse archives that would inflate beyond this.
MAX_BUNDLE_BYTES = 2 << 30
# Zip entries get this fixed time so zipping the same folder twice gives the same bytes.
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)
_ZIP_LEVEL = 1


# What zipfile raises on damaged archives: a corrupt deflate stream is a zlib.error, an unknown
# compression method NotImplementedError, a truncated entry EOFError.
_ZIP_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    EOFError,
    NotImplementedError,
    ValueError,
)


class BundleError(ValueError):
    """A bundle could not be read at all (not a folder or zip, unsafe zip entry, too large)."""


@dataclass
class Verification:
    """What `verify` found: `problems` is empty when the bundle is intact."""

    evidence_id: str | None
    file_count: int
    problems: list[str] = field(default_factory=list)

    @property
    def is_intact(self) -> bool:
        return not self.problems


@dataclass
class WrittenBundle:
    path: Path
    evidence_id: str
    manifest: dict[str, Any]
    summary: Summary
    zip_path: Path | None = None


def evidence_id_of(manifest_bytes: bytes) -> str:
    """The evidence id: first 24 hex digits of the sha256 of manifest.json's exact bytes."""
    return sha256_hex(manifest_bytes)[:EVIDENCE_ID_HEX]


def provenance_document(provenances: Sequence[Provenance]) -> dict[str, Any]:
    """provenance.json's value: the run's provenance, or `{"runs": [...]}` for several runs."""
    if not provenances:
        raise ValueError("a bundle needs the provenance of at least one run")
    dumped = [p.model_dump(mode="json", by_alias=True) for p in provenances]
    return dumped[0] if len(dumped) == 1 else {"runs": dumped}


def provenances_of(document: Mapping[str, Any]) -> list[Provenance]:
    """Inverse of `provenance_document`; raises pydantic's ValidationError on a bad one."""
    if set(document) == {"runs"} and isinstance(document["runs"], list):
        return [Provenance.model_validate(run) for run in document["runs"]]
    return [Provenance.model_validate(document)]


def build_manifest(files: Mapping[str, bytes], provenance: Mapping[str, Any]) -> bytes:
    """manifest.json's canonical bytes for these files (manifest.json itself excluded)."""
    manifest = Manifest(
        files={
            name: FileEntry(sha256=sha256_hex(content), bytes=len(content))
            for name, content in sorted(files.items())
            if name != MANIFEST_FILE
        },
        provenance=dict(provenance),
    )
    return canonical_json(manifest.model_dump(mode="json"))


def bundle_files(
    *,
    records: Sequence[Record] | bytes,
    provenances: Sequence[Provenance],
    build_logs: Mapping[str, bytes | str] | None = None,
    spec: JobSpec | None = None,
    summary: Summary | None = None,
    summary_md: str | None = None,
    report_html: str | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    timelines: Sequence[Timeline] = (),
) -> dict[str, bytes]:
    """Every file of a bundle as bytes, manifest.json included (nothing touches the disk).

    `records` may be the raw bytes of records.jsonl (kept as they are, after validation) or
    parsed records (written canonically). Build logs are named `build-<variant>.log`; a bare
    variant name is turned into that file name. Each run's timeline is `timeline.json`, or
    `timeline.<run>.json` when there are several.
    """
    if isinstance(records, bytes):
        _, problems = parse_records(records)
        if problems:
            raise ValueError(f"records.jsonl is not valid: {problems[0]}")
        records_raw = records
    else:
        records_raw = records_bytes(records)
    provenance = provenance_document(provenances)
    files: dict[str, bytes] = {
        RECORDS_FILE: records_raw,
        PROVENANCE_FILE: canonical_json(provenance),
    }
    for name, log in (build_logs or {}).items():
        file_name = name if name.endswith(".log") else f"build-{name}.log"
        _check_file_name(file_name)
        files[file_name] = log.encode("utf-8") if isinstance(log, str) else log
    if spec is not None:
        files[JOB_FILE] = canonical_json(spec.model_dump(mode="json", by_alias=True))
    for timeline in timelines:
        name = timeline_file_name(timeline.run_id, several=len(timelines) > 1)
        _check_file_name(name)
        files[name] = timeline.to_json_bytes()
    if summary is not None:
        files[SUMMARY_JSON_FILE] = summary_json_bytes(summary)
    if summary_md is not None:
        files[SUMMARY_MD_FILE] = summary_md.encode("utf-8")
    if report_html is not None:
        files[REPORT_FILE] = report_html.encode("utf-8")
    for name, content in (extra_files or {}).items():
        _check_file_name(name)
        if name in files or name == MANIFEST_FILE:
            raise ValueError(f"extra file {name!r} would replace a bundle file")
        files[name] = content
    files[MANIFEST_FILE] = build_manifest(files, provenance)
    return files


def _check_file_name(name: str) -> None:
    if not is_valid_name(name):
        raise ValueError(f"bundle file name {name!r} is not a plain file name")


def write_folder(path: str | Path, files: Mapping[str, bytes]) -> Path:
    """Write bundle files into a new (or empty) folder; refuses to mix with other files."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    existing = sorted(p.name for p in path.iterdir())
    if existing:
        raise BundleError(
            f"{path} is not empty ({', '.join(existing[:3])}...): choose a new folder"
        )
    for name, content in files.items():
        _check_file_name(name)
        with open(path / name, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
    return path


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A deterministic zip of the bundle: sorted names, fixed times, regular-file modes.

    Deflate level 1: every report.html inlines plotly.js (4.8 MB), and compressing it at
    zlib's default level 6 cost 130 ms of CPU per bundle against 53 ms, for a zip 16% smaller
    (1.47 against 1.71 MB); the server zips every job it renders."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            archive.writestr(info, files[name], compresslevel=_ZIP_LEVEL)
    return buffer.getvalue()


def build_bundle(
    *,
    records: Sequence[Record] | bytes,
    provenances: Sequence[Provenance] | Provenance,
    spec: JobSpec | None = None,
    build_logs: Mapping[str, bytes | str] | None = None,
    baseline: str | None = None,
    features: Sequence[str] | None = None,
    precision: float | None = None,
    seed: int | None = None,
    n_resamples: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    timelines: Sequence[Timeline] = (),
) -> tuple[dict[str, bytes], Summary]:
    """Every file of a complete bundle (summary computed, views rendered) and the summary.

    The one bundle assembly: `coldbench run` and the agent (through `build_run_bundle`), the
    service's analysis and the tests all call it. `baseline`, `features`, `precision` and
    `seed` default to the job spec's (the spec or `baseline` is required). `extra_files` (plain
    names) join the bundle and its manifest, e.g. a worker's scheduling log. Nothing touches
    the disk.
    """
    provenance_list = [provenances] if isinstance(provenances, Provenance) else list(provenances)
    if isinstance(records, bytes):
        parsed, problems = parse_records(records)
        if problems:
            raise ValueError(f"records.jsonl is not valid: {problems[0]}")
    else:
        parsed = list(records)
    options: dict[str, Any] = {}
    if precision is not None:
        options["precision"] = precision
    if seed is not None:
        options["seed"] = seed
    if n_resamples is not None:
        options["n_resamples"] = n_resamples
    summary = summarize(
        parsed,
        spec=spec,
        baseline=baseline,
        features=features,
        provenances=provenance_list,
        timelines=timelines,
        **options,
    )
    common: dict[str, Any] = {
        "records": records,
        "provenances": provenance_list,
        "build_logs": build_logs,
        "spec": spec,
        "summary": summary,
        "extra_files": extra_files,
        "timelines": timelines,
    }
    for name in (SUMMARY_MD_FILE, REPORT_FILE):
        if name in (extra_files or {}):
            raise ValueError(f"extra file {name!r} would replace a bundle file")
    # The report lists the digests of the data files it was rendered from. The data files are
    # encoded once (records.jsonl and summary.json are most of a large bundle's bytes); the
    # views join them and the manifest is made again over all of them.
    files = bundle_files(**common)
    del files[MANIFEST_FILE]
    digests = {name: sha256_hex(data) for name, data in files.items()}
    files[SUMMARY_MD_FILE] = render_summary_md(summary, provenance_list, evidence_id=None).encode(
        "utf-8"
    )
    files[REPORT_FILE] = render_report_html(
        summary, parsed, provenance_list, None, file_digests=digests
    ).encode("utf-8")
    files[MANIFEST_FILE] = build_manifest(files, provenance_document(provenance_list))
    return files, summary


def build_run_bundle(
    *,
    records: bytes,
    provenances: Sequence[Provenance],
    spec: JobSpec,
    build_logs: Mapping[str, bytes | str] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    timeline: Timeline | None = None,
) -> tuple[dict[str, bytes], Summary | None]:
    """A host's bundle of its own run (`coldbench run`, the agent): `build_bundle`'s, except
    that a run without a measured cell (a failed build, a refused job) or whose summary or
    views fail to render still gives a bundle: its data and logs, without summary and views
    (None for the summary). The measurements are the result; the views can be rendered again
    from them, and the service recomputes its own."""
    parsed, problems = parse_records(records)
    if problems:
        raise ValueError(f"records.jsonl is not valid: {problems[0]}")
    data_only: dict[str, Any] = {
        "records": records,
        "provenances": provenances,
        "build_logs": build_logs,
        "spec": spec,
        "extra_files": extra_files,
        "timelines": [timeline] if timeline is not None else [],
    }
    if not any(r.round >= 0 for r in parsed):
        return bundle_files(**data_only), None
    try:
        return build_bundle(**data_only)
    except Exception:
        # A statistics or rendering bug must not throw away what was measured.
        logger.exception("summary or report rendering failed; bundling the data without them")
        return bundle_files(**data_only), None


def write_bundle(
    path: str | Path,
    *,
    records: Sequence[Record] | bytes,
    provenances: Sequence[Provenance] | Provenance,
    spec: JobSpec | None = None,
    build_logs: Mapping[str, bytes | str] | None = None,
    baseline: str | None = None,
    features: Sequence[str] | None = None,
    precision: float | None = None,
    seed: int | None = None,
    n_resamples: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    make_zip: bool = True,
) -> WrittenBundle:
    """Compute the summary, render summary.md and report.html, write the folder and its zip.

    `path` must be a new or empty folder; the zip is written beside it as `<folder>.zip`.
    """
    files, summary = build_bundle(
        records=records,
        provenances=provenances,
        spec=spec,
        build_logs=build_logs,
        baseline=baseline,
        features=features,
        precision=precision,
        seed=seed,
        n_resamples=n_resamples,
        extra_files=extra_files,
    )
    folder = write_folder(path, files)
    zip_path = None
    if make_zip:
        zip_path = folder.with_name(folder.name + ".zip")
        zip_path.write_bytes(zip_bytes(files))
    manifest_bytes = files[MANIFEST_FILE]
    evidence_id = evidence_id_of(manifest_bytes)
    logger.info("wrote evidence bundle %s", evidence_id, extra={"path": str(folder)})
    return WrittenBundle(
        path=folder,
        evidence_id=evidence_id,
        manifest=json.loads(manifest_bytes),
        summary=summary,
        zip_path=zip_path,
    )


def read_bundle(path: str | Path) -> dict[str, bytes]:
    """Every file of a bundle folder or zip, by name. Raises `BundleError` on unsafe input.

    Zip entries with absolute names, `..`, backslashes, symbolic links, duplicates or a total
    size above `MAX_BUNDLE_BYTES` are refused; so are symbolic links inside a folder.
    """
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise BundleError(f"{path} is neither a bundle folder nor a zip file")
        return read_zip(path.read_bytes())
    raise BundleError(f"{path} does not exist")


def _read_folder(root: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for current, dirs, names in os.walk(root, followlinks=False):
        base = Path(current)
        for name in sorted(dirs):
            if (base / name).is_symlink():
                raise BundleError(f"{(base / name).relative_to(root)}: symbolic link refused")
        for name in sorted(names):
            full = base / name
            relative = full.relative_to(root).as_posix()
            if full.is_symlink():
                raise BundleError(f"{relative}: symbolic link refused")
            if not full.is_file():
                raise BundleError(f"{relative}: not a regular file")
            total += full.stat().st_size
            if total > MAX_BUNDLE_BYTES:
                raise BundleError(f"bundle larger than {MAX_BUNDLE_BYTES} bytes")
            files[relative] = full.read_bytes()
    return files


def _unsafe_member_name(name: str) -> bool:
    parts = name.split("/")
    return (
        not name
        or name.startswith("/")
        or "\\" in name
        or ":" in parts[0]  # drive letters
        or any(part in ("..", ".") for part in parts)
        or "" in parts[:-1]
        or "\x00" in name
    )


def read_zip(data: bytes) -> dict[str, bytes]:
    """Every regular file of a zipped bundle; the zip may hold the files at its top level or
    inside one top-level folder.

    Memory is bounded by what the entries declare, checked before anything is inflated: their
    sizes' sum at most `MAX_BUNDLE_BYTES`, and each entry is inflated in chunks of
    `ZIP_READ_CHUNK_BYTES`, refused as soon as it streams more than it declared (zipfile reads
    a deflated entry in one call with a 2 GiB output limit: a 2.4 MB zip whose 1 GiB entry
    declared 1 KiB took 2.1 GB before its CRC failed)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _ZIP_READ_ERRORS as error:
        raise BundleError(f"not a readable zip file ({error})") from error
    files: dict[str, bytes] = {}
    with archive:
        entries: list[zipfile.ZipInfo] = []
        for info in archive.infolist():
            name = info.filename
            if _unsafe_member_name(name):
                raise BundleError(f"zip entry {name!r}: empty, absolute or parent path refused")
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise BundleError(f"zip entry {name!r}: symbolic link refused")
            if info.is_dir():
                continue
            if mode and not stat.S_ISREG(mode):
                raise BundleError(f"zip entry {name!r}: not a regular file")
            if name in files or any(entry.filename == name for entry in entries):
                raise BundleError(f"zip entry {name!r}: appears twice")
            entries.append(info)
        declared = sum(info.file_size for info in entries)
        if declared > MAX_BUNDLE_BYTES:
            raise BundleError(f"zip declares {declared} bytes, beyond {MAX_BUNDLE_BYTES}")
        for info in entries:
            files[info.filename] = _inflate(archive, info)
    return _strip_common_folder(files)


# How much of a zip entry is inflated at a time (read_zip).
ZIP_READ_CHUNK_BYTES = 1 << 20


def _inflate(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The entry's bytes, inflated chunk by chunk: never more than it declares."""
    name = info.filename
    parts: list[bytes] = []
    streamed = 0
    try:
        with archive.open(info) as entry:
            while chunk := entry.read(ZIP_READ_CHUNK_BYTES):
                streamed += len(chunk)
                if streamed > info.file_size:
                    raise BundleError(
                        f"zip entry {name!r}: inflates beyond the {info.file_size} bytes it "
                        "declares"
                    )
                parts.append(chunk)
    except _ZIP_READ_ERRORS as error:
        raise BundleError(f"zip entry {name!r}: unreadable ({error})") from error
    return b"".join(parts)


def _strip_common_folder(files: dict[str, bytes]) -> dict[str, bytes]:
    if MANIFEST_FILE in files or not files:
        return files
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) == 1 and all("/" in name for name in files):
        top = tops.pop()
        return {name[len(top) + 1 :]: content for name, content in files.items()}
    return files


def verify_files(files: Mapping[str, bytes]) -> Verification:
    """Check a bundle held in memory: one problem per missing, extra or altered file, per
    invalid record line, and for a provenance that is invalid or differs from the manifest's."""
    problems: list[str] = []
    manifest_bytes = files.get(MANIFEST_FILE)
    if manifest_bytes is None:
        return Verification(None, len(files), [f"{MANIFEST_FILE}: missing"])
    evidence_id = evidence_id_of(manifest_bytes)
    try:
        manifest = Manifest.model_validate_json(manifest_bytes)
    except ValidationError as error:
        why = error_line(error, whole="manifest")
        return Verification(evidence_id, len(files), [f"{MANIFEST_FILE}: invalid ({why})"])
    for name, entry in sorted(manifest.files.items()):
        content = files.get(name)
        if content is None:
            problems.append(f"{name}: missing")
            continue
        digest = sha256_hex(content)
        if len(content) != entry.bytes:
            problems.append(f"{name}: altered ({len(content)} bytes, manifest says {entry.bytes})")
        elif digest != entry.sha256:
            problems.append(
                f"{name}: altered (sha256 {digest[:16]}..., manifest says {entry.sha256[:16]}...)"
            )
    for name in sorted(set(files) - set(manifest.files) - {MANIFEST_FILE}):
        problems.append(f"{name}: extra (not in the manifest)")
    for name in REQUIRED_FILES:
        if name not in manifest.files and name not in files:
            problems.append(f"{name}: missing (every bundle has one)")
    records: list[Record] = []
    if RECORDS_FILE in files:
        records, record_problems = parse_records(files[RECORDS_FILE])
        problems.extend(record_problems)
    if PROVENANCE_FILE in files:
        provenance_problems, provenance_runs = _provenance_problems(
            files[PROVENANCE_FILE], manifest.provenance
        )
        problems.extend(provenance_problems)
        if provenance_runs is not None:
            orphans = sorted({r.run_id for r in records} - provenance_runs)
            problems.extend(f"{RECORDS_FILE}: run {run!r} has no provenance" for run in orphans)
    if JOB_FILE in files:
        try:
            JobSpec.model_validate_json(files[JOB_FILE])
        except ValidationError as error:
            problems.append(f"{JOB_FILE}: invalid ({error_line(error, whole='document')})")
    for name in sorted(files):
        if is_timeline_file(name):
            try:
                Timeline.model_validate_json(files[name])
            except ValidationError as error:
                problems.append(f"{name}: invalid ({error_line(error, whole='document')})")
    if SUMMARY_JSON_FILE in files:
        _, problem = summary_of(files[SUMMARY_JSON_FILE])
        if problem:
            problems.append(problem)
    return Verification(evidence_id, len(files), problems)


def summary_of(raw: bytes) -> tuple[Summary | None, str | None]:
    """summary.json's bytes as the typed `Summary`, or None and one line saying why they do
    not match the contract (evidence/contract/summary_schema.py)."""
    try:
        document = strict_json_loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return None, f"{SUMMARY_JSON_FILE}: not JSON ({error})"
    try:
        return Summary.model_validate(document), None
    except ValidationError as error:
        count = error.error_count()
        more = f" (and {count - 1} more)" if count > 1 else ""
        return None, (
            f"{SUMMARY_JSON_FILE}: does not match the summary contract: "
            f"{error_line(error, whole='document')}{more}"
        )


def _provenance_problems(
    raw: bytes, inline: Mapping[str, Any]
) -> tuple[list[str], set[str] | None]:
    """Problems of provenance.json, and the run ids it covers (None when unreadable)."""
    try:
        document = strict_json_loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return [f"{PROVENANCE_FILE}: not JSON ({error})"], None
    if not isinstance(document, dict):
        return [f"{PROVENANCE_FILE}: expected a JSON object"], None
    problems = []
    runs: set[str] | None = None
    try:
        runs = {p.run_id for p in provenances_of(document)}
    except ValidationError as error:
        problems.append(f"{PROVENANCE_FILE}: invalid ({error_line(error, whole='document')})")
    if canonical_json(document) != canonical_json(dict(inline)):
        problems.append(f"{MANIFEST_FILE}: inline provenance differs from {PROVENANCE_FILE}")
    return problems, runs


def recompute_problems(files: Mapping[str, bytes], *, rel_tol: float = 1e-9) -> list[str]:
    """Recompute the summary from records.jsonl (and job.json) and compare it, typed, with
    summary.json: the first field that differs is named.

    Catches a summary whose numbers do not follow from the records it ships with. The same
    coldbench version gives the same numbers; `rel_tol` absorbs last-digit float differences
    across platforms.
    """
    if SUMMARY_JSON_FILE not in files:
        return [f"{SUMMARY_JSON_FILE}: missing, nothing to recompute"]
    stored, problem = summary_of(files[SUMMARY_JSON_FILE])
    if stored is None:
        return [f"cannot recompute: {problem}"]
    try:
        spec = JobSpec.model_validate_json(files[JOB_FILE]) if JOB_FILE in files else None
        provenance_list = provenances_of(strict_json_loads(files.get(PROVENANCE_FILE, b"{}")))
    except (ValueError, ValidationError) as error:
        return [f"cannot recompute: {' '.join(str(error).split())[:200]}"]
    records, problems = parse_records(files.get(RECORDS_FILE, b""))
    if problems:
        return [f"cannot recompute: {problems[0]}"]
    try:
        timelines = timelines_of(files)
    except ValueError as error:
        return [f"cannot recompute: {error}"]
    bootstrap = stored.settings.bootstrap
    try:
        recomputed = summarize(
            records,
            spec=spec,
            baseline=stored.baseline,
            features=stored.features,
            provenances=provenance_list,
            precision=stored.settings.precision,
            seed=bootstrap.seed if bootstrap is not None else None,
            n_resamples=bootstrap.n_resamples if bootstrap is not None else N_RESAMPLES,
            margin_threshold=stored.parity.margin_threshold,
            timelines=timelines,
        )
    except (ValueError, TypeError, KeyError) as error:
        return [f"cannot recompute: {error}"]
    difference = first_difference(stored, recomputed, "", rel_tol)
    if difference is None:
        return []
    return [f"{SUMMARY_JSON_FILE}: differs from the statistics of {RECORDS_FILE} at {difference}"]


def timelines_of(files: Mapping[str, bytes]) -> list[Timeline]:
    """The bundle's run timelines (timeline.json or timeline.<run>.json), in file-name order;
    ValueError naming the file that does not match the contract."""
    found = []
    for name in sorted(files):
        if not is_timeline_file(name):
            continue
        try:
            found.append(Timeline.model_validate_json(files[name]))
        except ValidationError as error:
            raise ValueError(f"{name}: invalid ({error_line(error, whole='document')})") from None
    return found


def verify_bundle(
    path: str | Path, *, recompute: bool = False, expect: str | None = None
) -> Verification:
    """Verify a bundle folder or zip; unreadable or unsafe input is one problem, not a crash.

    With `recompute`, an otherwise intact bundle's summary.json is also checked against the
    statistics recomputed from its records (`recompute_problems`). With `expect`, the bundle
    must also be the one that evidence id names: a self-consistent bundle swapped for another
    is intact but not the evidence the reader was sent.
    """
    try:
        files = read_bundle(path)
    except BundleError as error:
        return Verification(None, 0, [str(error)])
    result = verify_files(files)
    if expect is not None and result.evidence_id != expect:
        result.problems.insert(
            0,
            f"{MANIFEST_FILE}: this bundle is evidence {result.evidence_id}, not the expected "
            f"{expect}",
        )
    if recompute and result.is_intact:
        result.problems.extend(recompute_problems(files))
    return result


def bundle_records(files: Mapping[str, bytes]) -> list[Record]:
    """The valid records of a bundle (invalid lines are verify's business)."""
    records, _ = parse_records(files.get(RECORDS_FILE, b""))
    return records
