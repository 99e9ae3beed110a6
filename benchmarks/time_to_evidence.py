"""Time to evidence: how long a matrix takes to become evidence, and where the time goes.

Not a test. Runs `coldbench run` (or, with `--demo`, `coldbench demo`) as a user would, in a
fresh process each time, and prints one JSON line per run:

- `time_to_evidence_s`: from the command's start to its exit with the bundle written;
- `time_to_first_cell_s`: from the command's start to the first timed cell (the timeline's
  `first_cell_s` plus the time before the schedule started: model, builds, imports of the CLI);
- `measuring_wall_s`, `timed_cells_s`, `duty_cycle` (timed cells over the measuring wall) and
  `phases` (seconds waited at the first block's start and at all later ones: stop, imports,
  load, warm-ups), `blocks`, `rounds_per_process` and `block_rule`, from the bundle's
  summary.json (evidence/contract/timeline.py);
- `verdicts`, `cells`, `exit_code`, `label`, `python` and the load average when the run began.

`--compare prespawn` alternates `--prespawn` and `--no-prespawn` run by run (A B A B...),
`--compare residency` alternates `--residency side-by-side` and `--residency in-turns` (the
duty cycle of a run in turns beside one side by side, `turn_starts` what the turns added), and
`--checkout DIR` (repeatable) alternates between coldbench checkouts, each run with that
checkout's `.venv/bin/python` (or `--python`), so figures measured side by side share the
machine's load. `--demo` times `coldbench demo` (its "demo finished in N s" line and its own
breakdown) instead of a run. `--compare kernel-cache` alternates the host's MLX CUDA kernel cache
(the folder of the kernels compiled at run time, coldbench.engine.jit_cache) with an empty one
made for the run, so that a machine's first run, which compiles every kernel, can be told from
the runs after it; each line's `kernel_cache` gives the folder and its entries before and after
the run.

    PYTHONPATH=. python benchmarks/time_to_evidence.py --model preset:tiny --contexts 128,256 \\
        --rounds 8 --variant a --variant b --repeat 2 --compare prespawn
    PYTHONPATH=. python benchmarks/time_to_evidence.py --model <checkpoint> --contexts 16384 \\
        --rounds 24 --variant a --variant b --variant c --calibration <calibration.json>
    PYTHONPATH=. python benchmarks/time_to_evidence.py --model <checkpoint> --contexts 16384 \\
        --rounds 12 --rounds-per-process 3 --variant a --variant b --compare residency --repeat 2
    PYTHONPATH=. python benchmarks/time_to_evidence.py --demo --checkout <main checkout> \\
        --checkout . --repeat 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coldbench.engine import jit_cache

_DEMO_DONE = re.compile(r"demo finished in (\d+(?:\.\d+)?) s")
_DEMO_BREAKDOWN = re.compile(r"where the time went: (.*)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="preset:tiny")
    parser.add_argument("--contexts", default="128,256")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], help="as coldbench run's")
    parser.add_argument("--rounds-per-process", type=int, default=None)
    parser.add_argument("--calibration", type=Path, default=None, help="a calibration result")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per setting")
    parser.add_argument(
        "--compare",
        choices=["prespawn", "residency", "kernel-cache"],
        default=None,
        help="alternate a setting run by run",
    )
    parser.add_argument("--prespawn", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--residency", choices=["auto", "side-by-side", "in-turns"], default=None)
    parser.add_argument(
        "--checkout", action="append", type=Path, default=[], help="a coldbench checkout to run"
    )
    parser.add_argument("--python", default=None, help="interpreter (default: the checkout's)")
    parser.add_argument("--demo", action="store_true", help="time coldbench demo instead")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch (default: a temp)")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=None, help="also append the lines here")
    args = parser.parse_args(argv)
    if not args.demo and len(args.variant) < 2:
        parser.error("give at least two --variant (or --demo)")
    return args


def interpreter(checkout: Path | None, python: str | None) -> str:
    if python:
        return python
    if checkout is not None:
        candidate = checkout / ".venv" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    return sys.executable


def run_command(
    args: argparse.Namespace,
    out: Path,
    state: Path,
    prespawn: bool | None,
    residency: str | None = None,
) -> list[str]:
    command = [
        "run",
        *("--model", args.model, "--contexts", args.contexts, "--rounds", str(args.rounds)),
        # what a run of exactly these rounds costs, not where one measuring until decided stops
        *("--until", "rounds"),
        *("--decode-tokens", str(args.decode_tokens), "--seed", str(args.seed)),
        *(arg for variant in args.variant for arg in ("--variant", variant)),
        *("--out", str(out), "--state-dir", str(state)),
    ]
    if args.rounds_per_process is not None:
        command += ["--rounds-per-process", str(args.rounds_per_process)]
    if args.calibration is not None:
        command += ["--calibration", str(args.calibration.resolve())]
    if prespawn is not None:
        command.append("--prespawn" if prespawn else "--no-prespawn")
    if residency is not None:
        command += ["--residency", residency]
    return command


def timeline_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's figures from its summary.json (evidence/contract/timeline.py)."""
    runs = (summary.get("timeline") or {}).get("runs") or []
    if not runs:
        return {}
    run = runs[0]
    figures = {
        key: run.get(key)
        for key in (
            "measuring_wall_s",
            "timed_cells_s",
            "duty_cycle",
            "cells",
            "blocks",
            "rounds_per_process",
            "block_rule",
            "prespawn",
            "process_starts",
            "stopped",
            "residency",
            "turns_within_blocks",
        )
    }
    figures["phases"] = {
        "first_block": run.get("first_block"),
        "later_blocks": run.get("later_blocks"),
        "turn_starts": run.get("turn_starts"),
    }
    return figures


def one_run(
    args: argparse.Namespace,
    *,
    python: str,
    cwd: Path,
    label: str,
    prespawn: bool | None,
    index: int,
    residency: str | None = None,
    empty_kernel_cache: bool = False,
) -> dict[str, Any]:
    scratch = Path(args.workdir or tempfile.gettempdir()) / f"tte-{os.getpid()}-{index}"
    out, state = scratch / "bundle", scratch / "state"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if empty_kernel_cache:
        env[jit_cache.KERNEL_CACHE_ENV] = str(scratch / "kernel-cache")
    kernels = jit_cache.kernel_cache_dir(env)
    if args.demo:
        command = [python, "-m", "coldbench", "demo", "--dir", str(scratch / "demo")]
    else:
        command = [
            python,
            "-m",
            "coldbench",
            *run_command(args, out, state, prespawn, residency),
        ]
    line: dict[str, Any] = {
        "label": label,
        "python": python,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "kernel_cache": {"dir": str(kernels), "entries_before": jit_cache.kernel_modules(kernels)},
    }
    launched_wall = datetime.now(UTC)
    launched = time.monotonic()
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout_s,
        check=False,
    )
    line["time_to_evidence_s"] = round(time.monotonic() - launched, 2)
    line["exit_code"] = done.returncode
    line["kernel_cache"]["entries_after"] = jit_cache.kernel_modules(kernels)
    line["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.demo:
        finished = _DEMO_DONE.search(done.stderr + done.stdout)
        breakdown = _DEMO_BREAKDOWN.search(done.stderr + done.stdout)
        line["demo_finished_s"] = float(finished.group(1)) if finished else None
        line["demo_breakdown"] = breakdown.group(1).strip() if breakdown else None
    elif (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        line.update(timeline_figures(summary))
        timeline = json.loads((out / "timeline.json").read_text())
        started = datetime.fromisoformat(timeline["started_at"])
        before = (started - launched_wall).total_seconds()
        first = timeline.get("first_cell_s")
        line["time_to_first_cell_s"] = None if first is None else round(before + first, 2)
        line["verdicts"] = [
            f"{c['variant']}@{c['context_tokens']}: {c['verdict']}" for c in summary["comparisons"]
        ]
    if done.returncode != 0:
        line["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkouts: list[Path | None] = list(args.checkout) or [None]
    # (prespawn, residency, an empty kernel cache)
    settings: list[tuple[bool | None, str | None, bool]] = [(args.prespawn, args.residency, False)]
    if args.compare == "prespawn":
        settings = [(True, args.residency, False), (False, args.residency, False)]
    elif args.compare == "residency":
        settings = [(args.prespawn, "side-by-side", False), (args.prespawn, "in-turns", False)]
    elif args.compare == "kernel-cache":
        settings = [(args.prespawn, args.residency, True), (args.prespawn, args.residency, False)]
    plan = list(itertools.product(range(args.repeat), checkouts, settings))
    failed = 0
    for index, (_, checkout, (prespawn, residency, empty_kernel_cache)) in enumerate(plan):
        cwd = (checkout or Path.cwd()).resolve()
        label = (
            " ".join(
                part
                for part in (
                    str(checkout) if len(checkouts) > 1 else "",
                    {True: "prespawn", False: "no-prespawn", None: ""}[prespawn],
                    residency or "",
                    "kernel cache empty" if empty_kernel_cache else "",
                )
                if part
            )
            or "run"
        )
        line = one_run(
            args,
            python=interpreter(checkout, args.python),
            cwd=cwd,
            label=label,
            prespawn=prespawn,
            index=index,
            residency=residency,
            empty_kernel_cache=empty_kernel_cache,
        )
        failed += line["exit_code"] != 0
        text = json.dumps(line, sort_keys=True)
        print(text, flush=True)
        if args.out is not None:
            with args.out.open("a", encoding="utf-8") as handle:
                handle.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
