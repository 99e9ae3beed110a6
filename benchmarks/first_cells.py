"""Is each process block's first timed cell slower than the block's other cells? (not a test)

Reads one or more bundles (folders or zips holding records.jsonl, and timeline.json where the
run wrote one) and prints, per run and block, the block's first timed cell: its variant,
round and context, its prefill time over the median of the block's other cells of the same
variant and context (coldbench.evidence.analysis.first_cells, the check summary.json runs), its
SM clock, power and temperature where the records carry NVML telemetry, and, from the timeline,
how many variant processes were starting (spawned, not yet imported) while it ran: the
next block's interpreters started ahead imported beside the first timed cell before
worker/variants.py let them import only while a block loads and warms up. Then each run's
rank test (p, established or not) as the summary states it.

    python benchmarks/first_cells.py BUNDLE [BUNDLE ...]        # folders or .zip files
    python benchmarks/first_cells.py --precision 0.02 --json out.json BUNDLE
    python benchmarks/first_cells.py --simulate 1000             # the check's rates, no bundle

`--simulate N` runs the check on N simulated A/A runs per scenario (`simulated_run`: two
variants side by side in process blocks, log-normal cell noise, process offsets, the first
cell of chosen blocks planted slow) and prints how often the rank test rejects at 0.05 and how
often the check is established (docs/EVIDENCE.md quotes it).

On the H200 bundles of 2026-12-03 (benchmarks/results/2026-12-03-h200-time-to-evidence-*.tgz,
unpacked), every block but the last opens with a cell 1.66-1.84x slow (16K, 8B) while three
interpreters imported beside it; the last blocks and the one-block calibration runs read
0.98-1.04x.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import sys
import zipfile
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from coldbench.evidence.analysis.first_cells import block_row, process_blocks, run_check
from coldbench.evidence.analysis.stats import DEFAULT_PRECISION
from coldbench.evidence.contract.records import parse_records
from coldbench.evidence.contract.schemas import Record
from coldbench.evidence.contract.timeline import Timeline, is_timeline_file

TELEMETRY = ("gpu.sm_clock_mhz", "gpu.power_w", "gpu.temperature_c", "gpu.clocks_event_reasons")


def bundle_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every records.jsonl and timeline file of a bundle folder or zip."""

    def wanted(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return base == "records.jsonl" or is_timeline_file(base)

    if path.is_dir():
        for file in sorted(path.rglob("*")):
            if file.is_file() and wanted(file.name):
                yield str(file), file.read_bytes()
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for name in sorted(archive.namelist()):
                if wanted(name):
                    yield f"{path}:{name}", archive.read(name)
    else:
        raise SystemExit(f"{path}: neither a bundle folder nor a zip file")


def read_bundle(path: Path) -> tuple[list[Record], dict[str, Timeline]]:
    records: list[Record] = []
    timelines: dict[str, Timeline] = {}
    for name, data in bundle_files(path):
        if name.endswith("records.jsonl"):
            found, problems = parse_records(data, source=name)
            for problem in problems[:3]:
                print(f"  skipped: {problem}", file=sys.stderr)
            records += found
        else:
            timeline = Timeline.model_validate_json(io.BytesIO(data).read())
            timelines[timeline.run_id] = timeline
    if not records:
        raise SystemExit(f"{path}: no records.jsonl with records")
    return records, timelines


def _offset(moment: datetime, timeline: Timeline) -> float:
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return (moment - timeline.started_at).total_seconds()


def importing_beside(record: Record, timeline: Timeline | None) -> int | None:
    """Processes of the run spawned but not yet imported while `record` ran (None: no
    timeline for its run)."""
    if timeline is None:
        return None
    start, end = _offset(record.started_at, timeline), _offset(record.ended_at, timeline)
    return sum(
        1
        for p in timeline.processes
        if p.spawned_s < end and (p.imported_s is None or p.imported_s > start)
    )


def rows_of(
    records: Sequence[Record], timelines: dict[str, Timeline], precision: float
) -> list[dict[str, Any]]:
    runs = []
    # A job's bundle names each run's timeline by its run id; a run's own bundle has one.
    only = next(iter(timelines.values())) if len(timelines) == 1 else None
    for run_id, blocks in process_blocks(records).items():
        timeline = timelines.get(run_id) or only
        lines = []
        for block in blocks:
            head = block.cells[0]
            row = block_row(block)
            lines.append(
                {
                    "block": block.index,
                    "variant": head.variant,
                    "round": head.round,
                    "context_tokens": head.context_tokens,
                    "prefill_s": head.prefill_s,
                    "slowdown": None if row is None else round(row.slowdown, 4),
                    "others": 0 if row is None else row.others,
                    "importing_beside": importing_beside(head, timeline),
                    **{key: head.counters.get(key) for key in TELEMETRY if key in head.counters},
                }
            )
        checked = run_check(run_id, blocks, threshold=precision)
        runs.append(
            {
                "run_id": run_id,
                "prespawn": timeline.prespawn if timeline else None,
                "blocks": lines,
                "check": None if checked is None else checked[0].model_dump(exclude={"cells"}),
            }
        )
    return runs


def print_run(run: dict[str, Any]) -> None:
    print(f"run {run['run_id']} (prespawn {run['prespawn']})")
    print("  block  first cell               prefill s  over rest  others  importing  SM MHz")
    for line in run["blocks"]:
        slowdown = "-" if line["slowdown"] is None else f"{line['slowdown']:.3f}x"
        importing = "-" if line["importing_beside"] is None else str(line["importing_beside"])
        clock = line.get("gpu.sm_clock_mhz")
        where = f"{line['variant']} r{line['round']} @ {line['context_tokens']}"
        print(
            f"  {line['block']:>5}  {where:<23} {line['prefill_s'] or 0:>9.4f}  {slowdown:>9}  "
            f"{line['others']:>6}  {importing:>9}  {'-' if clock is None else clock}"
        )
    check = run["check"]
    if check is None:
        print("  no block has another cell of its first cell's variant and context to compare")
        return
    print(
        f"  rank test p {check['p_value']:.3g}, geometric mean {check['slowdown_geomean']:.3f}x, "
        f"{check['slow_blocks']} of {check['blocks']} blocks slow: "
        f"{'established' if check['established'] else 'not established'} ({check['treatment']})"
    )


SIMULATION_START = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)


def simulated_run(
    *,
    rounds: int = 24,
    per_block: int = 4,
    contexts: Sequence[int] = (64, 256),
    slow_first: float = 1.0,
    slow_blocks: Collection[int] | None = None,
    noise: float = 0.01,
    process_sd: float = 0.01,
    seed: int = 0,
    run_id: str = "r-1",
) -> list[Record]:
    """An A/A run's records side by side in process blocks (every variant a fresh process per
    block, the first cell of a round rotating over variants and contexts): each cell's tok/s
    1000 x its process's offset x exp(N(0, noise)); the first timed cell of each block in
    `slow_blocks` (default: every block) `slow_first` times slower."""
    rng = np.random.default_rng(seed)
    variants = ["base", "other"]
    records: list[Record] = []
    moment = SIMULATION_START
    order = 0
    for block in range(-(-rounds // per_block)):
        offsets = {v: float(np.exp(rng.normal(0, process_sd))) for v in variants}
        for round_index in range(block * per_block, min((block + 1) * per_block, rounds)):
            cells = [(c, v) for c in contexts for v in variants]
            shift = round_index % len(cells)
            for position, (context, variant) in enumerate(cells[shift:] + cells[:shift]):
                tps = 1000.0 * offsets[variant] * float(np.exp(rng.normal(0, noise)))
                first = round_index == block * per_block and position == 0
                if first and (slow_blocks is None or block in slow_blocks):
                    tps /= slow_first
                prompt = hashlib.sha256(f"{seed}:{round_index}:{context}".encode()).hexdigest()
                records.append(
                    Record.model_validate(
                        {
                            "schema": "coldbench.record/1",
                            "run_id": run_id,
                            "variant": variant,
                            "round": round_index,
                            "order": order,
                            "context_tokens": context,
                            "prompt_tokens": context,
                            "prompt_sha256": prompt,
                            "cached_tokens": 0,
                            "prefill_s": context / tps,
                            "prefill_tps": tps,
                            "decode_tokens": 4,
                            "decode_s": 0.1,
                            "decode_tps": 40.0,
                            "output_sha256": hashlib.sha256(b"out").hexdigest(),
                            "output_head": [1, 2, 3, 4],
                            "peak_memory_bytes": 1_000_000,
                            "counters": {},
                            "started_at": moment,
                            "ended_at": moment + timedelta(seconds=2),
                            "status": "ok",
                            "reason": None,
                            "process": block + 1,
                        }
                    )
                )
                moment += timedelta(seconds=2)
                order += 1
        moment += timedelta(seconds=30)  # the next block's load and warm-ups
    return records


SCENARIOS: dict[str, dict[str, Any]] = {
    "A/A, 1% noise, 4 blocks of 6 rounds": {"rounds": 24, "per_block": 6},
    "A/A, 2% noise and process SD, 8 blocks of 4": {
        "rounds": 32,
        "noise": 0.02,
        "process_sd": 0.02,
    },
    "first cell 1.4x, every block of 4 of 6 rounds": {
        "rounds": 24,
        "per_block": 6,
        "slow_first": 1.4,
    },
    "first cell 1.4x, blocks 0-2 of 4 of 6 rounds": {
        "rounds": 24,
        "per_block": 6,
        "slow_first": 1.4,
        "slow_blocks": {0, 1, 2},
    },
    "first cell 1.4x, 6 of 8 blocks of 4 rounds": {
        "rounds": 32,
        "slow_first": 1.4,
        "slow_blocks": set(range(6)),
    },
}


def simulate(runs: int, precision: float) -> list[dict[str, Any]]:
    rows = []
    for name, settings in SCENARIOS.items():
        rejected = established = 0
        for seed in range(runs):
            records = simulated_run(seed=seed, **settings)
            checked = run_check("r-1", process_blocks(records)["r-1"], threshold=precision)
            assert checked is not None
            run, _ = checked
            rejected += run.p_value is not None and run.p_value <= 0.05
            established += run.established
        rows.append(
            {
                "scenario": name,
                "runs": runs,
                "rank_test_rejects": rejected / runs,
                "established": established / runs,
            }
        )
        print(
            f"{name}: rank test p <= 0.05 in {rejected / runs:.3f}, established in "
            f"{established / runs:.3f} of {runs} runs"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundles", nargs="*", type=Path, help="bundle folders or zip files")
    parser.add_argument(
        "--simulate", type=int, metavar="N", help="the check's rates over N simulated runs"
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=DEFAULT_PRECISION,
        help="the slowdown the check must exceed to be established (the job's precision)",
    )
    parser.add_argument("--json", type=Path, help="write every row here too")
    args = parser.parse_args(argv)
    if args.simulate:
        rows = simulate(args.simulate, args.precision)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    if not args.bundles:
        parser.error("name at least one bundle, or --simulate N")
    everything = []
    slowdowns = []
    for path in args.bundles:
        records, timelines = read_bundle(path)
        print(f"== {path}")
        for run in rows_of(records, timelines, args.precision):
            print_run(run)
            everything.append({"bundle": str(path), **run})
            slowdowns += [b["slowdown"] for b in run["blocks"] if b["slowdown"] is not None]
    if slowdowns:
        print(
            f"\n{len(slowdowns)} blocks: first cell over the rest, median "
            f"{statistics.median(slowdowns):.3f}x, max {max(slowdowns):.3f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
