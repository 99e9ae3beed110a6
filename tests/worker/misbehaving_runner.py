"""A variant process that speaks engine/runner.py's protocol but misbehaves on request.

Only for driving the orchestrator's fault paths (a hung cell, a crash mid-cell, a model that
does not load), which the real runner cannot be made to do on purpose. The plan's `flags`
choose the fault: `hang_round`, `crash_round`, `fail_load`, `cell_s`, `load_s` and `warmup_s`
(how long loading and the warm-up take; the warm-up's record carries when each ran and the peer
count the orchestrator gave the process), `import_s` (how long its imports take, before the
load gate), `no_gate` (a runner that predates both gates: it loads and warms up at once and
prints `ready`), `no_load_gate` (one that predates the load gate only), `warmup_hang` (a
warm-up that never ends), `kernels_compiled` (what its ready event says it compiled, as given:
the orchestrator must keep only a count within the timeline's bounds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import UTC, datetime


def _record(plan: dict, cell: dict, status: str = "ok", reason: str | None = None) -> dict:
    now = datetime.now(UTC).isoformat()
    n = cell["context_tokens"]
    return {
        "schema": "coldbench.record/1",
        "run_id": plan["run_id"],
        "variant": plan["variant"],
        "round": cell["round"],
        "order": cell["order"],
        "context_tokens": n,
        "prompt_tokens": n,
        "prompt_sha256": hashlib.sha256(f"{cell['round']}:{n}".encode()).hexdigest(),
        "cached_tokens": 0,
        "prefill_s": 0.01,
        "prefill_tps": n / 0.01,
        "decode_tokens": 0,
        "decode_s": None,
        "decode_tps": None,
        "output_sha256": None,
        "output_head": None,
        "peak_memory_bytes": None,
        "counters": {"pid": os.getpid()},
        "started_at": now,
        "ended_at": now,
        "status": status,
        "reason": reason,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True)
    with open(parser.parse_args().plan) as handle:
        plan = json.load(handle)
    flags = plan.get("flags") or {}
    if flags.get("fail_load"):
        print(json.dumps({"event": "error", "reason": "cannot load model: corrupt weights"}))
        sys.stdout.flush()
        sys.exit(2)
    out = open(plan["records_path"], "a")  # noqa: SIM115 - open for the process's life
    time.sleep(float(flags.get("import_s", 0)))
    load_gate = not (flags.get("no_gate") or flags.get("no_load_gate"))
    if os.environ.get("COLDBENCH_LOAD_GATE") == "1" and load_gate:
        print(json.dumps({"event": "imported", "import_s": 0.0, "lean": False}))
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or json.loads(line).get("op") != "load":
            sys.exit(0)
    load_started = datetime.now(UTC).isoformat()
    time.sleep(float(flags.get("load_s", 0)))
    load_ended = datetime.now(UTC).isoformat()
    if os.environ.get("COLDBENCH_WARMUP_GATE") == "1" and not flags.get("no_gate"):
        print(json.dumps({"event": "loaded"}))
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or json.loads(line).get("op") != "warmup":
            sys.exit(0)
    warm_started = datetime.now(UTC).isoformat()
    time.sleep(float(flags.get("warmup_s", 0)))
    if flags.get("warmup_hang"):
        time.sleep(3600)
    warmup = _record(plan, {"round": -1, "order": -1, "context_tokens": 8}, "warmup", "warm-up")
    warmup["started_at"] = warm_started
    warmup["counters"]["peers"] = os.environ.get("COLDBENCH_PEER_PROCESSES")
    warmup["counters"]["load_started"] = load_started
    warmup["counters"]["load_ended"] = load_ended
    out.write(json.dumps(warmup) + "\n")
    out.flush()
    if os.environ.get("COLDBENCH_WARMUP_GATE") == "1" and not flags.get("no_gate"):
        print(json.dumps({"event": "warmed", "context_tokens": 8, "warmup_s": 0.0}))
    ready = {"event": "ready", "target": {"engine_module_file": __file__, "pid": os.getpid()}}
    if "kernels_compiled" in flags:
        ready["kernels_compiled"] = flags["kernels_compiled"]
    print(json.dumps(ready))
    sys.stdout.flush()
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") == "exit":
            break
        if message["round"] == flags.get("hang_round"):
            time.sleep(3600)
        if message["round"] == flags.get("crash_round"):
            os._exit(3)
        time.sleep(float(flags.get("cell_s", 0)))
        record = _record(plan, message)
        out.write(json.dumps(record) + "\n")
        out.flush()
        print(json.dumps({"event": "record", "record": record}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
