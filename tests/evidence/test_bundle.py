from __future__ import annotations

import io
import json
import os
import stat
import struct
import subprocess
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.bundles.bundle import (
    MANIFEST_FILE,
    MAX_BUNDLE_BYTES,
    BundleError,
    bundle_files,
    evidence_id_of,
    read_bundle,
    read_zip,
    verify_bundle,
    verify_files,
    write_folder,
    zip_bytes,
)
from coldbench.evidence.contract.canonical import canonical_json, sha256_hex
from tests.evidence.builders import provenance, simulate_run


@pytest.fixture
def files() -> dict[str, bytes]:
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=3)
    return bundle_files(
        records=records,
        provenances=[provenance()],
        build_logs={"base": "built base\n", "fast": b"built fast\n"},
        summary=summarize(records, baseline="base", n_resamples=50),
        summary_md="# summary\n",
        report_html="<!doctype html><title>r</title>",
    )


@pytest.fixture
def folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    return write_folder(tmp_path / "bundle", files)


def test_manifest_lists_every_other_file_with_digest_and_size(files: dict[str, bytes]) -> None:
    manifest = json.loads(files[MANIFEST_FILE])
    assert set(manifest["files"]) == set(files) - {MANIFEST_FILE}
    assert "build-base.log" in manifest["files"]
    for name, entry in manifest["files"].items():
        assert entry == {"sha256": sha256_hex(files[name]), "bytes": len(files[name])}
    assert manifest["provenance"] == json.loads(files["provenance.json"])
    assert files["provenance.json"] == canonical_json(manifest["provenance"])
    assert files[MANIFEST_FILE] == canonical_json(manifest)


def test_intact_folder_and_zip_verify_with_the_same_evidence_id(
    tmp_path: Path, folder: Path, files: dict[str, bytes]
) -> None:
    result = verify_bundle(folder)
    assert result.problems == []
    assert result.evidence_id == sha256_hex(files[MANIFEST_FILE])[:24]
    assert result.file_count == len(files)
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(zip_bytes(files))
    assert verify_bundle(archive).evidence_id == result.evidence_id
    assert zip_bytes(files) == zip_bytes(dict(reversed(list(files.items()))))


def test_zip_with_one_top_folder_reads_like_the_folder(files: dict[str, bytes]) -> None:
    nested = zip_bytes({f"bundle/{name}": content for name, content in files.items()})
    assert read_zip(nested) == files


@pytest.mark.parametrize(
    "name", ["records.jsonl", "provenance.json", "report.html", "build-fast.log"]
)
def test_one_flipped_byte_in_any_file_names_that_file(folder: Path, name: str) -> None:
    path = folder / name
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x01
    path.write_bytes(bytes(content))
    problems = verify_bundle(folder).problems
    assert any(p.startswith(f"{name}: altered (sha256") for p in problems), problems


def test_truncation_missing_and_extra_files_are_each_named(folder: Path) -> None:
    summary = folder / "summary.md"
    summary.write_bytes(summary.read_bytes()[:-3])
    (folder / "build-base.log").unlink()
    (folder / "notes.txt").write_text("added later")
    problems = verify_bundle(folder).problems
    assert problems == [
        "build-base.log: missing",
        "summary.md: altered (7 bytes, manifest says 10)",
        "notes.txt: extra (not in the manifest)",
    ]


def test_manifest_edits_change_the_id_or_are_caught(folder: Path, files: dict[str, bytes]) -> None:
    original_id = evidence_id_of(files[MANIFEST_FILE])
    manifest = json.loads(files[MANIFEST_FILE])
    manifest["files"]["records.jsonl"]["sha256"] = "0" * 64
    (folder / MANIFEST_FILE).write_bytes(canonical_json(manifest))
    result = verify_bundle(folder)
    assert result.evidence_id != original_id
    assert [p.split(" (")[0] for p in result.problems] == ["records.jsonl: altered"]

    manifest = json.loads(files[MANIFEST_FILE])
    manifest["provenance"]["run_id"] = "forged"
    (folder / MANIFEST_FILE).write_bytes(canonical_json(manifest))
    assert verify_bundle(folder).problems == [
        "manifest.json: inline provenance differs from provenance.json"
    ]

    (folder / MANIFEST_FILE).write_text("{not json")
    problems = verify_bundle(folder).problems
    assert len(problems) == 1 and problems[0].startswith("manifest.json: invalid")

    (folder / MANIFEST_FILE).unlink()
    assert verify_bundle(folder).problems == ["manifest.json: missing"]


def test_consistent_forgery_of_records_is_still_refused_by_validation(
    files: dict[str, bytes],
) -> None:
    forged = dict(files)
    lines = forged["records.jsonl"].splitlines(keepends=True)
    value = json.loads(lines[2])
    value["cached_tokens"] = 5  # a warm cell passed off as cold
    lines[2] = json.dumps(value).encode() + b"\n"
    forged["records.jsonl"] = b"".join(lines)
    manifest = json.loads(forged[MANIFEST_FILE])
    manifest["files"]["records.jsonl"] = {
        "sha256": sha256_hex(forged["records.jsonl"]),
        "bytes": len(forged["records.jsonl"]),
    }
    forged[MANIFEST_FILE] = canonical_json(manifest)
    problems = verify_files(forged).problems
    assert len(problems) == 1
    assert problems[0].startswith("records.jsonl line 3: ") and "cached_tokens=5" in problems[0]


def _zip_with(name: str, *, mode: int = stat.S_IFREG | 0o644) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        archive.writestr(info, b"x")
    return buffer.getvalue()


def _zip_declaring(inflated: int, declared: int) -> bytes:
    """A zip whose one deflated entry of `inflated` zero bytes says it holds `declared` bytes
    (in its local header and the central directory): a bomb a few hundred KiB long."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo("records.jsonl")
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, bytes(inflated))
    data = bytearray(buffer.getvalue())
    struct.pack_into("<I", data, 22, declared)  # the local header's uncompressed size
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, declared)
    return bytes(data)


def test_a_zip_entry_that_inflates_past_its_declared_size_is_refused_within_it() -> None:
    """Issue 46, 5: `coldbench verify` of a 2.4 MB zip whose 1 GiB entry declared 1 KiB peaked
    at 2.1 GB before refusing it. An entry is inflated chunk by chunk, never past what it
    declares: a 64 MiB entry declaring 1 KiB is refused within a few MiB of memory."""
    bomb = _zip_declaring(64 << 20, 1024)
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="records.jsonl"):
            read_zip(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_a_zip_declaring_more_than_the_bound_is_refused_before_inflating() -> None:
    bomb = _zip_declaring(1024, MAX_BUNDLE_BYTES + 1)
    with pytest.raises(BundleError, match=f"declares {MAX_BUNDLE_BYTES + 1} bytes"):
        read_zip(bomb)


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/passwd", "a/../../evil", "C:/x", "a\\..\\b"])
def test_zip_with_unsafe_names_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(BundleError, match="absolute or parent path refused"):
        read_zip(_zip_with(name))
    archive = tmp_path / "evil.zip"
    archive.write_bytes(_zip_with(name))
    result = verify_bundle(archive)
    assert len(result.problems) == 1 and "refused" in result.problems[0]
    assert not (tmp_path.parent / "evil.txt").exists()


def test_zip_with_a_symlink_is_refused() -> None:
    with pytest.raises(BundleError, match="symbolic link refused"):
        read_zip(_zip_with("records.jsonl", mode=stat.S_IFLNK | 0o777))


def test_folder_with_a_symlink_is_refused(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", folder / "link.txt")
    with pytest.raises(BundleError, match="link.txt: symbolic link refused"):
        read_bundle(folder)


def test_not_a_bundle_is_one_problem(tmp_path: Path) -> None:
    (tmp_path / "plain.txt").write_text("hello")
    assert (
        verify_bundle(tmp_path / "plain.txt")
        .problems[0]
        .endswith("neither a bundle folder nor a zip file")
    )
    assert verify_bundle(tmp_path / "absent").problems[0].endswith("does not exist")


def test_write_folder_refuses_a_non_empty_folder(folder: Path, files: dict[str, bytes]) -> None:
    with pytest.raises(BundleError, match="not empty"):
        write_folder(folder, files)


def test_bundle_refuses_unsafe_build_log_names() -> None:
    with pytest.raises(ValueError, match="not a plain file name"):
        bundle_files(records=b"", provenances=[provenance()], build_logs={"../x.log": b""})


def test_several_runs_keep_every_provenance(files: dict[str, bytes]) -> None:
    both = bundle_files(
        records=b"", provenances=[provenance(), provenance(run_id="r-2", hostname="studio-2")]
    )
    assert [run["run_id"] for run in json.loads(both["provenance.json"])["runs"]] == ["r-1", "r-2"]
    assert verify_files(both).problems == []


def test_cli_verify_exit_codes_and_lines(folder: Path, coldbench_cmd: list[str]) -> None:
    ok = subprocess.run([*coldbench_cmd, "verify", str(folder)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("intact: ") and ok.stdout.strip().endswith(", 8 files")
    (folder / "report.html").write_text("changed")
    (folder / "extra.bin").write_bytes(b"\0")
    bad = subprocess.run([*coldbench_cmd, "verify", str(folder)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        "report.html: altered (7 bytes, manifest says 31)",
        "extra.bin: extra (not in the manifest)",
    ]


def test_write_bundle_end_to_end(tmp_path: Path, coldbench_cmd: list[str]) -> None:
    from coldbench.evidence.bundles.bundle import write_bundle
    from coldbench.evidence.contract.schemas import JobSpec

    spec = JobSpec.model_validate(
        {"variants": [{"name": "base"}, {"name": "fast"}], "contexts": [64, 256], "rounds": 8}
    )
    records = simulate_run(effects={"base": 1.0, "fast": 1.08}, rounds=8, noise=0.01)
    written = write_bundle(
        tmp_path / "evidence",
        records=records,
        provenances=provenance(),
        spec=spec,
        build_logs={"base": "ok\n", "fast": "ok\n"},
        n_resamples=300,
        extra_files={"controls.jsonl": b"{}\n"},
    )
    assert sorted(p.name for p in written.path.iterdir()) == [
        "build-base.log",
        "build-fast.log",
        "controls.jsonl",
        "job.json",
        "manifest.json",
        "provenance.json",
        "records.jsonl",
        "report.html",
        "summary.json",
        "summary.md",
    ]
    assert verify_bundle(written.path).problems == []
    assert written.zip_path is not None
    assert verify_bundle(written.zip_path).evidence_id == written.evidence_id
    assert written.evidence_id == evidence_id_of((written.path / MANIFEST_FILE).read_bytes())
    assert (
        json.loads((written.path / "summary.json").read_text()) == written.summary.to_json_value()
    )
    assert [c.verdict for c in written.summary.comparisons] == ["faster", "faster"]
    records_digest = written.manifest["files"]["records.jsonl"]["sha256"]
    assert records_digest in (written.path / "report.html").read_text()
    assert "| 64 | fast |" in (written.path / "summary.md").read_text()
    ok = subprocess.run(
        [*coldbench_cmd, "verify", "--recompute", str(written.zip_path)],
        capture_output=True,
        text=True,
    )
    assert ok.stdout.strip() == f"intact: {written.evidence_id}, 10 files"


def _reseal(files: dict[str, bytes]) -> dict[str, bytes]:
    """Rewrite the manifest over edited files: what a careful forger would do."""
    from coldbench.evidence.bundles.bundle import build_manifest

    resealed = dict(files)
    provenance_value = json.loads(files["provenance.json"])
    resealed[MANIFEST_FILE] = build_manifest(resealed, provenance_value)
    return resealed


def test_recompute_catches_a_resealed_summary_whose_numbers_were_edited(tmp_path: Path) -> None:
    from coldbench.evidence.bundles.bundle import build_bundle, recompute_problems

    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    files, summary = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=200
    )
    assert recompute_problems(files) == []
    edited = json.loads(files["summary.json"])
    edited["comparisons"][0]["verdict"] = "faster"
    edited["comparisons"][0]["ci_low"] = 1.01
    forged = _reseal({**files, "summary.json": json.dumps(edited).encode()})
    assert verify_files(forged).problems == []  # internally consistent...
    assert recompute_problems(forged) == [
        "summary.json: differs from the statistics of records.jsonl at comparisons[0].ci_low"
    ]
    archive = tmp_path / "forged.zip"
    archive.write_bytes(zip_bytes(forged))
    assert len(verify_bundle(archive, recompute=True).problems) == 1


def test_recompute_names_a_field_the_forger_added_or_removed() -> None:
    from coldbench.evidence.bundles.bundle import build_bundle, recompute_problems

    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    files, _ = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=200
    )
    edited = json.loads(files["summary.json"])
    # `why` is only written for a comparison without pairs: claiming one is a difference.
    edited["comparisons"][0]["why"] = "no valid cell of fast"
    forged = _reseal({**files, "summary.json": json.dumps(edited).encode()})
    assert verify_files(forged).problems == []
    assert recompute_problems(forged) == [
        "summary.json: differs from the statistics of records.jsonl at comparisons[0].why"
    ]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda s: s["comparisons"][0].update(verdict="much faster"),
            "comparisons.0.verdict: Input should be 'faster', 'slower', 'no established "
            "change', 'inconclusive' or 'no valid pairs'",
        ),
        (lambda s: s.pop("drift"), "drift: Field required"),
        (lambda s: s.update(verdict="faster"), "verdict: Extra inputs are not permitted"),
        (lambda s: s["invalid"].update(total="3 cells"), "invalid.total: Input should be a"),
        (lambda s: s.update(format="coldbench.summary/0"), "format: Input should be"),
    ],
)
def test_verify_refuses_a_resealed_summary_that_breaks_the_contract(
    tmp_path: Path, coldbench_cmd: list[str], edit, reason: str
) -> None:
    from coldbench.evidence.bundles.bundle import build_bundle

    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    files, _ = build_bundle(records=records, provenances=[provenance()], baseline="base")
    edited = json.loads(files["summary.json"])
    edit(edited)
    forged = _reseal({**files, "summary.json": json.dumps(edited).encode()})
    (problem,) = verify_files(forged).problems
    assert problem.startswith(f"summary.json: does not match the summary contract: {reason}")
    folder = write_folder(tmp_path / "forged", forged)
    result = subprocess.run([*coldbench_cmd, "verify", str(folder)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [problem]


def test_every_bundle_summary_reads_back_to_the_same_bytes() -> None:
    """summary.json is written from the typed summary and, parsed back, writes the same bytes:
    which keys a file holds is part of the contract (evidence/contract/summary_schema.py)."""
    from coldbench.evidence.bundles.bundle import build_bundle, summary_of
    from coldbench.evidence.contract.summary_schema import summary_json_bytes

    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=6)
    files, summary = build_bundle(records=records, provenances=[provenance()], baseline="base")
    parsed, problem = summary_of(files["summary.json"])
    assert problem is None and parsed is not None
    assert summary_json_bytes(parsed) == files["summary.json"] == summary_json_bytes(summary)
    assert "why" not in json.loads(files["summary.json"])["comparisons"][0]


def test_records_of_a_run_without_provenance_and_bad_job_json_are_named(
    files: dict[str, bytes],
) -> None:
    stray = simulate_run(effects={"base": 1.0}, rounds=1, run_id="r-9")
    forged = _reseal(
        {
            **files,
            "records.jsonl": files["records.jsonl"]
            + b"".join(json.dumps(r.to_json_dict()).encode() + b"\n" for r in stray),
            "job.json": b'{"variants": []}',
        }
    )
    problems = verify_files(forged).problems
    assert "records.jsonl: run 'r-9' has no provenance" in problems
    assert any(p.startswith("job.json: invalid (variants:") for p in problems)


def _run_spec():
    from coldbench.evidence.contract.schemas import JobSpec

    return JobSpec.model_validate(
        {"variants": [{"name": "base"}, {"name": "fast"}], "contexts": [64], "rounds": 6}
    )


def test_a_hosts_bundle_is_build_bundles_own() -> None:
    """`coldbench run` and the agent bundle through build_run_bundle: the same files as the
    service's build_bundle for the same records, spec and provenance."""
    from coldbench.evidence.bundles.bundle import build_bundle, build_run_bundle
    from coldbench.evidence.contract.records import records_bytes

    records = records_bytes(simulate_run(effects={"base": 1.0, "fast": 1.05}, contexts=(64,)))
    common = {"records": records, "provenances": [provenance()], "spec": _run_spec()}
    extra = {"controls.jsonl": b"{}\n", "reason.txt": b"stopped\n"}
    files, summary = build_run_bundle(**common, build_logs={"base": b"ok\n"}, extra_files=extra)
    expected, expected_summary = build_bundle(
        **common, build_logs={"base": b"ok\n"}, extra_files=extra
    )
    assert files == expected and summary == expected_summary
    assert verify_files(files).problems == []


def test_a_run_without_measured_cells_bundles_its_data_and_logs_only() -> None:
    from coldbench.evidence.bundles.bundle import build_run_bundle

    files, summary = build_run_bundle(
        records=b"",
        provenances=[provenance()],
        spec=_run_spec(),
        build_logs={"fast": b"error: build failed\n"},
        extra_files={"reason.txt": b"build of fast failed\n"},
    )
    assert summary is None
    assert sorted(files) == [
        "build-fast.log",
        "job.json",
        "manifest.json",
        "provenance.json",
        "reason.txt",
        "records.jsonl",
    ]
    assert verify_files(files).problems == []


def test_a_rendering_failure_keeps_the_measurements(monkeypatch, caplog) -> None:
    import coldbench.evidence.bundles.bundle
    from coldbench.evidence.bundles.bundle import build_run_bundle
    from coldbench.evidence.contract.records import records_bytes

    def broken(*args, **kwargs):
        raise RuntimeError("template bug")

    monkeypatch.setattr(coldbench.evidence.bundles.bundle, "render_report_html", broken)
    records = records_bytes(simulate_run(effects={"base": 1.0, "fast": 1.05}, contexts=(64,)))
    files, summary = build_run_bundle(records=records, provenances=[provenance()], spec=_run_spec())
    assert summary is None and files["records.jsonl"] == records
    assert "summary.json" not in files and "report.html" not in files
    assert verify_files(files).problems == []
    assert "bundling the data without them" in caplog.text
    with pytest.raises(ValueError, match="records.jsonl is not valid: records.jsonl line 1"):
        build_run_bundle(records=b"{not json\n", provenances=[provenance()], spec=_run_spec())
