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

On the H200 bundles of 2026-12-03 (benchmarks/results/2026-12-03-h200-time-to-evidence-*.tgz,
unpacked), every block but the last opens with a cell 1.66-1.84x slow (16K, 8B) while three
interpreters imported beside it; the last blocks and the one-block calibration runs read
0.98-1.04x.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import zipfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundles", nargs="+", type=Path, help="bundle folders or zip files")
    parser.add_argument(
        "--precision",
        type=float,
        default=DEFAULT_PRECISION,
        help="the slowdown the check must exceed to be established (the job's precision)",
    )
    parser.add_argument("--json", type=Path, help="write every row here too")
    args = parser.parse_args(argv)
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
