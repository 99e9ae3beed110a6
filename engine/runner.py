"""The variant process: `python -m engine.runner --plan PLAN.json`.

Loads the model once, runs one discarded warm-up per context of the plan (records with status
`warmup`, round -1, on prompts never measured: kernels compile per shape, so the first timed
cell at every context finds them compiled), prints `{"event": "ready", "target": {...}}`, then
runs one cell per
stdin line `{"round": R, "order": O, "context_tokens": N}` until `{"op": "exit"}` or EOF,
appending each record to the plan's `records_path` (flush + fsync: a crash loses at most the
cell in flight) and printing `{"event": "record", "record": {...}}`. With `cells` in the plan
it runs those and exits (batch mode). The warm-up records are in the records file and in the
ready event (`"warmups": [...]`, and the first as `"warmup"`), so stdout's first line is always
`loaded`, `ready` or `error`.

With `COLDBENCH_WARMUP_GATE=1` (set by the orchestrator, worker/variants.py) the runner prints
`{"event": "loaded"}` once the model is loaded and waits for the stdin line `{"op": "warmup"}`
before its warm-ups (`{"op": "exit"}` or EOF end it): a block's processes load at the same time
and warm up one after another. A runner that does not know the gate (an older commit of an
embedded repository) warms up at once and prints `ready`, which the orchestrator accepts. stdout
carries only these JSON lines; logs go to stderr. A plan or load failure prints
`{"event": "error", "reason": "..."}` and exits 2; a bad stdin line gets an error event and the
process keeps serving.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import IO, Any

from engine.memory import release_cached_buffers
from engine.plan import WARMUP_GATE_ENV, CellRequest, Plan
from engine.record import CellRecord, Measurement, clip, now_iso, one_line

log = logging.getLogger("engine.runner")


class VariantProcess:
    def __init__(self, plan: Plan, adapter: Any, out: IO[str]) -> None:
        self.plan = plan
        self.adapter = adapter
        self.out = out
        self.records = open(plan.records_path, "a", encoding="utf-8")  # noqa: SIM115

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
        self.out.flush()

    def run(self, request: CellRequest, *, warmup: bool = False) -> dict[str, Any]:
        round_ = -1 if warmup else request.round
        order = -1 if warmup else request.order
        started_at = now_iso()
        try:
            measured = self.adapter.run_cell(round_, order, request.context_tokens)
        except Exception as error:  # noqa: BLE001 - the cell fails, the process goes on
            if isinstance(error, ValueError):  # bad input (e.g. context too large): one line
                log.warning("cell %s refused: %s", request, one_line(error))
            else:
                log.exception("cell %s failed", request)
            measured = Measurement.failed(one_line(error), started_at=started_at)
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
        record = cell.as_json()
        self._append(record)
        if not warmup:  # the warm-up travels in the ready event: stdout starts with "ready"
            self.emit({"event": "record", "record": record})
        # Between cells this process holds only its weights (engine.memory). After the record
        # is out: a device error here (a CUDA context broken by the cell) ends the process, so
        # the orchestrator starts a fresh instance for this variant's next cells (at most the
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


def wait_for_warmup(lines: IO[str], process: VariantProcess) -> bool:
    """Block until the orchestrator's `{"op": "warmup"}`; False on `exit` or EOF."""
    for line in lines:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = None
        if isinstance(message, dict) and message.get("op") in ("warmup", "exit"):
            return message["op"] == "warmup"
        process.emit({"event": "error", "reason": f"expected a warmup op, got {line.strip()[:80]}"})
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.runner", description=__doc__)
    parser.add_argument("--plan", required=True, help="plan JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("COLDBENCH_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    out = sys.stdout
    try:
        plan = Plan.load(args.plan)
        from engine.adapters import create_adapter

        adapter = create_adapter(plan)
        process = VariantProcess(plan, adapter, out)
        adapter.load()
        # batch mode: a context the model or corpus cannot serve fails before any cell runs
        check = getattr(adapter, "check_context", None)
        if check is not None:
            for context in sorted({c.context_tokens for c in plan.cells or []}):
                check(context)
    except Exception as error:  # noqa: BLE001 - reported as one line, exit 2
        log.exception("load failed")
        out.write(json.dumps({"event": "error", "reason": clip(one_line(error))}) + "\n")
        out.flush()
        return 2
    try:
        if plan.cells is None and os.environ.get(WARMUP_GATE_ENV) == "1":
            process.emit({"event": "loaded"})
            if not wait_for_warmup(sys.stdin, process):
                return 0
        warmups = [
            process.run(CellRequest(0, 0, context), warmup=True) for context in plan.warmup_shapes()
        ]
        process.emit(
            {
                "event": "ready",
                "target": adapter.describe(),
                "warmup": warmups[0],
                "warmups": warmups,
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
    sys.exit(main())
