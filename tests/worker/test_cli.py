"""`coldbench run` end to end on this machine: real MLX on the CPU, the tiny preset."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from coldbench.evidence.contract.records import read_records

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(
    coldbench_cmd: list[str], *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*coldbench_cmd, "run", *args, "--state-dir", str(cwd / "state")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env} if env else None,
    )


def test_aa_never_claims_a_difference(
    coldbench_cmd: list[str], repo_root: Path, tmp_path: Path
) -> None:
    """Two identical variants, 6 rounds: each verdict is what its interval shows.

    Precision 0.25: this 2-core machine is shared, so A/A pairs spread well beyond the +-2%
    default while others run (intervals as wide as [0.60, 1.36] were seen). The two intervals
    hold together at 95% (each at 97.5%): an A/A job claims a difference in at most 5% of runs
    by construction (benchmarks/aa_simulation.py measures that rate); here the rule is checked,
    cell by cell of the matrix, on real processes.
    """
    out = tmp_path / "aa"
    done = _run(
        coldbench_cmd,
        *("--contexts", "64,128", "--rounds", "6", "--decode-tokens", "1"),
        *("--variant", "a", "--variant", "b", "--seed", "3", "--precision", "0.25"),
        *("--out", str(out)),
        cwd=tmp_path,
        # glibc's default, set: the variant processes' evidence names the malloc tunables they
        # ran with, and only variables of that kind
        env={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0", "COLDBENCH_UNRELATED_VALUE": "x"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"bundle {out.resolve()}" in done.stdout
    # stderr is no terminal here (a log, nohup, CI): a plain line as each cell ends, not one
    # progress bar drawn when the run is over.
    ended = re.findall(r"^(\d+)/24 cells done, last [ab] @ (?:64|128) tokens", done.stderr, re.M)
    assert [int(n) for n in ended] == list(range(1, 25)), done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["comparisons"]) == 2
    for row in summary["comparisons"]:
        assert row["n"] == 6 and row["ci_low"] <= row["ratio_median"] <= row["ci_high"], row
        assert row["interval_level"] == pytest.approx(0.975)
        if row["ci_low"] > 1 or row["ci_high"] < 1:
            assert row["verdict"] == ("faster" if row["ci_low"] > 1 else "slower"), row
        elif 0.75 <= row["ci_low"] <= row["ci_high"] <= 1.25:
            assert row["verdict"] == "no established change", row
        else:
            assert row["verdict"] == "inconclusive", row
        assert row["verdict"] in done.stdout
    assert verify_bundle(out).is_intact
    assert (tmp_path / "aa.zip").is_file()
    for name in ("records.jsonl", "provenance.json", "summary.md", "report.html", "job.json"):
        assert (out / name).is_file(), name
    records = read_records(out / "records.jsonl")
    measured = [r for r in records if r.round >= 0]
    assert len(measured) == 24
    # Six rounds: a fresh process per variant every round (at least 12 blocks, at most one
    # per round), each warming both contexts before its round's first timed cell.
    assert all(r.process == r.round + 1 for r in measured)
    assert "Noise floor: 6 process pairs of 1 round each" in done.stdout
    warmups = sorted(
        (r.variant, r.process, r.context_tokens) for r in records if r.status == "warmup"
    )
    assert warmups == [(v, p, c) for v in "ab" for p in range(1, 7) for c in (64, 128)]
    assert all(r.status == "ok" and r.cached_tokens == 0 for r in measured)
    # The run's one warm canary (engine/canary.py), caught by the cold check.
    (canary,) = [r for r in records if r.round == -2]
    assert canary.status == "invalid" and canary.cached_tokens and canary.cached_tokens > 0
    assert summary["canary"]["runs"][0]["result"] == "caught"
    assert "evidence_invalid" not in summary
    # Within each round the two variants saw the same prompt; across rounds, different ones.
    by_round = {(r.round, r.context_tokens, r.variant): r.prompt_sha256 for r in measured}
    assert all(by_round[(k[0], k[1], "a")] == by_round[(k[0], k[1], "b")] for k in by_round)
    assert len({by_round[(r, 64, "a")] for r in range(6)}) == 6
    # The order rotates: `a` is not always first.
    firsts = {
        min((r for r in measured if r.round == n), key=lambda r: r.order).variant for n in range(6)
    }
    assert firsts == {"a", "b"}
    provenance = json.loads((out / "provenance.json").read_text())
    runs = provenance.get("runs", [provenance])
    run = runs[0]
    # The line that repeats the run: the spec's own options, and a new folder every time.
    assert run["command"].startswith("coldbench run --model preset:tiny --contexts 64,128")
    assert "--out" not in run["command"]
    assert run["host"]["backend"] == "cpu" and run["software"]["pip_freeze_sha256"]
    targets = {t["variant"]: t for t in run["targets"]}
    engine_file = str((repo_root / "engine" / "__init__.py").resolve())
    assert targets["a"]["engine_module_file"] == engine_file
    # each variant's own process says what it imported
    for target in targets.values():
        software = target["software"]
        assert software["files"]["engine"] == engine_file
        assert software["files"]["kernels"] == str(repo_root / "kernels" / "__init__.py")
        assert software["mlx"] and software["mlx_lm"] and software["python"]
        assert software["environment"].get("GLIBC_TUNABLES") == "glibc.malloc.hugetlb=0"
        assert not any(name.startswith("COLDBENCH") for name in software["environment"])
    summary_md = (out / "summary.md").read_text()
    assert "software (its own process)" in summary_md
    assert "environment `GLIBC_TUNABLES=glibc.malloc.hugetlb=0`" in summary_md
    assert run["model"]["weights_sha256"] and run["job_spec_sha256"]


@pytest.mark.timing
def test_ab_detects_a_slower_prefill(coldbench_cmd: list[str], tmp_path: Path) -> None:
    """1-token chunks against one 128-token chunk: fewer tok/s on a quiet CPU (docs/worker.md),
    a difference of its arithmetic that other processes' load can drown, hence `timing`
    (`make timing`, alone on a quiet machine)."""
    out = tmp_path / "ab"
    done = _run(
        coldbench_cmd,
        *("--contexts", "128", "--rounds", "7", "--decode-tokens", "1"),
        *("--variant", "base:prefill_step_size=128", "--variant", "small:prefill_step_size=1"),
        *("--out", str(out)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["comparisons"]
    assert (row["variant"], row["context_tokens"]) == ("small", 128)
    ratios = [
        f"{r.prefill_tps / b.prefill_tps:.3f}"
        for r in read_records(out / "records.jsonl")
        for b in read_records(out / "records.jsonl")
        if r.variant == "small" and b.variant == "base" and r.round == b.round >= 0
    ]
    assert row["verdict"] == "slower", (row, ratios)
    assert row["ci_high"] < 1
    records = read_records(out / "records.jsonl")
    widths = {r.variant: r.counters["chunk_width_max"] for r in records if r.round >= 0}
    assert widths == {"base": 128, "small": 1}


def test_until_decided_stops_at_the_first_look_that_decides(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """4-token chunks against 64-token ones (about 3x fewer tok/s on this CPU, even at a load
    of 15): measuring until decided with a budget of 40 rounds, the run stops at the first look
    (10, 20 or 40 rounds) whose interval leaves 1, and the summary analyses exactly the rounds
    of that look and says why it stopped."""
    out = tmp_path / "decided"
    done = _run(
        coldbench_cmd,
        *("--model", "preset:micro", "--contexts", "128", "--decode-tokens", "1"),
        *("--until", "decided", "--rounds", "40"),
        *("--variant", "base:prefill_step_size=4", "--variant", "wide:prefill_step_size=64"),
        *("--out", str(out)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    sequential = summary["settings"]["sequential"]
    assert sequential["looks"] == [10, 20, 40]
    (row,) = summary["comparisons"]
    assert row["verdict"] == "faster" and row["ci_low"] > 1, row
    analysed = sequential["rounds_analysed"]
    # every pair analysed is of a round the look reached (a cell the judge set aside has none)
    assert analysed in (10, 20, 40) and row["n"] <= analysed
    assert all(pair["round"] < analysed for pair in row["ratios"])
    assert sequential["stopped"] == f"every comparison decided at look {sequential['taken']}"
    measured = [r for r in read_records(out / "records.jsonl") if r.round >= 0]
    # the run ended at that look: no round past it was measured
    assert max(r.round for r in measured) + 1 == analysed
    assert (
        "Measured until decided: looks after 10, 20, 40 rounds" in (out / "summary.md").read_text()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # What only this machine can tell; the options themselves are the builder's
        # (tests/evidence/test_job_options.py).
        (["--repo", "/nonexistent/repo", "--variant", "a:ref=main"], "not a git repository"),
        (["--model", "/nonexistent/model"], "not a checkpoint folder"),
        (["--model", "preset:nope"], "unknown model 'preset:nope'"),
        (["--adapter", "openai-server"], "--adapter openai-server needs --server-command"),
        (["--wipe", "/tmp/x"], "--wipe: only with --adapter openai-server"),
        (["--corpus", "/nonexistent/corpus.txt"], "is not a file"),
        (["--residency", "both"], "--residency: 'both': give auto, side-by-side or in-turns"),
        (
            ["--fresh-process", "--residency", "in-turns"],
            "--residency: fresh_process (a process per cell) keeps no process resident",
        ),
        (
            ["--adapter", "embedded", "--repo", str(REPO_ROOT), "--variant", "a"],
            "--variant: variant a names no ref of",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    out = tmp_path / "out"
    done = CliRunner().invoke(
        app, ["run", *args, "--out", str(out), "--state-dir", str(tmp_path / "state")]
    )
    assert done.exit_code == 2, done.output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], done.stderr[-2000:]
    assert not out.exists() or not any(out.iterdir())


def test_every_bad_option_is_reported_at_once(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    done = CliRunner().invoke(
        app,
        ["run", "--contexts", "12x", "--rounds", "0", "--range", "a..b", "--model", "/nope"],
    )
    assert done.exit_code == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 4, lines
    assert all(line.startswith("error: ") for line in lines)
    assert {line.split(":")[1].split()[0] for line in lines} == {
        "--model",
        "--contexts",
        "--rounds",
        "--range",
    }


def test_the_local_run_resolves_its_rounds_once_and_measures_until_decided_by_default(
    tmp_path: Path,
) -> None:
    """`coldbench run`'s setup is where a local job's rounds are resolved: left out, measuring
    until decided within four first looks (no time budget unless given); `--until rounds`
    measures exactly the rounds given, or one first look; the help says so."""
    from typer.testing import CliRunner

    from coldbench.evidence.contract.schemas import JobSpec
    from coldbench.worker.cli import app
    from coldbench.worker.local_run import ServerOptions, local_setup

    def spec(**given: Any) -> JobSpec:
        setup = local_setup(
            given, repo=None, module=None, server=ServerOptions(), state_dir=tmp_path
        )
        return setup.spec

    default = spec()
    assert type(default) is JobSpec
    assert (default.until, default.rounds, default.budget_minutes) == ("decided", 40, None)
    assert (spec(rounds="12").until, spec(rounds="12").rounds) == ("decided", 12)
    fixed = spec(until="rounds")
    assert (fixed.until, fixed.rounds) == ("rounds", 10)
    assert spec(until="rounds", rounds="7").rounds == 7
    assert spec(budget_minutes="15").budget_minutes == 15
    shown = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    helped = " ".join(re.sub("[│╭╮╰╯─]", " ", shown).split())
    assert "--until decided|rounds" in helped and "Default: decided." in helped
    assert "Default: 4 first looks of 10 process blocks (40 rounds)" in helped


def test_existing_bundle_is_never_overwritten(coldbench_cmd: list[str], tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "records.jsonl").write_text("precious\n")
    done = _run(coldbench_cmd, "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (out / "records.jsonl").read_text() == "precious\n"


def test_repo_build_failure_completes_the_run_as_failed_with_its_log(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """`--repo` goes through the same checkout and build as the agent; a branch that does not
    build fails the run (exit 1) and the bundle keeps the build log."""
    from tests.worker.conftest import git

    repo = tmp_path / "broken"
    (repo / "mlx_lm").mkdir(parents=True)
    (repo / "mlx_lm" / "__init__.py").write_text("")
    (repo / "setup.py").write_text("raise SystemExit('this branch does not build')\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "broken build")
    out = tmp_path / "failed"
    done = _run(
        coldbench_cmd,
        *("--repo", str(repo), "--variant", "main:ref=main", "--contexts", "64", "--rounds", "1"),
        *("--out", str(out)),
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "run failed: variant main: build failed: recipe editable exited with code" in (
        done.stderr
    )
    log = (out / "build-main.log").read_text()
    assert "this branch does not build" in log
    provenance = json.loads((out / "provenance.json").read_text())
    (target,) = provenance["targets"]
    assert target["commit"] == git(repo, "rev-parse", "main") and target["recipe"] == "editable"
    assert target["build_log_sha256"] and verify_bundle(out).is_intact
    assert read_records(out / "records.jsonl") == []


def test_ablation_expands_variants_and_brackets_long_rounds(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "ablation"
    done = _run(
        coldbench_cmd,
        *("--mode", "ablation", "--features", "compile,clear_cache=false"),
        *("--variant", "base:prefill_step_size=32", "--contexts", "64,128", "--rounds", "1"),
        # micro: the subject is how variants expand and rounds are bracketed, not the model
        *("--model", "preset:micro", "--decode-tokens", "1", "--out", str(out)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ablation: all vs all-minus-<feature>" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"] == ["none", "all", "all-minus-compile", "all-minus-clear_cache"]
    assert {e["feature"] for e in summary["ablation"]["entries"]} == {"compile", "clear_cache"}
    records = read_records(out / "records.jsonl")
    flags = {r.variant: r.flags for r in records if r.round == 0}
    assert flags["all"] == {"prefill_step_size": 32, "compile": True, "clear_cache": False}
    assert flags["none"] == {"prefill_step_size": 32}
    assert all(r.status == "ok" for r in records if r.round == 0)
    # 8 cells in the round: the baseline opens and closes it in controls.jsonl.
    controls = read_records(out / "controls.jsonl")
    assert [c.variant for c in controls] == ["none", "none"]
    orders = sorted(r.order for r in records if r.round == 0)
    assert orders == list(range(1, 9)) and {c.order for c in controls} == {0, 9}
    assert verify_bundle(out).is_intact


def _runner_processes(workdir: Path) -> list[int]:
    """Live (not zombie) variant processes whose plans lie under `workdir`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, UnicodeDecodeError):
            continue
        if "coldbench.engine.runner" in cmdline and str(workdir) in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def _start_run(coldbench_cmd: list[str], tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *coldbench_cmd,
            "run",
            *args,
            *("--decode-tokens", "1", "--variant", "a", "--variant", "b:prefill_step_size=16"),
            *("--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition: Any, timeout_s: float = 240) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    assert condition()


def test_a_sigterm_during_the_warm_ups_stops_every_process_and_leaves_a_bundle(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """A run stopped while its processes warm up 8,192 tokens (minutes on this
    CPU) ends within seconds, leaves no variant process behind and writes a bundle saying it
    was stopped (nothing was measured yet)."""
    import signal
    import time

    run = _start_run(coldbench_cmd, tmp_path, "--contexts", "8192", "--rounds", "2")
    state = tmp_path / "state"
    try:
        _wait_for(lambda: len(_runner_processes(state)) == 2)
        time.sleep(4.0)  # imported and loaded: warming up
        started = time.monotonic()
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
        assert time.monotonic() - started < 30
    finally:
        run.kill()
    assert run.returncode == 130, stderr[-3000:]
    assert _runner_processes(state) == []
    out = tmp_path / "out"
    assert verify_bundle(out).is_intact
    timeline = json.loads((out / "timeline.json").read_text())
    assert timeline["stopped"] == "stopped on request after 0 of 4 cells"
    assert all(p["ended"] == "killed" for p in timeline["processes"])
    assert (out / "reason.txt").read_text().startswith("stopped after 0 of 4 cells")


def test_a_sigint_while_measuring_keeps_the_cells_measured(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    import signal

    run = _start_run(
        coldbench_cmd, tmp_path, "--contexts", "64", "--rounds", "12", "--rounds-per-process", "6"
    )
    state = tmp_path / "state"

    def timed_cells() -> int:
        return sum(
            json.loads(line)["round"] >= 0
            for path in state.glob("runs/*/records.jsonl")
            for line in path.read_text().splitlines()
        )

    try:
        _wait_for(lambda: timed_cells() >= 3)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, stderr[-3000:]
    assert "stopped" in stderr and _runner_processes(state) == []
    out = tmp_path / "out"
    assert verify_bundle(out, recompute=True).is_intact
    summary = json.loads((out / "summary.json").read_text())
    run_time = summary["timeline"]["runs"][0]
    # the warm canary (round -2) is neither a warm-up nor a timed cell
    kept = summary["runs"][0]["records"] - summary["warmups"] - len(summary["canary"]["runs"])
    assert kept >= 3 and run_time["cells"] == kept
    assert run_time["stopped"] == f"stopped on request after {kept} of 24 cells"
    assert "stopped on request" in (out / "summary.md").read_text()


def _tiny_ab(
    coldbench_cmd: list[str],
    tmp_path: Path,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """An A/B of the tiny preset at 128 tokens in blocks of 2 rounds, one decode token."""
    import os

    return subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--model", "preset:tiny", "--contexts", "128", *args),
            *("--rounds-per-process", "2", "--decode-tokens", "1"),
            *("--variant", "a", "--variant", "b:prefill_step_size=64"),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_variants_that_fit_once_but_not_twice_run_in_turns(
    coldbench_cmd: list[str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The device set so the tiny checkpoint fits one process but not two: the plan runs the
    A/B in turns, one resident at a time; every cell is valid, pairs by round and process pair,
    and the evidence says how it ran and what the turns cost."""

    from coldbench.engine.memory import DEVICE_MEMORY_ENV, PEER_OVERHEAD_BYTES, MemoryGuard

    guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=2048)
    need = guard.estimate(128).total_bytes
    device = need + PEER_OVERHEAD_BYTES // 2  # alone it fits; beside a peer (2 GiB more) not
    out = tmp_path / "turns"
    done = _tiny_ab(
        coldbench_cmd, tmp_path, out, "--rounds", "6", env={DEVICE_MEMORY_ENV: str(device)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(out / "records.jsonl")
    timed = [r for r in records if r.round >= 0]
    assert len(timed) == 12 and all(r.status == "ok" for r in timed), [r.reason for r in timed]
    # one process per variant per block of 2 rounds, each alone on the device
    assert {(r.variant, r.round // 2 + 1) for r in timed} == {(r.variant, r.process) for r in timed}
    timeline = json.loads((out / "timeline.json").read_text())
    assert timeline["residency"] == "in-turns"
    assert (
        "in turns" in timeline["residency_reason"] and "128 tokens" in timeline["residency_reason"]
    )
    spans = sorted(
        (p["load_s"], p["exited_s"]) for p in timeline["processes"] if p["load_s"] is not None
    )
    for (_, exited), (loaded, _) in zip(spans, spans[1:], strict=False):
        assert loaded >= exited, "two variant processes were resident together"
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["comparisons"]
    # A turn's first cell follows its load; on this CPU it is at times slower than the turn's
    # second, and where the first-cell check establishes that, those rounds leave the statistics.
    (first_cells,) = summary["first_cells"]["runs"]
    left_out_rounds = first_cells["left_out"] // 2
    assert left_out_rounds == (3 if first_cells["established"] else 0)
    assert row["n"] == 6 - left_out_rounds and row["unit"] == "process pair"
    assert row["blocks"] == 3
    (run,) = summary["timeline"]["runs"]
    assert run["residency"] == "in-turns" and run["blocks"] == 3
    assert run["turns_within_blocks"] == 3 and run["turn_starts"]["load_s"] > 0
    text = (out / "summary.md").read_text()
    assert "Variants ran in turns: one resident at a time, 3 blocks of 2 rounds" in text
    assert "The 3 turn starts within blocks added" in text
    provenance = json.loads((out / "provenance.json").read_text())
    assert "--residency" not in provenance["command"]  # auto: the plan decides again
    assert verify_bundle(out).is_intact


def test_a_job_that_asks_for_turns_runs_in_turns_and_says_so(
    coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """`--residency in-turns` is a job option: the job file holds it, the worker runs one
    variant resident at a time though both would fit, the evidence says it was asked, and the
    reproduce command asks it again."""
    out = tmp_path / "asked"
    done = _tiny_ab(coldbench_cmd, tmp_path, out, "--rounds", "4", "--residency", "in-turns")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "job.json").read_text())["residency"] == "in-turns"
    timeline = json.loads((out / "timeline.json").read_text())
    assert timeline["residency"] == "in-turns"
    assert timeline["residency_reason"].startswith("in-turns as asked")
    spans = sorted(
        (p["load_s"], p["exited_s"]) for p in timeline["processes"] if p["load_s"] is not None
    )
    for (_, exited), (loaded, _) in zip(spans, spans[1:], strict=False):
        assert loaded >= exited, "two variant processes were resident together"
    assert (
        "Variants ran in turns: one resident at a time, 2 blocks of 2 rounds"
        in (out / "summary.md").read_text()
    )
    provenance = json.loads((out / "provenance.json").read_text())
    assert "--residency in-turns" in provenance["command"]
    assert verify_bundle(out, recompute=True).is_intact
