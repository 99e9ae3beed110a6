"""`coldbench reproduce` end to end: a bundle's job re-run from the bundle alone, compared with
the original; a host that really differs (a planted wait read only where an environment
variable is set) is reported as disagreeing; what cannot be had is refused with its reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coldbench.evidence.bundles.bundle import read_bundle, verify_bundle
from coldbench.evidence.bundles.compare import job_identity, pinned_spec
from coldbench.evidence.contract.schemas import JobSpec, Provenance
from tests.worker.conftest import git

pytestmark = pytest.mark.slow

SLOW_HOST = "COLDBENCH_TEST_SLOW_HOST"
# The embedded engine's timed prefill ends here; the `host-slow` branch waits before it, on a
# host whose environment sets SLOW_HOST only. A 256-token prefill of the micro preset is 85-250
# ms on this CPU (2026-12-06, load 2-4): 0.5 s of wait makes the candidate about 4x slower
# there, far beyond what load does to a pair, and changes nothing elsewhere.
PREFILL_END = "    prefill_s = time.perf_counter() - start\n"
PLANTED = (
    f'    if __import__("os").environ.get("{SLOW_HOST}"):  # planted: one host only\n'
    "        time.sleep(0.5)\n" + PREFILL_END
)
RUN = (
    *("--adapter", "embedded", "--recipe", "offline"),
    *("--variant", "base:ref=main", "--variant", "cand:ref=host-slow"),
    *("--model", "preset:micro", "--contexts", "256", "--rounds", "6", "--decode-tokens", "1"),
)


@pytest.fixture(scope="module")
def planted_repo(
    coldbench_repo: tuple[Path, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    source, (main, _step) = coldbench_repo
    repo = tmp_path_factory.mktemp("planted") / "engine-repo"
    git(source.parent, "clone", "-q", "--branch", main, str(source), str(repo))
    git(repo, "checkout", "-q", "-b", "host-slow")
    cell = repo / "engine" / "cell.py"
    text = cell.read_text()
    assert text.count(PREFILL_END) == 1, "coldbench.engine.cell's prefill end not found"
    cell.write_text(text.replace(PREFILL_END, PLANTED))
    git(repo, "commit", "-q", "-am", "a wait in the prefill where the host asks for one")
    git(repo, "checkout", "-q", main)
    return repo


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SLOW_HOST}
    return env | extra


@pytest.fixture(scope="module")
def original(
    planted_repo: Path,
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The evidence to reproduce, measured where SLOW_HOST is not set: its zip."""
    where = tmp_path_factory.mktemp("original")
    done = subprocess.run(
        [*coldbench_cmd, "run", "--repo", str(planted_repo), *RUN, "--out", "bundle"],
        cwd=where,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return where / "bundle.zip"


def _reproduce(
    coldbench_cmd: list[str], source: Path, cwd: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*coldbench_cmd, "reproduce", str(source), "--out", "again", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _job(files: dict[str, bytes]) -> tuple[JobSpec, Provenance]:
    spec = JobSpec.model_validate_json(files["job.json"])
    document = json.loads(files["provenance.json"])
    return spec, Provenance.model_validate(document.get("runs", [document])[0])


def test_a_bundle_reproduces_from_itself_alone_as_the_same_job(
    original: Path, coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """From the zip alone, in a folder of its own with a state folder of its own: the
    repository from the URL the bundle names, each variant at the commit it measured."""
    done = _reproduce(coldbench_cmd, original, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    again = tmp_path / "again"
    assert verify_bundle(again).is_intact
    before, after = read_bundle(original), read_bundle(again)
    spec, first = _job(before)
    reproduced, second = _job(after)
    assert reproduced == pinned_spec(spec, first)  # the job as measured, refs as commits
    assert job_identity(reproduced, second) == job_identity(spec, first)
    assert [t.commit for t in second.targets] == [t.commit for t in first.targets]
    assert {t.recipe for t in second.targets} == {"offline"}
    names = json.loads(after["reproduces.json"])
    original_id = verify_bundle(original).evidence_id
    assert names["evidence_id"] == original_id and names["source"] == str(original)
    # the comparison follows the bundle's lines, with the hosts' statement
    assert f"({original_id[:8]}): evidence {original_id}; " in done.stdout
    assert re.search(r"^  hosts (agree within \+-\d+\.\d%|disagree: )", done.stdout, re.M)
    compared = subprocess.run(
        [*coldbench_cmd, "compare", str(original), str(again)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert compared.returncode in (0, 1), compared.stderr
    assert "cand / base at 256 tokens:" in compared.stdout
    assert re.search(r"^  hosts (agree within|disagree: )", compared.stdout, re.M)


def test_a_host_that_really_differs_is_reported_as_disagreeing(
    original: Path, coldbench_cmd: list[str], tmp_path: Path
) -> None:
    done = _reproduce(coldbench_cmd, original, tmp_path, **{SLOW_HOST: "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "  hosts disagree: " in done.stdout, done.stdout
    compared = subprocess.run(
        [*coldbench_cmd, "compare", str(original), str(tmp_path / "again")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert compared.returncode == 1, compared.stdout + compared.stderr
    assert compared.stdout.rstrip().endswith("hosts disagree at 1 of 1: cand @ 256")
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    (row,) = summary["comparisons"]
    assert row["verdict"] == "slower" and row["ci_high"] < 1


def test_what_cannot_be_had_is_refused_with_its_reason(
    original: Path,
    planted_repo: Path,
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    # a clone without the candidate's commit
    partial = tmp_path / "partial"
    git(
        tmp_path,
        "clone",
        "-q",
        "--no-local",  # a local clone would share every object, the candidate's too
        "--single-branch",
        "--branch",
        "main",
        str(planted_repo),
        str(partial),
    )
    done = _reproduce(coldbench_cmd, original, tmp_path, "--repo", str(partial))
    assert done.returncode == 2
    _, first = _job(read_bundle(original))
    commit = {t.variant: t.commit for t in first.targets}["cand"]
    assert f"cannot reproduce: variant cand: commit {commit} is not in" in done.stderr
    assert not (tmp_path / "again").exists()
    # a preset whose checkpoint here is not the one measured
    models = tmp_path / "models"
    shutil.copytree(micro_model_dir, models / micro_model_dir.name)
    config = models / micro_model_dir.name / "config.json"
    config.write_text(config.read_text().replace("}", ', "note": "another build"}', 1))
    done = _reproduce(coldbench_cmd, original, tmp_path, COLDBENCH_MODEL_DIR=str(models))
    assert done.returncode == 2
    assert "cannot reproduce: model preset:micro: config digest " in done.stderr
    assert "in the bundle" in done.stderr
