"""Does a same-shape warm-up make a variant process's first timed cell faster on this host?

Not a test. Starts `--processes` variant processes per (flags, warm-up) setting, one after
another and in alternating order, each in batch mode (`python -m coldbench.engine.runner`, the
process coldbench runs) with four timed cells at 128, 256, 128 and 256 tokens. One arm warms every
context of the matrix as coldbench does (`warmup_contexts` 128 and 256), the other only an
8-token prompt (imports, first allocation, nothing of the measured shapes). For each process it
takes the first timed cell at a context over the second at the same context (prefill time):
a ratio above 1 is what a missing warm-up costs the first cell. It prints the median ratio
and each process's ratio per setting and context, and the warm-ups' median seconds.

    PYTHONPATH=. python benchmarks/warmup_probe.py --model <checkpoint> --processes 8
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from coldbench.engine.plan import CellRequest, Plan

FLAGS = {
    "stock": {"prefill_step_size": 32},
    "all": {"prefill_step_size": 64, "clear_cache": False, "compile": True},
}
WARMUPS = {"every context": [128, 256], "8 tokens": [8]}
CELLS = [128, 256, 128, 256]


def run_process(
    model: str, flags: dict[str, object], warmup: list[int], seed: int, work: Path
) -> list[dict[str, Any]]:
    records = work / f"records-{seed}-{len(warmup)}-{len(flags)}.jsonl"
    plan = Plan(
        run_id="warmup-probe",
        variant="probe",
        adapter="embedded",
        model=model,
        flags=flags,
        decode_tokens=4,
        seed=seed,
        records_path=str(records),
        cells=[CellRequest(r, 0, c) for r, c in enumerate(CELLS)],
        warmup_contexts=warmup,
    )
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan.to_json()))
    subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return [json.loads(line) for line in records.read_text().splitlines()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a checkpoint folder or preset:NAME")
    parser.add_argument("--processes", type=int, default=8, help="per flags and warm-up")
    args = parser.parse_args(argv)
    ratios: dict[tuple[str, str, int], list[float]] = {}
    warmup_s: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for rep in range(args.processes):
            arms = list(WARMUPS.items()) if rep % 2 == 0 else list(WARMUPS.items())[::-1]
            for flags_name, flags in FLAGS.items():
                for warm_name, warmup in arms:
                    records = run_process(args.model, flags, warmup, rep, work)
                    timed = {r["round"]: r for r in records if r["status"] == "ok"}
                    warm = [r for r in records if r["status"] == "warmup"]
                    warmup_s.setdefault((flags_name, warm_name), []).append(
                        sum(r["prefill_s"] + (r["decode_s"] or 0) for r in warm)
                    )
                    for context, (first, later) in ((128, (0, 2)), (256, (1, 3))):
                        if first in timed and later in timed:
                            ratio = timed[first]["prefill_s"] / timed[later]["prefill_s"]
                            key = (flags_name, warm_name, context)
                            ratios.setdefault(key, []).append(ratio)
    print("| flags | warm-up | context | processes | first / second cell, median | each |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for (flags_name, warm_name, context), values in ratios.items():
        median = math.exp(statistics.median(math.log(v) for v in values))
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {flags_name} | {warm_name} | {context} | {len(values)} | {median:.3f} | {each} |")
    for (flags_name, warm_name), seconds in warmup_s.items():
        print(f"warm-ups of {flags_name}, {warm_name}: {statistics.median(seconds):.2f} s median")


if __name__ == "__main__":
    main()
