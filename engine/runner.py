"""The variant process: `python -m coldbench.engine.runner --plan PLAN.json`.

Loads the model once, runs one discarded warm-up per context of the plan (records with status
`warmup`, round -1, on prompts never measured: kernels compile per shape, so the first timed
cell at every context finds them compiled), prints `{"event": "ready", "target": {...}}`, then
runs one cell per stdin line `{"round": R, "order": O, "context_tokens": N}` until
`{"op": "exit"}` or EOF, appending each record to the plan's `records_path` (flush + fsync: a
crash loses at most the cell in flight) and printing `{"event": "record", "record": {...}}`.
With `cells` in the plan it runs those and exits (batch mode). The warm-up records are in the
records file and in the ready event (`"warmups": [...]`, and the first as `"warmup"`). With
`COLDBENCH_CANARY=1` (one process per run, engine/canary.py) the warm canary runs after the
warm-ups (round -2) and travels in the ready event as `"canary"` (the openai-server
adapter's canary is a repeat of a prompt the server was sent, timed against cold twins, at
the size its `canary_tokens` gives); an adapter without `canary_cell` runs none. The ready
event's `"kernels_compiled"` counts the modules MLX's CUDA backend compiled while the process
loaded and warmed up, its kernel cache lacking them (engine/jit_cache.py; null without one).

Gates, set by the orchestrator (worker/variants.py) in the environment (not plan fields, so
that a runner of an older engine commit, whose Plan refuses unknown fields, still starts):

- `COLDBENCH_LOAD_GATE=1`: after its imports, before it touches any device, the runner prints
  `{"event": "imported", "import_s": S, "lean": bool}` and waits for `{"op": "load"}`. The
  orchestrator starts the next block's processes while the current block loads and warms up
  and lets them load once the current block's processes are gone.
- `COLDBENCH_WARMUP_GATE=1`: after loading it prints `{"event": "loaded", "load_s": S}` and
  waits for `{"op": "warmup"}`: a block's processes load at the same time and warm up one after
  another. Then each warm-up prints `{"event": "warmed", "context_tokens": N, "warmup_s": S}`,
  so the orchestrator bounds every warm-up by the cell timeout. Without the gate stdout's first
  line is `ready` or `error`.

At either gate `{"op": "exit"}` or EOF ends the process. A runner that does not know a gate (an
older commit of an embedded repository) goes on at once, which the orchestrator accepts. stdout
carries only these JSON lines; logs go to stderr. A plan, import or load failure prints
`{"event": "error", "reason": "..."}` and exits 2; a bad stdin line gets an error event and the
process keeps serving. The process exits on its own when its parent (the orchestrator) is gone,
also in the middle of a cell or warm-up, so a killed orchestrator leaves no runner behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from typing import IO, Any

from coldbench.engine import jit_cache, lean
from coldbench.engine.canary import (
    CANARY_ORDER,
    CANARY_REASON,
    CANARY_ROUND,
    canary_context,
    canary_requested,
)
from coldbench.engine.memory import release_cached_buffers
from coldbench.engine.plan import LOAD_GATE_ENV, WARMUP_GATE_ENV, CellRequest, Plan
from coldbench.engine.record import CellRecord, Measurement, clip, now_iso, one_line
from coldbench.engine.telemetry import GpuTelemetry, MacTelemetry, open_telemetry

log = logging.getLogger("coldbench.engine.runner")


class VariantProcess:
    def __init__(self, plan: Plan, adapter: Any, out: IO[str]) -> None:
        self.plan = plan
        self.adapter = adapter
        self.out = out
        self.records = open(plan.records_path, "a", encoding="utf-8")  # noqa: SIM115
        # opened at the first cell: nothing touches the device before the load gate
        self.telemetry: GpuTelemetry | MacTelemetry | None = None

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
        self.out.flush()

    def run(
        self, request: CellRequest, *, warmup: bool = False, canary: bool = False
    ) -> dict[str, Any]:
        round_ = -1 if warmup else CANARY_ROUND if canary else request.round
        order = -1 if warmup else CANARY_ORDER if canary else request.order
        started_at = now_iso()
        if self.telemetry is None:
            from coldbench.engine.backend import detect_backend

            self.telemetry = open_telemetry(detect_backend())  # pmset on macOS
        before = self.telemetry.start()
        try:
            if canary:
                measured = self.adapter.canary_cell(request.context_tokens)
            else:
                measured = self.adapter.run_cell(round_, order, request.context_tokens)
        except Exception as error:  # noqa: BLE001 - the cell fails, the process goes on
            if isinstance(error, ValueError):  # bad input (e.g. context too large): one line
                log.warning("cell %s refused: %s", request, one_line(error))
            else:
                log.exception("cell %s failed", request)
            measured = Measurement.failed(one_line(error), started_at=started_at)
        # read after the cell, outside its timing (engine/telemetry.py)
        measured.counters.update(self.telemetry.finish(before))
        cell = CellRecord.of(
            measured,
            run_id=self.plan.run_id,
            variant=self.plan.variant,
            round=round_,
            order=order,
            context_tokens=request.context_tokens,
            adapter=self.plan.adapter,
            flags=self.plan.flags,
        )
        if warmup and cell.status != "error":
            cell.reason = "discarded warm-up" + (
                f" (cell was {measured.status}: {measured.reason})"
                if measured.status != "ok"
                else ""
            )
            cell.status = "warmup"
        elif warmup:
            cell.reason = f"warm-up: {cell.reason}"
        elif canary:  # the judge's verdict stays: `invalid` is the canary caught
            what = getattr(self.adapter, "canary_reason", CANARY_REASON)  # a server's: a repeat
            cell.reason = f"{what}: {cell.reason or 'passed as cold'}"
        record = cell.as_json()
        self._append(record)
        if not (warmup or canary):  # these travel in the ready event: stdout starts with "ready"
            self.emit({"event": "record", "record": record})
        # Between cells this process holds only its weights (coldbench.engine.memory). After the
        # record is out: a device error here (a CUDA context broken by the cell) ends the process,
        # so the orchestrator starts a fresh instance for this variant's next cells (at most the
        # next one is lost, as "process gone") instead of every later cell failing in it.
        release_cached_buffers()
        return record

    def _append(self, record: dict[str, Any]) -> None:
        self.records.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.records.flush()
        os.fsync(self.records.fileno())

    def serve(self, lines: IO[str]) -> None:
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
                if isinstance(message, dict) and message.get("op") == "exit":
                    return
                request = CellRequest.from_json(message)
            except ValueError as error:
                self.emit({"event": "error", "reason": f"bad cell request: {one_line(error)}"})
                continue
            self.run(request)

    def close(self) -> None:
        self.records.close()


def wait_for_op(lines: IO[str], process: VariantProcess | None, op: str) -> bool:
    """Block until the orchestrator's `{"op": op}`; False on `exit` or EOF."""
    for line in lines:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = None
        if isinstance(message, dict) and message.get("op") in (op, "exit"):
            return message["op"] == op
        error = {"event": "error", "reason": f"expected a {op} op, got {line.strip()[:80]}"}
        if process is not None:
            process.emit(error)
    return False


def watch_parent(poll_s: float = 0.5) -> None:
    """End this process when its parent is gone (re-parented: `getppid` changes), also in the
    middle of a cell or warm-up. A server the openai-server adapter started dies with it (its
    own parent-death signal)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                log.warning("the orchestrator (pid %d) is gone: exiting", parent)
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _error_line(out: IO[str], error: BaseException) -> int:
    out.write(json.dumps({"event": "error", "reason": clip(one_line(error))}) + "\n")
    out.flush()
    return 2


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """The variant process. `own_process` (the `python -m` entry): this interpreter is the
    runner's alone, so it may import mlx-lm lean (coldbench.engine.lean) and end when its parent
    does."""
    parser = argparse.ArgumentParser(prog="python -m coldbench.engine.runner", description=__doc__)
    parser.add_argument("--plan", required=True, help="plan JSON file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    logging.basicConfig(
        level=os.environ.get("COLDBENCH_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    out = sys.stdout
    if own_process:
        watch_parent()
    try:
        plan = Plan.load(args.plan)
        # Decided before anything imports mlx_lm (coldbench.engine.lean): no transformers here.
        if own_process and lean.is_lean_plan(plan.adapter, plan.model):
            lean.install()
        from coldbench.engine.adapters import create_adapter

        adapter = create_adapter(plan)
        prepare = getattr(adapter, "prepare", None)
        if prepare is not None:
            prepare()  # imports only: nothing touches the device before the load gate
        process = VariantProcess(plan, adapter, out)
    except Exception as error:  # noqa: BLE001 - reported as one line, exit 2
        log.exception("start failed")
        return _error_line(out, error)
    serving = plan.cells is None
    if serving and os.environ.get(LOAD_GATE_ENV) == "1":
        imported = {"import_s": round(time.monotonic() - started, 4), "lean": lean.is_installed()}
        process.emit({"event": "imported", **imported})
        if not wait_for_op(sys.stdin, process, "load"):
            process.close()
            return 0
    try:
        kernels_dir = jit_cache.kernel_cache_dir()
        kernels_before = jit_cache.kernel_modules(kernels_dir)
        clock = time.monotonic()
        adapter.load()
        load_s = round(time.monotonic() - clock, 4)
        # batch mode: a context the model or corpus cannot serve fails before any cell runs
        check = getattr(adapter, "check_context", None)
        if check is not None:
            for context in sorted({c.context_tokens for c in plan.cells or []}):
                check(context)
    except Exception as error:  # noqa: BLE001 - reported as one line, exit 2
        log.exception("load failed")
        process.close()
        adapter.close()
        return _error_line(out, error)
    try:
        gated = serving and os.environ.get(WARMUP_GATE_ENV) == "1"
        if gated:
            process.emit({"event": "loaded", "load_s": load_s})
            if not wait_for_op(sys.stdin, process, "warmup"):
                return 0
        warmups = []
        for context in plan.warmup_shapes():
            clock = time.monotonic()
            warmups.append(process.run(CellRequest(0, 0, context), warmup=True))
            if gated:  # an orchestrator that knows the gate knows this event
                warmup_s = round(time.monotonic() - clock, 4)
                process.emit({"event": "warmed", "context_tokens": context, "warmup_s": warmup_s})
        canary: dict[str, Any] = {}
        if canary_requested() and hasattr(adapter, "canary_cell"):
            context = canary_context(plan.warmup_shapes())
            if hasattr(adapter, "canary_tokens"):  # a server's canary needs a minimum size
                context = adapter.canary_tokens(context)
            request = CellRequest(0, 0, context)
            canary["canary"] = process.run(request, canary=True)
        process.emit(
            {
                "event": "ready",
                "target": adapter.describe(),
                "warmup": warmups[0],
                "warmups": warmups,
                # modules MLX compiled while this process loaded and warmed up (its CUDA
                # kernel cache lacked them): what made a first block's warm-ups long
                "kernels_compiled": jit_cache.modules_compiled(
                    kernels_before, jit_cache.kernel_modules(kernels_dir)
                ),
                **canary,
            }
        )
        if plan.cells is not None:
            for request in plan.cells:
                process.run(request)
        else:
            process.serve(sys.stdin)
    except BrokenPipeError:
        log.warning("stdout closed: the orchestrator is gone; stopping")
        return 1
    finally:
        process.close()
        adapter.close()
    return 0


if __name__ == "__main__":
    code = main(own_process=True)
    # Records are fsynced and the adapter closed: skip the interpreter's teardown (freeing every
    # array one by one, unloading modules) so that a block's processes are gone at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
