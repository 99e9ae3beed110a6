"""`coldbench run --mode history` and `--mode bisect` end to end: a copy of the installed mlx_lm
with a series of commits, one of which adds work per prefill chunk and one of which does not
build."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from tests.conftest import SLOW_PREFILL_SYNC_OLD
from tests.worker.conftest import git

pytestmark = pytest.mark.slow

# 0.25 s of waiting per prefill chunk, several times a whole 64-token prefill (one chunk) of the
# micro preset on this CPU (9-41 ms): one pair flips only if the baseline's cell alone runs that
# many times slower than usual, far above what other work on the machine does to it. A wait,
# not work: load stretches work on both sides alike and leaves a wait as it is.
PLANTED = SLOW_PREFILL_SYNC_OLD + "            time.sleep(0.25)  # planted: work per chunk\n"
SLOW_SUBJECT = "prefill: extra work per chunk"
# The series' good commit waits 0.1 s per chunk: slower than the commits after it (no wait) and
# faster than the planted slowdown, each by a wait several times micro's whole cell.
GOOD_WAIT = (
    SLOW_PREFILL_SYNC_OLD + "            time.sleep(0.1)  # planted: the good commit's wait\n"
)
CONTEXT = "64"
# The matrix of every history run in this module: the service path, on micro.
MATRIX = ("--model", "preset:micro", "--contexts", CONTEXT, "--rounds", "6", "--decode-tokens", "0")
NO_LOAD = (
    "\n\ndef load(*args, **kwargs):  # planted: this commit cannot load\n"
    "    raise RuntimeError('this loader refuses every checkpoint')\n"
)


@pytest.fixture(scope="module")
def series_repo(
    mlx_lm_repo: tuple[Path, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """main of mlx_lm_repo (base), then: good (a wait per chunk), faster (drops the wait),
    docs, slow (the planted slowdown), broken (does not build), fixed; and off the line,
    no-load (from docs).

    The history runs good..fixed and the bisection good..fixed, so both rest on planted
    differences, never on a comparison of identical code reading "not different": the
    bisection's first step finds its mid (docs) established faster than good, where a mid of
    the same code as good would read slower at 95% in 2.5% of runs by construction, and more
    often on micro's 6 ms cells, whose times come in two modes (about 5 and 8 ms) that a pair
    can straddle. Both use the same builds (series_state)."""
    source, (main, _slow) = mlx_lm_repo
    repo = tmp_path_factory.mktemp("series") / "mlx-lm"
    git(source.parent, "clone", "-q", "--branch", main, str(source), str(repo))
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    generate = repo / "mlx_lm" / "generate.py"
    stock = generate.read_text()
    assert stock.count(SLOW_PREFILL_SYNC_OLD) == 1 and "\nimport time\n" in stock
    pyproject = repo / "pyproject.toml"
    buildable = pyproject.read_text()
    for name, path, text, message in (
        ("good", generate, stock.replace(SLOW_PREFILL_SYNC_OLD, GOOD_WAIT), "prefill: wait"),
        ("faster", generate, stock, "prefill: drop the wait"),
        ("docs", repo / "NOTES.md", "notes\n", "docs: add notes"),
        ("slow", generate, stock.replace(SLOW_PREFILL_SYNC_OLD, PLANTED), SLOW_SUBJECT),
        ("broken", pyproject, buildable + "this is not toml [\n", "build: break pyproject"),
        ("fixed", pyproject, buildable, "build: fix pyproject"),
    ):
        path.write_text(text)
        git(repo, "add", str(path.relative_to(repo)))
        git(repo, "commit", "-q", "-m", message)
        shas[name] = git(repo, "rev-parse", "HEAD")
    # Off the line: a commit that builds but whose loader cannot load any checkpoint.
    git(repo, "checkout", "-q", "-b", "no-load", shas["docs"])
    utils = repo / "mlx_lm" / "utils.py"
    utils.write_text(utils.read_text() + NO_LOAD)
    git(repo, "commit", "-q", "-am", "load: a loader that refuses every checkpoint")
    shas["no-load"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", main)
    return repo, shas


@pytest.fixture(scope="module")
def series_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One --state-dir for the history and the bisect run of series_repo: the second reuses
    the first's mirror and its cached builds of the same commits (worker/build.py checks a
    reused build's marker and import path as it does a fresh one), which saves a build per
    commit. Each test alone still builds from nothing."""
    return tmp_path_factory.mktemp("series-state") / "state"


def test_history_finds_the_planted_step_and_skips_the_commit_that_does_not_build(
    series_repo: tuple[Path, dict[str, str]],
    series_state: Path,
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    repo, shas = series_repo
    out = tmp_path / "history"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--mode", "history", "--range", f"{shas['good']}..HEAD"),
            *MATRIX,
            *("--out", str(out), "--state-dir", str(series_state)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert verify_bundle(out).is_intact
    summary = json.loads((out / "summary.json").read_text())
    history = summary["history"]
    assert history["reference"]["commit"] == shas["good"]
    order = ["faster", "docs", "slow", "broken", "fixed"]
    assert [c["commit"] for c in history["commits"]] == [shas[name] for name in order]
    skipped = {c["commit"]: c["skipped"] for c in history["commits"] if c["skipped"]}
    assert list(skipped) == [shas["broken"]] and skipped[shas["broken"]].startswith("did not build")
    series = [
        (p["variant"], p["ratio_median"], p["ci_low"], p["ci_high"])
        for p in history["series"][0]["points"]
    ]
    # The first commit is a step after the reference where its interval against it, corrected
    # over the 5 commits, leaves 1; faster and docs (the same code) overlap, and so do slow and
    # fixed: docs..slow is the one step between measured commits.
    later = [s for s in history["steps"] if s["from_commit"] != shas["good"]]
    first = [s for s in history["steps"] if s["from_commit"] == shas["good"]]
    assert len(later) == 1 and len(first) <= 1, series
    assert all(s["to_commit"] == shas["faster"] and s["direction"] == "faster" for s in first)
    (step,) = later
    assert (step["from_commit"], step["to_commit"]) == (shas["docs"], shas["slow"])
    assert step["direction"] == "slower" and step["subject"] == SLOW_SUBJECT
    points = {p["commit"]: p for p in history["series"][0]["points"]}
    assert points[shas["faster"]]["ci_low"] > 1 and points[shas["docs"]]["ci_low"] > 1
    assert points[shas["fixed"]]["ci_high"] < 1  # the slowdown stays after the skipped commit
    assert SLOW_SUBJECT in done.stdout
    assert "did not build" in done.stdout
    report = (out / "report.html").read_text()
    assert 'id="fig-history"' in report and 'class="step"' in report


def test_a_history_commit_that_cannot_load_is_recorded_and_skipped(
    series_repo: tuple[Path, dict[str, str]],
    series_state: Path,
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    """Like a commit that does not build: the run goes on, the commit is named with why."""
    repo, shas = series_repo
    out = tmp_path / "history-no-load"
    commits = ",".join(shas[name] for name in ("base", "no-load", "docs"))
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--mode", "history", "--commits", commits),
            *MATRIX,
            *("--out", str(out), "--state-dir", str(series_state)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert verify_bundle(out).is_intact
    history = json.loads((out / "summary.json").read_text())["history"]
    skipped = {c["commit"]: c["skipped"] for c in history["commits"]}
    assert skipped[shas["docs"]] is None
    why = skipped[shas["no-load"]]
    assert why.startswith("did not load: variant c01-") and "refuses every checkpoint" in why
    points = {p["commit"]: p for p in history["series"][0]["points"]}
    assert points[shas["docs"]]["n"] == 6 and points[shas["no-load"]]["skipped"] == why
    assert f"1 commit did not build or load and was skipped: {shas['no-load'][:10]}" in done.stdout


def test_history_input_errors_are_one_line(
    series_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    repo, shas = series_repo
    for args, message in (
        # Both missing at once: both said (the range, and the repository).
        (["--mode", "history"], "--repo: history mode needs a repository"),
        (["--repo", str(repo), "--mode", "history"], "--range: history needs a range A..B"),
        (["--repo", str(repo), "--mode", "history", "--range", "HEAD..HEAD"], "holds no commit"),
        (["--range", "a..b"], "--range: belongs to mode history"),
        (
            ["--repo", str(repo), "--mode", "history", "--range", "nope..HEAD"],
            "ref 'nope' not found",
        ),
    ):
        done = CliRunner().invoke(app, ["run", *args, "--state-dir", str(tmp_path / "state")])
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.exit_code == 2 and errors, (args, done.output[-2000:])
        assert any(message in error for error in errors), (args, errors)
    shutil.rmtree(tmp_path / "state", ignore_errors=True)


def test_bisect_finds_the_planted_commit_in_steps_each_with_its_evidence(
    series_repo: tuple[Path, dict[str, str]],
    series_state: Path,
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    repo, shas = series_repo
    out = tmp_path / "bisect"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--mode", "bisect", "--good", shas["good"]),
            *("--bad", shas["fixed"], "--direction", "slower"),
            *MATRIX,
            *("--out", str(out), "--state-dir", str(series_state)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    steps = sorted(p for p in out.iterdir() if p.is_dir())
    # good faster docs slow broken fixed: mid docs, established faster than good (upper),
    # then mid slow, slower like hi and docs' child: found there, the pair docs..slow not
    # measured again.
    assert [p.name for p in steps] == ["step-01", "step-02"]
    for step in steps:
        assert verify_bundle(step).is_intact
    final = json.loads((steps[-1] / "summary.json").read_text())["bisect"]
    assert final["first_bad_commit"] == shas["slow"]
    assert final["parent"] == shas["docs"]
    assert final["ratio"]["ci_high"] < 1
    assert [s["decision"] for s in final["steps"]] == ["upper"]
    assert [s["location"] for s in final["steps"]] == ["../step-01/report.html"]
    assert final["decision"] == "found" and final["ratio"] == final["mid_result"]
    first = json.loads((steps[0] / "summary.json").read_text())["bisect"]
    assert first["first_bad_commit"] is None and first["reason"] == "bisection not finished"
    assert first["mid_result"]["ci_low"] > 1, first["mid_result"]  # docs: faster than good
    report = (steps[-1] / "report.html").read_text()
    assert 'href="../step-01/report.html"' in report and shas["slow"] in report
    assert f"First slower commit at {CONTEXT} tokens: {shas['slow']}" in done.stdout


def test_a_bisection_of_too_few_rounds_says_so_before_its_first_step(
    series_repo: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """6 rounds: the same warning as any other mode's, with the rounds a step needs, before
    anything is built (the first step is refused here, so nothing is)."""
    from typer.testing import CliRunner

    from coldbench.worker import run
    from coldbench.worker.cli import app

    def refused(*args: object, **kwargs: object) -> None:
        raise run.RunRefused("refused before building")

    monkeypatch.setattr(run, "execute_run", refused)
    repo, shas = series_repo
    done = CliRunner().invoke(
        app,
        [
            "run",
            *("--repo", str(repo), "--mode", "bisect", "--good", shas["good"]),
            *("--bad", shas["fixed"], "--direction", "slower"),
            *MATRIX,
            *("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "bisect")),
        ],
    )
    lines = done.stderr.splitlines()
    assert done.exit_code == 2 and "error: refused before building" in lines, done.output
    (warning,) = [line for line in lines if line.startswith("warning: ")]
    assert warning.startswith("warning: 6 rounds cannot reach a verdict: the robust interval")
    assert "needs at least 10 rounds" in warning
    assert "without --rounds each step measures until decided within 40 rounds" in warning
