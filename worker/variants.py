"""Drive the engine's variant processes through a run's balanced schedule.

The rounds are cut into process blocks (worker/schedule.py): for each block every variant gets
a fresh `python -m coldbench.engine.runner` (the model loads, every context of the matrix is warmed
once and discarded), and cells are sent in the schedule's order so variants interleave. At a block
boundary every variant's process is stopped and the new ones let in, in a seeded order rotated
per block, before the next timed cell: loads never overlap a timed cell. With `prespawn` the
next block's processes start as soon as the current block's have imported: their interpreters
and imports run while the current block loads and warms up, and the current block's first
timed cell waits until they are done (`ahead_imports_s` in the timeline), so imports never
overlap a timed cell either. Started when the block had begun to measure instead, three
interpreters importing made the block's first timed cell 1.7-1.8x slow on the H200 (16K,
8B; benchmarks/first_cells.py reads it from the bundles). They then wait at the runner's load
gate, touching no device, until the current block's processes are gone (engine/runner.py's
gates). Each record carries the instance number
of the process that measured it (`process`), the unit the statistics cluster by. Without
`rounds_per_process` one process per variant serves the whole run; with `fresh_process` every
cell gets its own process. Records are appended to the run's spool files as they arrive
(flush + fsync), so a crash loses at most the cell in flight. A cell or warm-up that outlives
the cell timeout kills its process; the variant restarts (a new instance) for its next cell.

Every wait also asks `should_stop`: a stop request (a signal, a cancel, the run's deadline)
ends a load or a warm-up at once and the cell in flight after at most `STOP_GRACE_S`; every
process started is killed with its process group, and what was measured is kept. The run's
`Timeline` (evidence/contract/timeline.py) records when each process reached each milestone and how
long each block start waited in each phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

from coldbench.engine.canary import CANARY_ENV, CANARY_ROUND
from coldbench.engine.memory import IN_TURNS, PEER_PROCESSES_ENV, RESIDENCIES, SIDE_BY_SIDE
from coldbench.engine.plan import LOAD_GATE_ENV, WARMUP_GATE_ENV, Plan
from coldbench.engine.record import CellRecord, Measurement
from coldbench.evidence.contract.timeline import (
    MAX_KERNELS_COMPILED,
    BlockStart,
    ProcessTimes,
    Timeline,
)
from coldbench.worker.schedule import Cell, start_order, turn_order

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
CONTROLS_FILE = "controls.jsonl"
# Interpreter start, imports and loading the weights (warm-ups have the cell timeout).
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0
# After a stop request the cell in flight gets at most this long to report.
STOP_GRACE_S = 10.0
# How often a wait looks at `should_stop`.
POLL_S = 0.2


class VariantError(RuntimeError):
    """A variant process could not start or answer; the message names the variant. `outcome`
    holds what the schedule measured before (records, timeline)."""

    outcome: ScheduleOutcome | None = None


class Stopped(Exception):
    """A stop was requested while the schedule waited on a process."""


# The variant process of this install's engine (an embedded repository's tree may name its own:
# coldbench.worker.build.EngineLayout.runner).
RUNNER = "coldbench.engine.runner"


@dataclass(frozen=True)
class VariantLaunch:
    """How to start one variant's process: its interpreter and the plan it reads."""

    name: str
    python: str
    plan: Plan  # engine/runner.py's PLAN.json; each process gets its records_path and cells
    env: dict[str, str] = field(default_factory=dict)
    module: str = RUNNER  # tests swap in a misbehaving runner to drive the faults
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
    timeline: Timeline | None = None
    # variant -> why its process could not start (only variants the schedule may drop)
    dropped: dict[str, str] = field(default_factory=dict)
    # why measuring ended before the last round (`end_after_round`: every verdict decided)
    ended: str | None = None


class RunClock:
    """Offsets in seconds from the schedule's start (a monotonic clock), for the timeline."""

    def __init__(self) -> None:
        self.started_at = datetime.now(UTC)
        self._zero = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self._zero, 4)


def engine_root() -> Path:
    """A folder holding the `coldbench` package and nothing else of a checkout, put on
    children's PYTHONPATH so any interpreter finds it.

    An installed wheel's folder is site-packages. A checkout's is its root, which also holds the
    card's folders under their own names: its kernels/ (`coldbench.kernels`) would shadow
    Hugging Face's `kernels` in the child (setuptools then fails to build anything, through that
    distribution's entry point). There the folder is `.coldbench/import-path/`, one link to
    coldbench/."""
    spec = find_spec("coldbench")
    if spec is None or not spec.submodule_search_locations:
        raise VariantError("the coldbench package is not importable from this interpreter")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    if not (package.parent / "pyproject.toml").is_file():
        return package.parent
    folder = package.parent / ".coldbench" / "import-path"
    link = folder / "coldbench"
    if not link.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        # made aside and renamed: processes starting at once see the link whole or not at all
        staged = folder / f".coldbench-{os.getpid()}-{threading.get_ident()}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(Path("..", "..", package.name))
        os.replace(staged, link)
    return folder


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
    """One running `coldbench.engine.runner`: its stdout lines arrive on a queue read by a
    thread."""

    def __init__(
        self,
        launch: VariantLaunch,
        *,
        workdir: Path,
        instance: int,
        peers: int = 0,
        clock: RunClock | None = None,
        block: int | None = None,
        prespawned: bool = False,
        canary: bool = False,
    ) -> None:
        self.launch = launch
        self.instance = instance
        self.clock = clock or RunClock()
        self.spool_path = workdir / "spool" / f"{launch.name}.{instance}.jsonl"
        self.stderr_path = workdir / "logs" / f"{launch.name}.{instance}.stderr.log"
        self.plan_path = workdir / "plans" / f"{launch.name}.{instance}.json"
        for path in (self.spool_path, self.stderr_path, self.plan_path):
            path.parent.mkdir(parents=True, exist_ok=True)
        plan = dataclasses.replace(launch.plan, records_path=str(self.spool_path), cells=None)
        self.plan_path.write_text(json.dumps(plan.to_json(), indent=2, sort_keys=True))
        self.target: dict[str, Any] | None = None
        self.early_records: list[dict[str, Any]] = []
        self.warmups = len(plan.warmup_contexts or []) or 1
        # None until the runner says: True when it waits at the load gate (engine/runner.py),
        # False for a runner that predates it (it loaded at once).
        self.load_gated: bool | None = None
        self._stashed: dict[str, Any] | None = None  # a `loaded` or `ready` read ahead
        # why the start failed, once it has: a later ask raises it again (a process started
        # ahead whose imports failed fails its own block's start, not the one it waited in)
        self.failure: VariantError | None = None
        self._loaded = False
        # stdout's lines with the moment each arrived (the timeline's offsets), None at EOF
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.said_at = 0.0  # when the last event taken was printed
        self._stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.times = ProcessTimes(
            variant=launch.name,
            process=instance,
            block=block,
            prespawned=prespawned,
            spawned_s=self.clock.now(),
        )
        self.proc = subprocess.Popen(
            [launch.python, "-m", launch.module, "--plan", str(self.plan_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            # peers: the other variants' processes resident beside it (coldbench.engine.memory's
            # guard); the gates: it imports, waits, loads, waits, warms up (engine/runner.py)
            env=child_env(
                {
                    **launch.env,
                    PEER_PROCESSES_ENV: str(peers),
                    LOAD_GATE_ENV: "1",
                    WARMUP_GATE_ENV: "1",
                    # the run's one warm canary, after this process's warm-ups
                    **({CANARY_ENV: "1"} if canary else {}),
                },
                first=launch.pythonpath_first,
            ),
            # Its own session and process group: a Ctrl-C or SIGTERM meant for the orchestrator
            # does not kill the cell in flight (the orchestrator decides when its children
            # stop), and a kill reaches whatever the runner started (a server).
            start_new_session=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True, name=f"out-{launch.name}").start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put((self.clock.now(), raw.decode("utf-8", "replace").strip()))
        self._lines.put(None)

    def stderr_tail(self, limit: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
        return ""

    def _next_event(
        self, deadline: float, should_stop: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        while True:
            if should_stop is not None and should_stop():
                raise Stopped
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            event = self._take(min(remaining, POLL_S))
            if event is not None:
                return event

    def _take(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next JSON event on stdout within `timeout_s` (None: only what is there now),
        or None; VariantError when the process has exited."""
        while True:
            try:
                item = self._lines.get(timeout=timeout_s) if timeout_s else self._lines.get_nowait()
            except queue.Empty:
                return None
            if item is None:
                code = self.proc.wait()
                self.times.exited_s = self.times.exited_s or self.clock.now()
                self.times.ended = self.times.ended or "crashed"
                raise VariantError(
                    f"variant {self.launch.name}: process exited with code {code}: "
                    f"{self.stderr_tail(500) or 'no stderr'}"
                )
            arrived, line = item
            if not line.startswith("{"):
                log.debug("variant %s stdout: %s", self.launch.name, line)
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                log.debug("variant %s stdout: %s", self.launch.name, line)
                continue
            if isinstance(event, dict):
                self.said_at = arrived
                return event

    def _startup_event(
        self,
        deadline: float,
        late: str,
        should_stop: Callable[[], bool] | None,
    ) -> dict[str, Any]:
        """The next event while the process starts; on a timeout or an `error` event the
        process is killed and the start fails."""
        if self._stashed is not None:
            event, self._stashed = self._stashed, None
            return event
        try:
            event = self._next_event(deadline, should_stop)
        except TimeoutError:
            self.kill()
            raise VariantError(f"variant {self.launch.name}: {late}") from None
        if event.get("event") == "error":
            self.kill()
            raise VariantError(f"variant {self.launch.name}: {event.get('reason')}")
        return event

    def imported_yet(self) -> bool:
        """Read what the runner has said so far (without waiting): True once its imports are
        done and it waits at the load gate, or once it has shown it has no such gate (an older
        engine commit says `loaded` or `ready` first: kept for the next wait)."""
        if self.failure is not None:
            raise self.failure
        try:
            return self._read_imported()
        except VariantError as error:
            self.failure = error
            raise

    def _read_imported(self) -> bool:
        while self.load_gated is None:
            event = self._take(None)
            if event is None:
                return False
            kind = event.get("event")
            if kind == "error":
                self.kill()
                raise VariantError(f"variant {self.launch.name}: {event.get('reason')}")
            if kind == "imported":
                self.load_gated = True
                self.times.imported_s = self.said_at
                lean = event.get("lean")
                self.times.lean = lean if isinstance(lean, bool) else None
            elif kind in ("loaded", "ready"):
                self.load_gated = False
                self._stashed = event
            elif kind == "record":
                self.early_records.append(event["record"])
        return True

    def release_load(self) -> None:
        """Let a runner waiting at the load gate load its model."""
        if self.load_gated:
            self._send({"op": "load"})
        self.times.load_s = self.clock.now()

    def wait_loaded(self, timeout_s: float, should_stop: Callable[[], bool] | None = None) -> None:
        """Wait until the runner has loaded the model. A runner without the warm-up gate has
        warmed up already: its `ready` is kept for `wait_ready`."""
        deadline = time.monotonic() + timeout_s
        while not self._loaded:
            event = self._startup_event(
                deadline, f"not loaded after {timeout_s:.0f} s", should_stop
            )
            kind = event.get("event")
            if kind == "loaded":
                self._loaded = True
                self.times.loaded_s = self.said_at
            elif kind == "ready":
                self._loaded = True
                self._stashed = event
            elif kind == "record":
                self.early_records.append(event["record"])

    def wait_ready(
        self, cell_timeout_s: float, should_stop: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """Let the loaded runner warm up and wait for its `ready`: each warm-up (one per
        context) gets the cell timeout; a runner that does not report them one by one gets
        the cell timeout times their number."""
        stashed_ready = self._stashed is not None and self._stashed.get("event") == "ready"
        if not stashed_ready:
            self._send({"op": "warmup"})
        budget = cell_timeout_s * self.warmups
        deadline = time.monotonic() + budget
        while True:
            event = self._startup_event(
                deadline,
                f"a warm-up did not finish within the cell timeout ({budget:.0f} s)",
                should_stop,
            )
            kind = event.get("event")
            if kind == "warmed":
                # the next warm-up has a cell timeout of its own
                budget = cell_timeout_s
                deadline = time.monotonic() + budget
            elif kind == "ready":
                self.target = dict(event.get("target") or {})
                warmups = event.get("warmups")
                if not isinstance(warmups, list):
                    warmups = [event.get("warmup")]
                self.early_records.extend(w for w in warmups if isinstance(w, dict))
                if isinstance(event.get("canary"), dict):
                    self.early_records.append(event["canary"])
                self.times.ready_s = self.said_at
                compiled = event.get("kernels_compiled")
                if type(compiled) is int and 0 <= compiled <= MAX_KERNELS_COMPILED:
                    self.times.kernels_compiled = compiled
                return self.target
            elif kind == "record":
                self.early_records.append(event["record"])

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise VariantError(f"variant {self.launch.name}: process gone ({error})") from None

    def run_cell(
        self,
        cell: Cell,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Send one cell, wait for its record; raise TimeoutError after `timeout_s`, or after
        `STOP_GRACE_S` more once a stop is requested (the process is the caller's to kill)."""
        self._send(cell.message())
        deadline = time.monotonic() + timeout_s
        stopping = False

        def stop_requested() -> bool:
            nonlocal deadline, stopping
            if not stopping and should_stop is not None and should_stop():
                stopping = True
                deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            return False

        while True:
            try:
                event = self._next_event(deadline, stop_requested)
            except TimeoutError:
                if stopping:
                    raise Stopped from None
                raise
            if event.get("event") == "record":
                record = event["record"]
                if record.get("round") == cell.round and record.get("order") == cell.order:
                    return record
                self.early_records.append(record)
            elif event.get("event") == "error":
                raise VariantError(f"variant {self.launch.name}: {event.get('reason')}")

    def warmup_records(self) -> list[dict[str, Any]]:
        """The warm-ups (and the warm canary, round -2) the runner wrote before `ready`, from
        stdout or else its spool file."""

        def before_ready(record: dict[str, Any]) -> bool:
            return record.get("status") == "warmup" or record.get("round") == CANARY_ROUND

        seen = [r for r in self.early_records if before_ready(r)]
        if seen:
            return seen
        found = []
        with contextlib.suppress(OSError):
            for line in self.spool_path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(line)
                    if isinstance(value, dict) and before_ready(value):
                        found.append(value)
        return found

    def request_exit(self) -> None:
        """Ask the runner to exit (at a gate, or between cells) without waiting for it."""
        if self.times.exit_s is None:
            self.times.exit_s = self.clock.now()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()

    def reap(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait for an exit asked for; terminate, then kill, a runner that does not go."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s / 2)
            except subprocess.TimeoutExpired:
                self.kill()
        self._ended("exited")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the runner to exit and wait for it (terminate, then kill, if it does not)."""
        self.request_exit()
        self.reap(timeout_s)

    def kill(self) -> None:
        """Kill the runner and its process group (a server it started), at once."""
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait()
            self._ended("killed")
        self._ended("exited")

    def _signal(self, sig: int) -> None:
        # Its own session (start_new_session): the group is the runner and what it started.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def _ended(self, how: str) -> None:
        if self.times.exited_s is None:
            self.times.exited_s = self.clock.now()
        if self.times.ended is None:
            self.times.ended = how  # type: ignore[assignment]
        with contextlib.suppress(OSError):
            self._stderr.close()


def _timeout_record(
    launch: VariantLaunch, cell: Cell, started: datetime, why: str, process: int
) -> dict[str, Any]:
    """The record of a cell that never reported: status error, unknown values null."""
    plan = launch.plan
    return CellRecord.of(
        Measurement.failed(why, started_at=started.isoformat()),
        run_id=plan.run_id,
        variant=launch.name,
        round=cell.round,
        order=cell.order,
        context_tokens=cell.context_tokens,
        adapter=plan.adapter,
        flags=plan.flags,
        process=process,
    ).as_json()


@dataclass(frozen=True)
class _Start:
    """Processes brought up together and the cells they measure: a whole block's (every
    variant side by side) or one variant's turn in a block; block None: a process per cell."""

    block: int | None
    names: list[str]
    cells: list[Cell]
    ends_block: bool


def _starts(
    variants: list[str],
    cells: list[Cell],
    *,
    fresh_process: bool,
    in_turns: bool,
    rounds_per_process: int | None,
    seed: int,
    baseline: str | None,
) -> list[_Start]:
    if fresh_process:
        return [_Start(None, [], cells, True)]
    blocks: dict[int, list[Cell]] = {}
    for cell in cells:
        block = cell.round // rounds_per_process if rounds_per_process else 0
        blocks.setdefault(block, []).append(cell)
    starts = []
    for block, block_cells in blocks.items():
        if not in_turns:
            starts.append(
                _Start(block, start_order(variants, seed=seed, block=block), block_cells, True)
            )
            continue
        present = {cell.variant for cell in block_cells}
        order = [
            v
            for v in turn_order(variants, seed=seed, block=block, baseline=baseline)
            if v in present
        ]
        for turn, name in enumerate(order):
            mine = [cell for cell in block_cells if cell.variant == name]
            starts.append(_Start(block, [name], mine, turn == len(order) - 1))
    return starts


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
    prespawn: bool = False,
    block_rule: str = "",
    run_id: str | None = None,
    droppable: Collection[str] = (),
    end_after_round: Callable[[int, Sequence[dict[str, Any]]], str | None] | None = None,
    residency: str = SIDE_BY_SIDE,
    residency_reason: str = "",
    baseline: str | None = None,
) -> ScheduleOutcome:
    """Run every cell of every round in order; always stops the processes it started.

    `should_stop` is asked between cells and during every wait (module docstring). Records go to
    `workdir/records.jsonl` (matrix cells and warm-ups) and `workdir/controls.jsonl`
    (bracketing controls) as they arrive, each stamped with its process instance (`process`).
    `rounds_per_process` cuts the rounds into process blocks (None: one block); `seed` picks
    the processes' start order of each block; `prespawn` starts the next block's processes
    while the current one loads and warms up; `block_rule` says why the blocks have their
    length (for the timeline). A variant that cannot start raises VariantError, whose
    `outcome` holds what was measured; one of `droppable` (a history's commits) is dropped
    instead: its process is killed, its remaining cells are not run (nor counted),
    `outcome.dropped` says why, and the others go on. `end_after_round(rounds_done, records)`
    is asked after each complete round (in turns: after each block, the first moment its
    rounds are complete); a reason it returns ends the schedule there (`outcome.ended`): a run
    measuring until its verdicts are decided.

    `residency` (coldbench.engine.memory's plan, `residency_reason` its why): `side-by-side`, every
    variant's process resident through the block, cells in the schedule's order; `in-turns`,
    one process at a time: each block runs each variant's cells of its rounds in a turn of
    their own, in `turn_order` (`baseline` first in even blocks, last in odd ones), every
    process alone on the device. A round's matrix cells are the same in both; its bracketing
    controls are not run in turns (the baseline's turns bracket the others instead).
    """
    if rounds_per_process is not None and rounds_per_process < 1:
        raise ValueError("rounds_per_process must be >= 1")
    if residency not in RESIDENCIES:
        raise ValueError(f"residency must be one of {', '.join(RESIDENCIES)}")
    in_turns = residency == IN_TURNS and not fresh_process
    by_name = {launch.name: launch for launch in launches}
    cells = [cell for round_ in rounds for cell in round_ if not (in_turns and cell.is_control)]
    missing = sorted({c.variant for c in cells} - set(by_name))
    if missing:
        raise VariantError(f"schedule names variants without a launch: {', '.join(missing)}")
    workdir.mkdir(parents=True, exist_ok=True)
    clock = RunClock()
    timeline = Timeline(
        run_id=run_id or (launches[0].plan.run_id if launches else "run"),
        started_at=clock.started_at,
        ended_s=0.0,
        rounds_per_process=None if fresh_process else rounds_per_process,
        block_rule=block_rule,
        prespawn=prespawn and not fresh_process,
        residency=None if fresh_process else residency,  # type: ignore[arg-type]
        residency_reason="" if fresh_process else residency_reason,
    )
    starts = _starts(
        list(by_name),
        cells,
        fresh_process=fresh_process,
        in_turns=in_turns,
        rounds_per_process=rounds_per_process,
        seed=seed,
        baseline=baseline,
    )
    with (
        open(workdir / RECORDS_FILE, "ab") as records_out,
        open(workdir / CONTROLS_FILE, "ab") as controls_out,
    ):
        schedule = _Schedule(
            by_name=by_name,
            cells=cells,
            starts=starts,
            workdir=workdir,
            records_out=records_out,
            controls_out=controls_out,
            clock=clock,
            outcome=ScheduleOutcome([], [], {}, 0, len(cells), False, timeline),
            cell_timeout_s=cell_timeout_s,
            ready_timeout_s=ready_timeout_s,
            fresh_process=fresh_process,
            in_turns=in_turns,
            prespawn=prespawn,
            droppable=droppable,
            end_after_round=end_after_round,
            on_progress=on_progress,
            stop=should_stop or (lambda: False),
        )
        schedule.run()
    return schedule.outcome


@dataclass
class _Schedule:
    """One run of `run_schedule`: its settings, the processes it holds and what it measured.
    `run` walks the starts in order; every other method is one step of a start."""

    by_name: dict[str, VariantLaunch]  # the variants still in the run (a dropped one leaves)
    cells: list[Cell]
    starts: list[_Start]
    workdir: Path
    records_out: IO[bytes]  # matrix cells and warm-ups
    controls_out: IO[bytes]  # bracketing controls
    clock: RunClock
    outcome: ScheduleOutcome
    cell_timeout_s: float
    ready_timeout_s: float
    fresh_process: bool
    in_turns: bool
    prespawn: bool
    droppable: Collection[str]
    end_after_round: Callable[[int, Sequence[dict[str, Any]]], str | None] | None
    on_progress: Callable[[Progress], None] | None
    stop: Callable[[], bool]
    processes: dict[str, VariantProcess] = field(default_factory=dict)  # this block's, by variant
    ahead: dict[str, VariantProcess] = field(default_factory=dict)  # the next block's (prespawn)
    started: list[VariantProcess] = field(default_factory=list)  # every process, in start order
    instances: dict[str, int] = field(default_factory=dict)  # variant -> processes started
    invalid: list[dict[str, Any]] = field(default_factory=list)  # matrix cells not ok
    cell_seconds: list[float] = field(default_factory=list)
    # variant -> whether its last process waited at the load gate
    gated: dict[str, bool] = field(default_factory=dict)
    checked: int = 0  # the rounds done when `end_after_round` was last asked
    left: Counter[str] = field(init=False)  # each variant's cells not yet run

    def __post_init__(self) -> None:
        self.left = Counter(cell.variant for cell in self.cells)

    @property
    def timeline(self) -> Timeline:
        assert self.outcome.timeline is not None
        return self.outcome.timeline

    def run(self) -> None:
        """Every start in order until the last, a stop request or `end_after_round`; then
        every process is stopped and the timeline closed, whatever happened."""
        try:
            self.report(self.cells[0] if self.cells else None)
            for index in range(len(self.starts)):
                if not self.run_start(index):
                    break
            self.report(None)
        except Stopped:
            self.outcome.stopped = True
        except VariantError as error:
            error.outcome = self.outcome
            raise
        finally:
            self.finish()

    def run_start(self, index: int) -> bool:
        """Bring up the processes of the start at `index` and measure its cells; False when
        the schedule ends here (a stop request, or decided before or during the start)."""
        current = self.starts[index]
        if self.stop():
            self.outcome.stopped = True
            return False
        # Side by side (and a process per cell) the rounds complete one by one; in turns only
        # at the end of a block, before the next block's first turn.
        opens_block = index == 0 or self.starts[index - 1].ends_block
        if current.cells and opens_block and self.ends_after(current.cells[0].round):
            return False
        if current.block is not None and any(n in self.by_name for n in current.names):
            following = self.starts[index + 1] if index + 1 < len(self.starts) else None
            self.start_processes(current, following)
        self.measure_cells(current.cells)
        if self.outcome.stopped or self.outcome.ended:
            return False
        if current.ends_block:
            # A block has ended, in either residency: every variant has measured every cell
            # of the block's rounds, each in its own process.
            log.debug("block %s ended", current.block)
        return True

    def measure_cells(self, cells: Sequence[Cell]) -> None:
        """A start's cells in order, until a stop request or (side by side) `end_after_round`;
        a dropped variant's cells are skipped."""
        for cell in cells:
            if self.stop():
                self.outcome.stopped = True
                return
            if not self.in_turns and self.ends_after(cell.round):
                return
            if cell.variant not in self.outcome.dropped:
                self.measure(cell)

    def ends_after(self, rounds_done: int) -> bool:
        """Ask `end_after_round` once the first `rounds_done` rounds are complete (once for
        each number of rounds); True when the run ends there."""
        if self.end_after_round is None or rounds_done <= self.checked:
            return False
        self.checked = rounds_done
        ended = self.end_after_round(rounds_done, self.outcome.records)
        if ended:
            self.outcome.ended = ended
        return bool(ended)

    def spawn(self, name: str, block: int | None, *, prespawned: bool = False) -> VariantProcess:
        self.instances[name] = self.instances.get(name, 0) + 1
        # in turns a process is alone on the device: the guard gives it the whole of it
        peers = 0 if self.fresh_process or self.in_turns else len(self.by_name) - 1
        process = VariantProcess(
            self.by_name[name],
            workdir=self.workdir,
            instance=self.instances[name],
            peers=peers,
            clock=self.clock,
            block=block,
            prespawned=prespawned,
            canary=not self.started,  # the run's first process runs the warm canary
        )
        self.started.append(process)
        return process

    def start_processes(self, start: _Start, following: _Start | None) -> None:
        """Stop the processes of the previous start, then bring up this start's (every variant
        side by side, or one variant's in turns): started ahead (prespawn) or now, in the
        start's order. With `prespawn`, the processes of the start that follows start as soon
        as these have imported, and import while these load and warm up; this start's first
        timed cell waits until they have imported (module docstring)."""
        assert start.block is not None
        names = [name for name in start.names if name in self.by_name]
        phases = BlockStart(
            block=start.block, began_s=self.clock.now(), variant=names[0] if self.in_turns else None
        )
        self.timeline.blocks.append(phases)
        mark = time.monotonic()
        self.stop_block()
        phases.stop_s = round(time.monotonic() - mark, 4)
        spawned = [self.ahead.pop(name, None) or self.spawn(name, start.block) for name in names]
        for process in self.ahead.values():  # nothing left over is expected; never kept
            process.kill()
        self.ahead.clear()
        ahead = following if self.prespawn and following is not None else None
        spawned = self.bring_up(spawned, phases, ahead=ahead)
        self.processes.update((process.launch.name, process) for process in spawned)
        mark = time.monotonic()
        self.wait_ahead_imported(deadline=mark + self.ready_timeout_s)
        phases.ahead_imports_s = round(time.monotonic() - mark, 4)

    def stop_block(self) -> None:
        """The previous start's processes asked to exit together, then each reaped."""
        old = list(self.processes.values())
        self.processes.clear()
        for process in old:
            process.request_exit()
        for process in old:
            process.reap()

    def prespawn_next(self, following: _Start) -> None:
        """Start the following start's processes now, to wait at the load gate."""
        if following.block is None:
            return
        for name in following.names:
            # only a runner known to wait at the load gate may start early: an older one
            # would load (and touch the device) while this start measures
            if name in self.by_name and self.waits_at_gate(name):
                self.ahead[name] = self.spawn(name, following.block, prespawned=True)

    def waits_at_gate(self, name: str) -> bool:
        """Whether `name`'s runner waits at the load gate: as its last process did, or, before
        it has run (a run in turns' first block), as one of the same interpreter, module and
        import path did."""
        if name in self.gated:
            return self.gated[name]
        launch = self.by_name[name]
        same = [
            self.gated[other.name]
            for other in self.by_name.values()
            if other.name in self.gated
            and (other.python, other.module, other.pythonpath_first)
            == (launch.python, launch.module, launch.pythonpath_first)
        ]
        return bool(same) and all(same)

    def bring_up(
        self,
        spawned: Sequence[VariantProcess],
        phases: BlockStart | None,
        *,
        ahead: _Start | None = None,
    ) -> list[VariantProcess]:
        """Imports, then every load at once, then the warm-ups one after another, because
        warm-ups at every context of the matrix at once would need every process's largest
        peak on the device together (on the H200, two 8B processes warming 64K and 128K ran out
        of memory; coldbench.engine.memory). `ahead`: the start whose processes begin now, once
        these have imported (whether they wait at the load gate is known then), to import while
        these load and warm up. A variant that cannot start fails the run, or is dropped when
        it is `droppable`; returns the processes that started."""
        alive = list(spawned)
        try:
            mark = time.monotonic()
            self.release_loads(alive, deadline=mark + self.ready_timeout_s)
            imports_s = time.monotonic() - mark
            for process in alive:
                self.gated[process.launch.name] = bool(process.load_gated)
            if ahead is not None:
                self.prespawn_next(ahead)
            mark = time.monotonic()
            self.wait_loaded(alive)
            load_s = time.monotonic() - mark
            mark = time.monotonic()
            self.warm_up(alive)
            warmups_s = time.monotonic() - mark
        except BaseException:
            for process in spawned:
                process.kill()
            raise
        if phases is not None:
            phases.imports_s = round(phases.imports_s + imports_s, 4)
            phases.load_s = round(phases.load_s + load_s, 4)
            phases.warmups_s = round(phases.warmups_s + warmups_s, 4)
        return alive

    def release_loads(self, alive: list[VariantProcess], *, deadline: float) -> None:
        """Each process loads as soon as its imports are done; one not imported by `deadline`
        has failed to start."""
        waiting = list(alive)
        while waiting:
            for process in list(waiting):
                try:
                    if not process.imported_yet():
                        continue
                    process.release_load()
                except VariantError as error:
                    self.failed(alive, process, error)
                waiting.remove(process)
            if not waiting:
                break
            if self.stop():
                raise Stopped
            if time.monotonic() > deadline:
                late = waiting.pop(0)
                self.failed(
                    alive,
                    late,
                    VariantError(
                        f"variant {late.launch.name}: not imported after "
                        f"{self.ready_timeout_s:.0f} s"
                    ),
                )
                continue
            time.sleep(0.01)

    def wait_ahead_imported(self, *, deadline: float) -> None:
        """Wait until every process started ahead has imported (or failed, which its own start
        reports), so that no interpreter imports while a timed cell runs; one not imported by
        `deadline` is killed, and its start spawns a fresh one."""
        waiting = list(self.ahead.items())
        while waiting:
            for name, process in list(waiting):
                try:
                    done = process.imported_yet()
                except VariantError:
                    done = True  # kept: its own start raises it again (`failure`)
                if done:
                    waiting.remove((name, process))
            if not waiting:
                return
            if self.stop():
                raise Stopped
            if time.monotonic() > deadline:
                for name, process in waiting:
                    log.warning("variant %s started ahead: not imported in time", name)
                    process.kill()
                    self.ahead.pop(name, None)
                return
            time.sleep(0.01)

    def wait_loaded(self, alive: list[VariantProcess]) -> None:
        for process in list(alive):
            try:
                process.wait_loaded(self.ready_timeout_s, self.stop)
            except VariantError as error:
                self.failed(alive, process, error)

    def warm_up(self, alive: list[VariantProcess]) -> None:
        """The warm-ups one process after another; their records go to the records spool."""
        for process in list(alive):
            try:
                target = process.wait_ready(self.cell_timeout_s, self.stop)
            except VariantError as error:
                self.failed(alive, process, error)
                continue
            self.outcome.targets.setdefault(process.launch.name, target)
            for warmup in process.warmup_records():
                warmup["process"] = process.instance
                append_line(self.records_out, warmup)
                self.outcome.records.append(warmup)

    def failed(
        self, alive: list[VariantProcess], process: VariantProcess, error: VariantError
    ) -> None:
        """A process that could not start: the run fails, or its variant is dropped."""
        if process.launch.name not in self.droppable:
            raise error
        process.kill()
        alive.remove(process)
        self.drop(process.launch.name, str(error))

    def drop(self, name: str, why: str) -> None:
        """A droppable variant that cannot start: none of its processes runs again, none of its
        remaining cells is run or counted."""
        self.outcome.dropped[name] = why
        self.by_name.pop(name, None)
        self.outcome.cells_total -= self.left[name]
        self.left[name] = 0
        for table in (self.processes, self.ahead):
            gone = table.pop(name, None)
            if gone is not None:
                gone.kill()
        log.warning("dropped %s: %s", name, why)

    def restart(self, name: str) -> VariantProcess | None:
        """A fresh process for `name` (None: it could not start and was dropped)."""
        started_now = self.bring_up([self.spawn(name, None)], None)
        return started_now[0] if started_now else None

    def measure(self, cell: Cell) -> None:
        """One cell on its variant's process (restarted first when it is gone)."""
        self.report(cell)
        process = self.processes.get(cell.variant)
        if process is None or process.proc.poll() is not None:
            restarted = self.restart(cell.variant)
            if restarted is None:
                return
            process = self.processes[cell.variant] = restarted
        mark = time.monotonic()
        record = self.run_cell(process, cell)
        self.cell_seconds.append(time.monotonic() - mark)
        self.keep(cell, record)
        self.outcome.cells_done += 1
        self.left[cell.variant] -= 1
        if self.fresh_process:
            # a cell that timed out or crashed has already killed and forgotten its process
            finished = self.processes.pop(cell.variant, None)
            if finished is not None:
                finished.stop()
        self.report(cell)

    def run_cell(self, process: VariantProcess, cell: Cell) -> dict[str, Any]:
        """The cell's record; a cell that times out or whose process dies is an error record,
        and the process is killed so the variant restarts for its next cell."""
        began = datetime.now(UTC)
        if self.timeline.first_cell_s is None:
            self.timeline.first_cell_s = self.clock.now()
        blocks = self.timeline.blocks
        if blocks and blocks[-1].first_cell_s is None:
            blocks[-1].first_cell_s = self.clock.now()
        try:
            record = process.run_cell(cell, self.cell_timeout_s, self.stop)
            record["process"] = process.instance
        except TimeoutError:
            why = f"cell timeout: no record after {self.cell_timeout_s:.0f} s"
        except VariantError as error:
            why = str(error)  # the process died mid-cell
        else:
            return record
        process.kill()
        del self.processes[cell.variant]
        return _timeout_record(self.by_name[cell.variant], cell, began, why, process.instance)

    def keep(self, cell: Cell, record: dict[str, Any]) -> None:
        """The record to its spool and the outcome; a matrix cell that is not ok is listed as
        invalid for the progress report."""
        if cell.is_control:
            append_line(self.controls_out, record)
            self.outcome.controls.append(record)
            return
        append_line(self.records_out, record)
        self.outcome.records.append(record)
        if record.get("status") not in ("ok", "warmup"):
            self.invalid.append(
                {
                    "variant": cell.variant,
                    "round": cell.round,
                    "context_tokens": cell.context_tokens,
                    "reason": record.get("reason") or record.get("status"),
                }
            )

    def report(self, cell: Cell | None) -> None:
        if self.on_progress is None:
            return
        left = self.outcome.cells_total - self.outcome.cells_done
        mean = sum(self.cell_seconds) / len(self.cell_seconds) if self.cell_seconds else None
        self.on_progress(
            Progress(
                cells_done=self.outcome.cells_done,
                cells_total=self.outcome.cells_total,
                variant=cell.variant if cell else None,
                context_tokens=cell.context_tokens if cell else None,
                eta_s=None if mean is None else mean * left + self.starts_left_s(),
                invalid=list(self.invalid),
            )
        )

    def starts_left_s(self) -> float:
        """The process starts still to come, each priced at the later ones measured so far (the
        first also waits for the imports that later ones, started ahead, do not): in turns a
        block pays one per variant, and the estimate says so."""
        process_starts = sum(1 for s in self.starts if s.block is not None)
        begun = self.timeline.blocks
        measured = begun[1:] or begun
        if not measured:
            return 0.0
        each = sum(
            b.stop_s + b.imports_s + b.load_s + b.warmups_s + b.ahead_imports_s for b in measured
        )
        return max(process_starts - len(begun), 0) * each / len(measured)

    def finish(self) -> None:
        """Every process stopped (killed after a stop request, else asked to exit and reaped,
        then killed should any be left) and the timeline closed."""
        remaining = [*self.processes.values(), *self.ahead.values()]
        for process in remaining:
            if self.outcome.stopped:
                process.kill()
            else:
                process.request_exit()
        for process in remaining:
            process.reap()
        for process in self.started:
            process.kill()  # a no-op for those already gone
        if self.outcome.stopped:
            done = f"{self.outcome.cells_done} of {self.outcome.cells_total} cells"
            self.timeline.stopped = f"stopped on request after {done}"
        self.timeline.processes = [process.times for process in self.started]
        self.timeline.ended_s = self.clock.now()
