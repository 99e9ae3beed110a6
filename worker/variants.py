"""Drive the engine's variant processes through a run's balanced schedule.

The rounds are cut into process blocks (worker/schedule.py): for each block every variant gets
a fresh `python -m engine.runner` (the model loads, every context of the matrix is warmed once
and discarded), and cells are sent in the schedule's order so variants interleave. At a block
boundary every variant's process is stopped and new ones start, in a seeded order rotated per
block, before the next timed cell: loads never overlap a timed cell. Each record carries the
instance number of the process that measured it (`process`), the unit the statistics cluster
by. Without `rounds_per_process` one process per variant serves the whole run; with
`fresh_process` every cell gets its own process. Records are appended to the run's spool
files as they arrive (flush + fsync), so a crash loses at most the cell in flight. A cell that
outlives its timeout kills its process; the variant restarts (a new instance) for its next cell.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

from engine.memory import PEER_PROCESSES_ENV
from engine.plan import WARMUP_GATE_ENV
from engine.record import CellRecord, Measurement
from worker.schedule import Cell, start_order

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
CONTROLS_FILE = "controls.jsonl"
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0


class VariantError(RuntimeError):
    """A variant process could not start or answer; the message names the variant."""


@dataclass(frozen=True)
class VariantLaunch:
    """How to start one variant's process: its interpreter and the plan it reads."""

    name: str
    python: str
    plan: dict[str, Any]  # engine/runner.py's PLAN.json, without records_path and cells
    env: dict[str, str] = field(default_factory=dict)
    module: str = "engine.runner"  # tests swap in a misbehaving runner to drive the faults
    # A worktree whose engine/ must win over the orchestrator's (embedded repositories)
    pythonpath_first: str | None = None


@dataclass
class Progress:
    cells_done: int
    cells_total: int
    variant: str | None
    context_tokens: int | None
    eta_s: float | None
    invalid: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ScheduleOutcome:
    records: list[dict[str, Any]]  # matrix cells and warm-ups, in the order they finished
    controls: list[dict[str, Any]]
    targets: dict[str, dict[str, Any]]  # variant -> the `target` its ready line reported
    cells_done: int
    cells_total: int
    stopped: bool  # stopped early on request (SIGTERM, cancel)


def engine_root() -> Path:
    """The folder holding `engine/`, put on children's PYTHONPATH so any interpreter finds it."""
    spec = find_spec("engine")
    if spec is None or not spec.submodule_search_locations:
        raise VariantError("the engine package is not importable from this interpreter")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def child_env(extra: dict[str, str] | None = None, *, first: str | None = None) -> dict[str, str]:
    """The environment of a child that runs engine code: the orchestrator's engine root first
    on PYTHONPATH, or instead `first` (a worktree of an embedded repository, whose engine/
    and kernels/ must be the ones imported), then the inherited PYTHONPATH."""
    env = dict(os.environ)
    head = [first] if first else [str(engine_root())]
    paths = [*head, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # `python -m`/`-c` would otherwise put the working directory ahead of PYTHONPATH: an
    # orchestrator started from a coldbench checkout then ran that checkout's engine/ in every
    # variant of an embedded repository instead of the variant's worktree (and the variant
    # refused to run). Python 3.11+ leaves it out with this.
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def append_line(handle: IO[bytes], value: dict[str, Any]) -> None:
    """Durable append: the line is on disk before the next cell starts."""
    handle.write(json.dumps(value, sort_keys=True).encode() + b"\n")
    handle.flush()
    os.fsync(handle.fileno())


class VariantProcess:
    """One running `engine.runner`: its stdout lines arrive on a queue read by a thread."""

    def __init__(
        self, launch: VariantLaunch, *, workdir: Path, instance: int, peers: int = 0
    ) -> None:
        self.launch = launch
        self.instance = instance
        self.spool_path = workdir / "spool" / f"{launch.name}.{instance}.jsonl"
        self.stderr_path = workdir / "logs" / f"{launch.name}.{instance}.stderr.log"
        self.plan_path = workdir / "plans" / f"{launch.name}.{instance}.json"
        for path in (self.spool_path, self.stderr_path, self.plan_path):
            path.parent.mkdir(parents=True, exist_ok=True)
        plan = {**launch.plan, "records_path": str(self.spool_path), "cells": None}
        self.plan_path.write_text(json.dumps(plan, indent=2, sort_keys=True))
        self.target: dict[str, Any] | None = None
        self.early_records: list[dict[str, Any]] = []
        self._ready_event: dict[str, Any] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [launch.python, "-m", launch.module, "--plan", str(self.plan_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            # peers: the other variants' processes resident beside it (engine.memory's guard)
            # the gate: it loads, then waits for `release_warmup` (engine/runner.py)
            env=child_env(
                {**launch.env, PEER_PROCESSES_ENV: str(peers), WARMUP_GATE_ENV: "1"},
                first=launch.pythonpath_first,
            ),
            # Its own session: a Ctrl-C or SIGTERM meant for the orchestrator does not kill the
            # cell in flight; the orchestrator decides when its children stop.
            start_new_session=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True, name=f"out-{launch.name}").start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode("utf-8", "replace").strip())
        self._lines.put(None)

    def stderr_tail(self, limit: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
        return ""

    def _next_event(self, deadline: float) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                code = self.proc.wait()
                raise VariantError(
                    f"variant {self.launch.name}: process exited with code {code}: "
                    f"{self.stderr_tail(500) or 'no stderr'}"
                )
            if not line.startswith("{"):
                log.debug("variant %s stdout: %s", self.launch.name, line)
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                log.debug("variant %s stdout: %s", self.launch.name, line)
                continue
            if isinstance(event, dict):
                return event

    def wait_loaded(self, timeout_s: float) -> None:
        """Wait until the runner has loaded the model, then let it warm up. A runner without
        the gate (an older engine commit) has warmed up already: its `ready` is kept for
        `wait_ready`."""
        deadline = time.monotonic() + timeout_s
        while self._ready_event is None:
            event = self._startup_event(deadline, "loaded", timeout_s)
            kind = event.get("event")
            if kind == "loaded":
                self._send({"op": "warmup"})
                return
            if kind == "ready":
                self._ready_event = event
            elif kind == "record":
                self.early_records.append(event["record"])

    def _startup_event(self, deadline: float, awaited: str, timeout_s: float) -> dict[str, Any]:
        """The next event while the process starts; on a timeout or an `error` event the
        process is killed and the start fails."""
        try:
            event = self._next_event(deadline)
        except TimeoutError:
            self.kill()
            raise VariantError(
                f"variant {self.launch.name}: not {awaited} after {timeout_s:.0f} s"
            ) from None
        if event.get("event") == "error":
            self.kill()
            raise VariantError(f"variant {self.launch.name}: {event.get('reason')}")
        return event

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise VariantError(f"variant {self.launch.name}: process gone ({error})") from None

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._ready_event is not None:
                event, self._ready_event = self._ready_event, None
            else:
                event = self._startup_event(deadline, "ready", timeout_s)
            kind = event.get("event")
            if kind == "ready":
                self.target = dict(event.get("target") or {})
                warmups = event.get("warmups")
                if not isinstance(warmups, list):
                    warmups = [event.get("warmup")]
                self.early_records.extend(w for w in warmups if isinstance(w, dict))
                return self.target
            if kind == "record":
                self.early_records.append(event["record"])

    def run_cell(self, cell: Cell, timeout_s: float) -> dict[str, Any]:
        """Send one cell, wait for its record; on timeout kill the process and raise."""
        self._send(cell.message())
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._next_event(deadline)
            if event.get("event") == "record":
                record = event["record"]
                if record.get("round") == cell.round and record.get("order") == cell.order:
                    return record
                self.early_records.append(record)
            elif event.get("event") == "error":
                raise VariantError(f"variant {self.launch.name}: {event.get('reason')}")

    def warmup_records(self) -> list[dict[str, Any]]:
        """The warm-ups the runner wrote before `ready` (from stdout or else its spool file)."""
        seen = [r for r in self.early_records if r.get("status") == "warmup"]
        if seen:
            return seen
        found = []
        with contextlib.suppress(OSError):
            for line in self.spool_path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(line)
                    if isinstance(value, dict) and value.get("status") == "warmup":
                        found.append(value)
        return found

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the runner to exit; terminate, then kill, if it does not."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=timeout_s / 2)
                except subprocess.TimeoutExpired:
                    self.kill()
        self._stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self._stderr.close()


def _timeout_record(
    launch: VariantLaunch, cell: Cell, started: datetime, why: str, process: int
) -> dict[str, Any]:
    """The record of a cell that never reported: status error, unknown values null."""
    plan = launch.plan
    return CellRecord.of(
        Measurement.failed(why, started_at=started.isoformat()),
        run_id=plan.get("run_id", ""),
        variant=launch.name,
        round=cell.round,
        order=cell.order,
        context_tokens=cell.context_tokens,
        adapter=plan.get("adapter"),
        flags=plan.get("flags") or {},
        process=process,
    ).as_json()


def run_schedule(
    launches: Sequence[VariantLaunch],
    rounds: Sequence[Sequence[Cell]],
    *,
    workdir: Path,
    cell_timeout_s: float,
    fresh_process: bool = False,
    rounds_per_process: int | None = None,
    seed: int = 0,
    ready_timeout_s: float = READY_TIMEOUT_S,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ScheduleOutcome:
    """Run every cell of every round in order; always stops the processes it started.

    The cell in flight always finishes; `should_stop` is asked between cells. Records go to
    `workdir/records.jsonl` (matrix cells and warm-ups) and `workdir/controls.jsonl`
    (bracketing controls) as they arrive, each stamped with its process instance (`process`).
    `rounds_per_process` cuts the rounds into process blocks (None: one block); `seed` picks
    the processes' start order of each block.
    """
    if rounds_per_process is not None and rounds_per_process < 1:
        raise ValueError("rounds_per_process must be >= 1")
    by_name = {launch.name: launch for launch in launches}
    cells = [cell for round_ in rounds for cell in round_]
    missing = sorted({c.variant for c in cells} - set(by_name))
    if missing:
        raise VariantError(f"schedule names variants without a launch: {', '.join(missing)}")
    workdir.mkdir(parents=True, exist_ok=True)
    outcome = ScheduleOutcome([], [], {}, 0, len(cells), False)
    processes: dict[str, VariantProcess] = {}
    instances: dict[str, int] = {}
    invalid: list[dict[str, Any]] = []
    cell_seconds: list[float] = []

    def spawn(name: str) -> VariantProcess:
        instances[name] = instances.get(name, 0) + 1
        peers = 0 if fresh_process else len(by_name) - 1
        return VariantProcess(by_name[name], workdir=workdir, instance=instances[name], peers=peers)

    def ready(process: VariantProcess) -> VariantProcess:
        try:
            process.wait_loaded(ready_timeout_s)
            target = process.wait_ready(ready_timeout_s)
        except BaseException:
            process.kill()
            raise
        outcome.targets.setdefault(process.launch.name, target)
        for warmup in process.warmup_records():
            warmup["process"] = process.instance
            append_line(records_out, warmup)
            outcome.records.append(warmup)
        return process

    def start(name: str) -> VariantProcess:
        return ready(spawn(name))

    def report(cell: Cell | None) -> None:
        if on_progress is None:
            return
        left = outcome.cells_total - outcome.cells_done
        mean = sum(cell_seconds) / len(cell_seconds) if cell_seconds else None
        on_progress(
            Progress(
                cells_done=outcome.cells_done,
                cells_total=outcome.cells_total,
                variant=cell.variant if cell else None,
                context_tokens=cell.context_tokens if cell else None,
                eta_s=None if mean is None else mean * left,
                invalid=list(invalid),
            )
        )

    with (
        open(workdir / RECORDS_FILE, "ab") as records_out,
        open(workdir / CONTROLS_FILE, "ab") as controls_out,
    ):

        def start_block(block: int) -> None:
            """Stop every variant's process, then start fresh ones for this block: they load
            their models at the same time, and warm up one after another in the block's rotated
            order, because warm-ups at every context of the matrix at once would need every
            process's largest peak on the device together (on the H200, two 8B processes warming
            64K and 128K ran out of memory; engine.memory). A variant that cannot load fails the
            run before the block's first timed cell."""
            for name in list(processes):
                processes.pop(name).stop()
            order = start_order(list(by_name), seed=seed, block=block)
            spawned = [spawn(name) for name in order]
            try:
                for process in spawned:
                    processes[process.launch.name] = ready(process)
            except BaseException:
                for process in spawned:
                    process.kill()
                raise

        block: int | None = None
        try:
            report(cells[0] if cells else None)
            for cell in cells:
                if should_stop is not None and should_stop():
                    outcome.stopped = True
                    break
                if not fresh_process:
                    cell_block = cell.round // rounds_per_process if rounds_per_process else 0
                    if cell_block != block:
                        start_block(cell_block)
                        block = cell_block
                report(cell)
                process = processes.get(cell.variant)
                if process is None or process.proc.poll() is not None:
                    process = processes[cell.variant] = start(cell.variant)
                started = datetime.now(UTC)
                clock = time.monotonic()
                try:
                    record = process.run_cell(cell, cell_timeout_s)
                    record["process"] = process.instance
                except TimeoutError:
                    process.kill()
                    del processes[cell.variant]
                    record = _timeout_record(
                        by_name[cell.variant],
                        cell,
                        started,
                        f"cell timeout: no record after {cell_timeout_s:.0f} s",
                        process.instance,
                    )
                except VariantError as error:
                    # The process died mid-cell: the cell is an error, the variant restarts.
                    process.kill()
                    del processes[cell.variant]
                    record = _timeout_record(
                        by_name[cell.variant], cell, started, str(error), process.instance
                    )
                cell_seconds.append(time.monotonic() - clock)
                if cell.is_control:
                    append_line(controls_out, record)
                    outcome.controls.append(record)
                else:
                    append_line(records_out, record)
                    outcome.records.append(record)
                    if record.get("status") not in ("ok", "warmup"):
                        invalid.append(
                            {
                                "variant": cell.variant,
                                "round": cell.round,
                                "context_tokens": cell.context_tokens,
                                "reason": record.get("reason") or record.get("status"),
                            }
                        )
                outcome.cells_done += 1
                if fresh_process:
                    processes.pop(cell.variant).stop()
                report(cell)
            report(None)
        finally:
            for process in processes.values():
                process.stop()
    return outcome
