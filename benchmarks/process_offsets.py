"""Where does a variant process's own speed offset come from? (not a test)

An A/A job (identical variants) on the H200 called one variant slower: every cell of a
variant ran in one long-lived process, and processes differ by 1-2% in speed. This script
measures that offset directly and tries the suspected causes one at a time.

For each condition it runs several *generations*; a generation starts K identical worker
processes (same model, same seed, same flags), warms each up, then runs R rounds in which every
process times one cold prefill of the same prompt (paired), in an order rotated every round.
After a generation all K processes stop and fresh ones start. From the per-cell times:

- the within-process spread (cell to cell, same process) and the between-process spread (the
  process's own offset), as a one-way random-effects decomposition of log prefill time;
- whether an offset follows the start order (slot), the CPU the process ran on, or nothing;
- the trend over the first rounds after load.

Conditions (each a list entry of --conditions):
- `free`: processes as the OS places them (what `coldbench run` does);
- `pinned`: every process pinned to the same CPU set (placement equalised);
- `clear`: MLX's buffer cache emptied (and the GC run) before every cell;
- `spread`: each process pinned to its own, distinct core.

    python -m benchmarks.process_offsets --preset llama-8b-shape --dtype bfloat16 \
        --context 16384 --processes 4 --generations 3 --rounds 6 --json out.json
    python -m benchmarks.process_offsets --preset tiny --dtype float32 --context 256 \
        --processes 3 --generations 2 --rounds 4          # a CPU smoke run

The model is built in memory (random weights from the seed, the preset's real architecture),
so a process starts in seconds; each process builds the identical model. `--model DIR` loads a
checkpoint from disk instead, as `coldbench run`'s variant processes do.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# -- the worker process --------------------------------------------------------------------


def current_cpu() -> int | None:
    """The CPU this thread last ran on (field 39 of /proc/self/stat), Linux only."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def worker(args: argparse.Namespace) -> int:
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import gc

    import mlx.core as mx

    from benchmarks.engine_prefill import Prompts, build_in_memory
    from coldbench.engine.cell import run_cell
    from coldbench.engine.flags import Flags

    if args.model:  # a checkpoint on disk, loaded as the variant process loads it
        from coldbench.engine.checkpoints import load_model

        model, tokenizer, config = load_model(args.model)
    else:
        from coldbench.engine.checkpoints import train_tokenizer
        from coldbench.engine.presets import get_preset

        model, config = build_in_memory(args.preset, args.dtype, args.seed)
        # the preset's own tokenizer, as `coldbench model create` writes it
        tokenizer = train_tokenizer(get_preset(args.preset).tokenizer_vocab)
    # The windows coldbench's cells measure (engine/prompts.py), fresh per (seed, round).
    prompts = Prompts(tokenizer, config, args.seed)
    flags = Flags()

    def one(round_index: int) -> dict[str, Any]:
        if args.clear:
            gc.collect()
            mx.clear_cache()
        ids = prompts.ids(round_index, args.context)
        record = run_cell(model, ids, context_tokens=len(ids), flags=flags, decode_tokens=1)
        return {
            "prefill_s": record.prefill_s,
            "status": record.status,
            "cpu": current_cpu(),
        }

    for _ in range(2):  # discarded warm-ups on the warm-up window, which no round measures
        one(-1)
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") == "exit":
            break
        print(json.dumps({"event": "cell", **one(int(message["round"]))}), flush=True)
    return 0


# -- the orchestrator ------------------------------------------------------------------------


def gpu_state() -> dict[str, Any]:
    query = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        sm, mem, temp, power = (x.strip() for x in out.splitlines()[0].split(","))
        return {
            "sm_mhz": float(sm),
            "mem_mhz": float(mem),
            "temp_c": float(temp),
            "w": float(power),
        }
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}


def cpu_sets(condition: str, k: int) -> list[str | None]:
    cores = sorted(os.sched_getaffinity(0))
    if condition == "pinned":
        shared = ",".join(str(c) for c in cores[: max(2, len(cores) // 4)])
        return [shared] * k
    if condition == "spread":
        return [str(cores[(i * 2) % len(cores)]) for i in range(k)]
    return [None] * k


def run_generation(args: argparse.Namespace, condition: str, generation: int) -> dict[str, Any]:
    k = args.processes
    # The start order rotates per generation, so slot 0 is not always the same process.
    slots = [(generation + i) % k for i in range(k)]
    cpus = cpu_sets(condition, k)
    procs: dict[int, subprocess.Popen[str]] = {}
    started = time.perf_counter()
    for slot in slots:
        cmd = [sys.executable, "-m", "benchmarks.process_offsets", "--worker"]
        cmd += ["--preset", args.preset, "--dtype", args.dtype]
        cmd += ["--context", str(args.context), "--seed", str(args.seed)]
        if args.model:
            cmd += ["--model", args.model]
        if cpus[slot]:
            cmd += ["--cpus", cpus[slot]]
        if condition == "clear":
            cmd += ["--clear"]
        procs[slot] = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        if args.sequential_start:
            assert procs[slot].stdout is not None
            json.loads(procs[slot].stdout.readline())
    for slot in slots:
        if not args.sequential_start:
            assert procs[slot].stdout is not None
            json.loads(procs[slot].stdout.readline())
    ready_s = time.perf_counter() - started
    cells: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        gpu.append(gpu_state())
        order = list(range(k))
        order = order[round_index % k :] + order[: round_index % k]
        if round_index % 2:
            order.reverse()
        for position, process in enumerate(order):
            p = procs[process]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(json.dumps({"round": round_index}) + "\n")
            p.stdin.flush()
            event = json.loads(p.stdout.readline())
            cells.append(
                {
                    "process": process,
                    "start_slot": slots.index(process),
                    "round": round_index,
                    "position": position,
                    **{key: event[key] for key in ("prefill_s", "status", "cpu")},
                }
            )
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.write(json.dumps({"op": "exit"}) + "\n")
        p.stdin.flush()
        p.wait(timeout=60)
    return {
        "condition": condition,
        "generation": generation,
        "ready_s": ready_s,
        "cpus": cpus,
        "cells": cells,
        "gpu": gpu,
    }


def decompose(generations: list[dict[str, Any]], skip_rounds: int) -> dict[str, Any]:
    """One-way random effects on log prefill time, process as the group, per condition.

    Each generation's log times are centred on that generation's round means, so what is left
    is process offset + cell noise (the prompt of a round is shared by every process)."""
    groups: list[list[float]] = []
    offsets: list[dict[str, Any]] = []
    for gen in generations:
        cells = [c for c in gen["cells"] if c["status"] == "ok" and c["round"] >= skip_rounds]
        by_round: dict[int, list[float]] = {}
        for c in cells:
            by_round.setdefault(c["round"], []).append(math.log(c["prefill_s"]))
        round_mean = {r: statistics.fmean(v) for r, v in by_round.items()}
        per_process: dict[int, list[float]] = {}
        for c in cells:
            per_process.setdefault(c["process"], []).append(
                math.log(c["prefill_s"]) - round_mean[c["round"]]
            )
        for process, values in sorted(per_process.items()):
            groups.append(values)
            slot = next(c["start_slot"] for c in cells if c["process"] == process)
            cpus = sorted(
                {c["cpu"] for c in cells if c["process"] == process and c["cpu"] is not None}
            )
            offsets.append(
                {
                    "generation": gen["generation"],
                    "process": process,
                    "start_slot": slot,
                    "offset_pct": 100 * (math.exp(statistics.fmean(values)) - 1),
                    "cpus": cpus,
                }
            )
    n = min(len(g) for g in groups)
    k = len(groups)
    grand = statistics.fmean(x for g in groups for x in g)
    ms_between = n * sum((statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    ms_within = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g) / (
        sum(len(g) for g in groups) - k
    )
    var_process = max(0.0, (ms_between - ms_within) / n)
    f_stat = ms_between / ms_within if ms_within > 0 else math.inf
    try:
        from scipy import stats as scipy_stats

        p_value = float(scipy_stats.f.sf(f_stat, k - 1, sum(len(g) for g in groups) - k))
    except ImportError:
        p_value = None
    by_slot: dict[int, list[float]] = {}
    for o in offsets:
        by_slot.setdefault(o["start_slot"], []).append(o["offset_pct"])
    return {
        "processes": k,
        "cells_per_process": n,
        "within_sd_pct": 100 * math.sqrt(ms_within),
        "process_sd_pct": 100 * math.sqrt(var_process),
        "f_statistic": f_stat,
        "p_value": p_value,
        "offset_by_start_slot_pct": {s: statistics.fmean(v) for s, v in sorted(by_slot.items())},
        "offsets": offsets,
    }


def first_rounds(generations: list[dict[str, Any]]) -> list[float]:
    """Median tok/s-relative speed per round index (1.0 = the generation's median cell)."""
    out = []
    rounds = max(c["round"] for g in generations for c in g["cells"]) + 1
    for r in range(rounds):
        ratios = []
        for g in generations:
            times = [c["prefill_s"] for c in g["cells"] if c["status"] == "ok"]
            med = statistics.median(times)
            ratios += [
                med / c["prefill_s"] for c in g["cells"] if c["round"] == r and c["status"] == "ok"
            ]
        out.append(statistics.median(ratios) if ratios else math.nan)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--clear", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model", help="a checkpoint folder to load instead of --preset in memory")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--skip-rounds", type=int, default=0, help="rounds left out of the split")
    parser.add_argument("--conditions", default="free,pinned,clear")
    parser.add_argument("--sequential-start", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "cpus_available": len(os.sched_getaffinity(0)),
        "conditions": {},
    }
    for condition in args.conditions.split(","):
        generations = []
        for generation in range(args.generations):
            gen = run_generation(args, condition, generation)
            generations.append(gen)
            print(f"{condition} gen {generation}: ready in {gen['ready_s']:.1f} s", flush=True)
        summary = decompose(generations, args.skip_rounds)
        summary["round_speed"] = first_rounds(generations)
        results["conditions"][condition] = {"summary": summary, "generations": generations}
        print(
            f"{condition:7s} process SD {summary['process_sd_pct']:.2f}%  within SD "
            f"{summary['within_sd_pct']:.2f}%  F={summary['f_statistic']:.1f} "
            f"p={summary['p_value']:.3g}  by start slot "
            + " ".join(f"{s}:{v:+.2f}%" for s, v in summary["offset_by_start_slot_pct"].items()),
            flush=True,
        )
        print(
            "         offsets "
            + " ".join(
                f"g{o['generation']}p{o['process']}:{o['offset_pct']:+.2f}%{o['cpus']}"
                for o in summary["offsets"]
            ),
            flush=True,
        )
        print(
            "         speed by round " + " ".join(f"{x:.3f}" for x in summary["round_speed"]),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
