"""`coldbench calibrate` end to end on this CPU with the tiny preset (a bounded budget).

The planted effect is 1-token chunks against one 128-token chunk (the same as test_cli's A/B):
a difference of this CPU's arithmetic, which other processes' load can drown, so that test is
marked `timing` and runs alone on a quiet machine (`make timing`), not in `make test`; for the
A/A job only the structure and the statistics used are asserted. The rates (A/A at or below
5%, a 2% effect found in 9 jobs of 10) are checked in tests/evidence/test_aa_simulation.py,
deterministically.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from coldbench.evidence.contract.calibration import HostCalibration

pytestmark = pytest.mark.slow


@pytest.mark.timing
def test_calibrate_reports_aa_claims_the_planted_effect_and_the_floor(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "calibration.json"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "calibrate",
            *("--model", "preset:tiny", "--contexts", "128", "--rounds", "20"),
            *("--rounds-per-process", "2", "--jobs", "1", "--variants", "2"),
            *("--base-step", "128", "--planted-step", "1", "--decode-tokens", "1"),
            *("--out", str(out), "--bundles", str(tmp_path / "bundles")),
            *("--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = HostCalibration.model_validate_json(out.read_text())
    assert (result.aa_jobs, result.planted_jobs, result.variants) == (1, 1, 2)
    assert result.planted_flags == {"prefill_step_size": 1}
    assert result.base_flags == {"prefill_step_size": 128}
    # The statistics are the cluster-aware ones: ten process pairs of two rounds each, the
    # fewest whose verdict 2 stalled pairs at each end cannot decide.
    assert result.statistics["unit"].startswith("process pair")
    for job in result.jobs:
        assert job.status == "succeeded", job.reason
        (comparison,) = job.comparisons
        assert (comparison.n, comparison.blocks) == (20, 10)
    planted = next(job for job in result.jobs if job.kind == "planted")
    assert planted.comparisons[0].verdict == "slower", planted
    assert result.planted_detected == 1 and result.planted_verdicts == {"slower": 1}
    aa = next(job for job in result.jobs if job.kind == "aa").comparisons[0]
    assert result.aa_claims == (1 if aa.verdict in ("faster", "slower") else 0)
    assert result.resolvable == pytest.approx((aa.ci_high - aa.ci_low) / 2)
    assert result.between_process_sd is not None and result.between_process_sd >= 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("A/A jobs with a faster/slower verdict: ")
    assert lines[1] == "planted effect (prefill_step_size=1) detected: 1 of 1 (slower 1)"
    assert lines[2].startswith("smallest effect this host resolves: +-")
    assert f"result {out.resolve()}" in done.stdout
    # one run (a, c and the planted p) read as both jobs: one bundle, as measured
    bundles = sorted((tmp_path / "bundles").iterdir())
    assert len(bundles) == 1 and verify_bundle(bundles[0]).is_intact
    summary = json.loads((bundles[0] / "summary.json").read_text())
    assert summary["variants"] == ["a", "c", "p"]
    assert summary["noise_floor"]["process_pairs"] == 10
    # the variance components of the run's process pairs, for this host's later runs
    # (two comparisons, c and p against a; a process pair whose cells were all left out, as
    # invalid or by the first-cell check, is not a group)
    variance, noise = result.variance, result.noise
    assert variance is not None and noise is not None and variance.comparisons == 2
    assert 2 * 10 - 2 - 2 <= variance.df_between <= 2 * 10 - 2
    assert noise.process_pairs == variance.df_between + 2 and noise.contexts == [128]


def test_calibrate_refuses_bad_input_in_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, message in (
        (["--contexts", "12x"], "--contexts: '12x' is not a token count"),
        (["--rounds", "0"], "--rounds: 0: give at least 1"),
        (["--bundles", str(tmp_path / "full")], "folder exists and is not empty"),
        (["--api", "ftp://x"], "--api 'ftp://x': give an http:// or https:// URL"),
        (["--model", str(tmp_path)], "not a checkpoint folder"),
    ):
        done = CliRunner().invoke(app, ["calibrate", "--planted-step", "1", *args])
        assert done.exit_code == 2 and message in done.stderr, (args, done.output)
        assert not (tmp_path / "calibration.json").exists()


def test_calibrate_merges_results_run_side_by_side(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    from tests.evidence.builders import calibration_sample

    first = calibration_sample()
    second = calibration_sample()
    for job in second["jobs"]:
        job["seed"] += 10
    (tmp_path / "gpu0.json").write_text(json.dumps(first))
    (tmp_path / "gpu1.json").write_text(json.dumps(second))
    (tmp_path / "bad.json").write_text("{}")
    done = subprocess.run(
        [*coldbench_cmd, "calibrate", "--merge", "gpu0.json", "--merge", "gpu1.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    merged = HostCalibration.model_validate_json((tmp_path / "calibration.json").read_text())
    assert (merged.aa_jobs, merged.planted_jobs, merged.planted_detected) == (2, 2, 2)
    assert done.stdout.splitlines()[0] == "A/A jobs with a faster/slower verdict: 0 of 2 (0%)"
    for args, message in (
        (["--merge", "bad.json"], "--merge bad.json: not a calibration result"),
        (["--merge", "gpu0.json", "--merge", "gpu0.json"], "share job seeds"),
        ([], "--planted-step: give the planted variant's chunk width"),
    ):
        refused = subprocess.run(
            [*coldbench_cmd, "calibrate", *args, "--out", "x.json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2 and message in refused.stderr, (args, refused.stderr)
        assert not (tmp_path / "x.json").exists()


def test_a_calibration_whose_every_job_failed_exits_non_zero_and_writes_no_result(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """A device too small for even one process: every run fails before it measures. The
    command must not look like a calibration to a recipe's `&&` chain or to a merge."""
    import os

    from coldbench.engine.memory import DEVICE_MEMORY_ENV

    out = tmp_path / "calibration.json"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "calibrate",
            *("--model", "preset:micro", "--contexts", "64", "--rounds", "2", "--jobs", "1"),
            *("--variants", "2", "--planted-step", "16", "--decode-tokens", "1"),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, DEVICE_MEMORY_ENV: "4096"},
    )
    assert done.returncode == 1, (done.stdout, done.stderr[-2000:])
    # said before anything ran: 2 rounds give no job an interval
    assert "warning: 2 rounds cannot reach a verdict" in done.stderr
    assert "no calibration job produced statistics (2 of 2 jobs failed: " in done.stderr
    assert "does not fit" in done.stderr and "no result written" in done.stderr
    assert not out.exists()


def test_a_calibration_whose_jobs_cannot_be_called_says_it_gives_the_noise_only() -> None:
    """Jobs of fewer process pairs than an interval needs are `inconclusive` whatever the host:
    the result must not read as a planted effect missed 10 times."""
    from tests.evidence.builders import calibration_sample

    sample = calibration_sample()
    assert HostCalibration.model_validate(sample).lines()[0].startswith("A/A jobs with")
    sample["rounds"], sample["rounds_per_process"] = 12, 12
    for job in sample["jobs"]:
        for comparison in job["comparisons"]:
            comparison.update(ci_low=None, ci_high=None, verdict="inconclusive", blocks=1)
    lines = HostCalibration.model_validate(sample).lines()
    assert lines[0] == (
        "A/A and planted verdicts: none possible (12 rounds in blocks of 12: no job had the "
        "process pairs an interval needs); this calibration gives the host's noise only"
    )
    assert not any(line.startswith("planted effect") for line in lines)


def test_calibrate_replaces_its_bundles_with_force(tmp_path: Path, monkeypatch: Any) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    # --force passes the check (and the model then fails on its own, before anything runs)
    done = CliRunner().invoke(
        app,
        ["calibrate", "--planted-step", "1", "--bundles", "full", "--force", "--model", "/nope"],
    )
    assert done.exit_code == 2 and "not empty" not in done.stderr, done.output
    assert "--model" in done.stderr or "nope" in done.stderr, done.stderr
