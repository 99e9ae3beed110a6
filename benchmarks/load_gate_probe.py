"""Does a variant process waiting at its load gate touch the device? (not a test)

Starts `python -m coldbench.engine.runner` on a checkpoint with the orchestrator's gates on, and
asks `nvidia-smi` which processes hold GPU memory while the runner waits at the load gate (after its
imports: the state in which a block's processes are started ahead, while the previous block
measures), then again once it has loaded. One JSON line: the seconds to `imported` and to
`loaded`, whether the runner imported mlx-lm without transformers (`lean`), the runner's GPU
memory at each point (None where nvidia-smi is not there: a CPU or Metal host), and the load's
floor: the weight files read twice before the runner starts (`read_s`, then
`page_cache_read_s`) and the runner's own load beyond the page cache's read.

    PYTHONPATH=. python benchmarks/load_gate_probe.py --model <checkpoint folder>
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coldbench.engine.plan import Plan


def gpu_memory_of(pid: int) -> int | None:
    """MiB of GPU memory `pid` holds (0: none), or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1])
    return 0


def read_weights_s(model: Path) -> float:
    """Seconds to read every weight file once, unbuffered (the floor of a load from here)."""
    started = time.monotonic()
    for path in sorted(model.glob("model*.safetensors")):
        with open(path, "rb", buffering=0) as handle:
            while handle.read(1 << 24):
                pass
    return round(time.monotonic() - started, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--wait-s", type=float, default=2.0, help="at the gate, before looking")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="gate-probe-"))
    plan = Plan(
        run_id="gate-probe",
        variant="probe",
        adapter="embedded",
        model=str(args.model.resolve()),
        records_path=str(scratch / "records.jsonl"),
        warmup_tokens=64,
    )
    (scratch / "plan.json").write_text(json.dumps(plan.to_json()))
    env = {**os.environ, "COLDBENCH_LOAD_GATE": "1", "COLDBENCH_WARMUP_GATE": "1"}
    started = time.monotonic()
    runner = subprocess.Popen(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(scratch / "plan.json")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert runner.stdin is not None and runner.stdout is not None
    result: dict[str, Any] = {"model": str(args.model)}
    # The weights read twice before the runner starts: the second read is the page cache's,
    # the floor a load in turns (the same files every turn) is measured against.
    result["read_s"] = read_weights_s(args.model)
    result["page_cache_read_s"] = read_weights_s(args.model)
    result["weights_bytes"] = sum(p.stat().st_size for p in args.model.glob("model*.safetensors"))
    try:
        imported = json.loads(runner.stdout.readline())
        result["imported_s"] = round(time.monotonic() - started, 2)
        result["lean"] = imported.get("lean")
        time.sleep(args.wait_s)
        result["gpu_mib_at_load_gate"] = gpu_memory_of(runner.pid)
        runner.stdin.write('{"op": "load"}\n')
        runner.stdin.flush()
        loaded = json.loads(runner.stdout.readline())
        result["loaded_s"] = round(time.monotonic() - started, 2)
        result["runner_load_s"] = loaded.get("load_s")
        if loaded.get("load_s") is not None:
            result["load_beyond_page_cache_s"] = round(
                loaded["load_s"] - result["page_cache_read_s"], 3
            )
        result["gpu_mib_loaded"] = gpu_memory_of(runner.pid)
        runner.stdin.write('{"op": "exit"}\n')
        runner.stdin.flush()
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
