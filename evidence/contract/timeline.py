"""Where a run's time went: the `timeline.json` contract and its summary section.

The orchestrator (worker/variants.py) writes one `Timeline` per run: offsets in seconds from
`started_at` (the schedule's start, a monotonic clock), for every variant process (spawned,
imported, load released, loaded, ready, exit requested, exited) and for every block start, the
seconds the orchestrator waited in each phase before the block's first timed cell: `stop` (the
previous block's processes going), `imports` (interpreters and imports; nothing when the
processes were started ahead, while the previous block measured), `load` (weights) and
`warmups`, then `ahead_imports` (the next start's processes, started ahead, finishing their
imports: no interpreter imports while a timed cell runs). `stopped` says why a run ended early
(a signal, a cancel, a timeout).

`timeline_section` reduces each run's timeline and records to what a reader needs:
- `measuring_wall_s`: the first record's start (a warm-up) to the last record's end, from the
  records alone (so it holds for bundles without a timeline);
- `timed_cells_s`: the sum of the timed cells' own spans (round >= 0, start to end);
- `duty_cycle`: timed cells over the measuring wall, the share of it spent measuring;
- `time_to_first_cell_s`: from the schedule's start to the first timed cell;
- `first_block` and `later_blocks`: the phases of the first block's start (mostly before the
  measuring wall) and of all later ones (inside it), and the block length with its reason;
- `residency` and its reason (coldbench.engine.memory's plan); in turns, `turn_starts`: the phases
  of every start within a block (a block's later turns), the time running in turns added;
- `processes_compiling_kernels` and `kernels_compiled_max`: the processes whose loads and
  warm-ups compiled kernels that MLX's CUDA kernel cache lacked, and the most modules one
  compiled (a host's first run: its warm-ups include the compiler);
- `rounds`, `block_start_s` and `round_s`: the run's measured cost, a block's start with all its
  turns' starts and a round besides, which `advice_cost_s` prices the rounds advice with: in
  turns a block pays a start per variant, and the advice says so in time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from coldbench.evidence.contract.boundary import Checked
from coldbench.evidence.contract.calibration import rounds_cost_s
from coldbench.evidence.contract.schemas import Name, Record
from coldbench.evidence.contract.summary_schema import PhaseTimes, RunTime, TimelineSummary

TIMELINE_SCHEMA: Final = "coldbench.timeline/1"
TIMELINE_FILE: Final = "timeline.json"
PHASES: Final = ("stop", "imports", "load", "warmups")
# the most kernel modules a process may say it compiled (ProcessTimes.kernels_compiled)
MAX_KERNELS_COMPILED: Final = 1_000_000

Seconds = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]


class _Strict(Checked):
    """Uploaded by a host: every value checked at the boundary (evidence/contract/boundary.py)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ProcessTimes(_Strict):
    """One variant process: offsets of its milestones (None: not reached)."""

    variant: Name
    process: int = Field(ge=1, le=1_000_000)
    block: int | None = Field(None, ge=0, le=1_000_000)
    prespawned: bool = False
    # the runner imported mlx-lm's model code without transformers (engine/lean.py)
    lean: bool | None = None
    # modules MLX's CUDA backend compiled while this process loaded and warmed up (its kernel
    # cache lacked them, coldbench.engine.jit_cache); None: no such cache (Metal, the CPU)
    kernels_compiled: int | None = Field(None, ge=0, le=MAX_KERNELS_COMPILED)
    spawned_s: Seconds
    imported_s: Seconds | None = None
    load_s: Seconds | None = None
    loaded_s: Seconds | None = None
    ready_s: Seconds | None = None
    exit_s: Seconds | None = None
    exited_s: Seconds | None = None
    ended: Literal["exited", "killed", "crashed"] | None = None


class BlockStart(_Strict):
    """Seconds the orchestrator waited in each phase before a block's first timed cell."""

    block: int = Field(ge=0, le=1_000_000)
    # in turns (one variant resident at a time): the variant whose turn this start began
    variant: Name | None = None
    began_s: Seconds
    stop_s: Seconds = 0.0
    imports_s: Seconds = 0.0
    load_s: Seconds = 0.0
    warmups_s: Seconds = 0.0
    # after the warm-ups, waiting for the processes started ahead to finish their imports
    ahead_imports_s: Seconds = 0.0
    first_cell_s: Seconds | None = None


class Timeline(_Strict):
    """timeline.json: one run's process and block timings (module docstring)."""

    schema_: Literal["coldbench.timeline/1"] = Field(TIMELINE_SCHEMA, alias="schema")
    run_id: str = Field(min_length=1, max_length=200)
    started_at: datetime
    ended_s: Seconds
    rounds_per_process: int | None = Field(None, ge=1, le=10_000)
    block_rule: str = Field("", max_length=500)
    prespawn: bool = False
    # coldbench.engine.memory's plan: every variant's process resident through a block
    # (side-by-side) or one at a time (in-turns), and why; None for a process per cell or an older
    # timeline
    residency: Literal["side-by-side", "in-turns"] | None = None
    residency_reason: str = Field("", max_length=2000)
    first_cell_s: Seconds | None = None
    stopped: str | None = Field(None, max_length=500)
    blocks: list[BlockStart] = Field(default_factory=list, max_length=100_000)
    processes: list[ProcessTimes] = Field(default_factory=list, max_length=100_000)

    def to_json_bytes(self) -> bytes:
        return (self.model_dump_json(by_alias=True, exclude_none=False, indent=1) + "\n").encode(
            "utf-8"
        )


def timeline_file_name(run_id: str, *, several: bool) -> str:
    """`timeline.json` for a run's own bundle; `timeline.<run>.json` beside others' in a job's."""
    return TIMELINE_FILE if not several else f"timeline.{run_id}.json"


def is_timeline_file(name: str) -> bool:
    return name == TIMELINE_FILE or (name.startswith("timeline.") and name.endswith(".json"))


def _phases(blocks: Sequence[BlockStart]) -> PhaseTimes:
    return PhaseTimes(
        stop_s=round(sum(b.stop_s for b in blocks), 3),
        imports_s=round(sum(b.imports_s for b in blocks), 3),
        load_s=round(sum(b.load_s for b in blocks), 3),
        warmups_s=round(sum(b.warmups_s for b in blocks), 3),
    )


def run_time(timeline: Timeline | None, records: Sequence[Record], run_id: str) -> RunTime:
    """One run's figures (module docstring) from its records and, where there is one, its
    timeline."""
    mine = [r for r in records if r.run_id == run_id]
    timed = [r for r in mine if r.round >= 0]
    span = None
    if mine:
        start = min(r.started_at for r in mine)
        end = max(r.ended_at for r in mine)
        span = max((end - start).total_seconds(), 0.0)
    cells_s = sum(max((r.ended_at - r.started_at).total_seconds(), 0.0) for r in timed)
    starts = sorted(timeline.blocks, key=lambda b: b.began_s) if timeline else []
    in_turns = timeline is not None and timeline.residency == "in-turns"
    # in turns a block has one start per variant: its first opens the block, the others are
    # what running in turns added
    blocks = [s for i, s in enumerate(starts) if i == 0 or s.block != starts[i - 1].block]
    turns = [s for i, s in enumerate(starts) if i > 0 and s.block == starts[i - 1].block]
    return RunTime(
        **_measured_cost(starts, timed, span, cells_s) if timeline else {},
        run_id=run_id,
        measuring_wall_s=None if span is None else round(span, 3),
        timed_cells_s=round(cells_s, 3),
        duty_cycle=round(cells_s / span, 4) if span else None,
        cells=len(timed),
        time_to_first_cell_s=timeline.first_cell_s if timeline else None,
        wall_s=timeline.ended_s if timeline else None,
        process_starts=len(timeline.processes) if timeline else None,
        blocks=len(blocks) if timeline else None,
        rounds_per_process=timeline.rounds_per_process if timeline else None,
        block_rule=timeline.block_rule if timeline else None,
        prespawn=timeline.prespawn if timeline else None,
        first_block=_phases(blocks[:1]) if blocks else None,
        later_blocks=_phases(blocks[1:]) if blocks else None,
        stopped=timeline.stopped if timeline else None,
        residency=timeline.residency if timeline else None,
        residency_reason=(timeline.residency_reason or None) if timeline else None,
        turn_starts=_phases(turns) if in_turns else None,
        turns_within_blocks=len(turns) if in_turns else None,
        **_kernel_compiles(timeline),
    )


def _kernel_compiles(timeline: Timeline | None) -> dict[str, Any]:
    """How many of the run's processes compiled kernels at run time, and the most one did
    (processes side by side compile the same modules at once, so a sum would count them
    twice); nothing where no process reported a kernel cache."""
    counts = [p.kernels_compiled for p in timeline.processes] if timeline else []
    known = [c for c in counts if c is not None]
    if not known:
        return {}
    return {
        "processes_compiling_kernels": sum(1 for c in known if c > 0),
        "kernels_compiled_max": max(known),
    }


def _seconds(start: BlockStart) -> float:
    return start.stop_s + start.imports_s + start.load_s + start.warmups_s


def _measured_cost(
    starts: Sequence[BlockStart], timed: Sequence[Record], span: float | None, cells_s: float
) -> dict[str, Any]:
    """`rounds`, `block_start_s` and `round_s` of a run (module docstring); nothing without a
    complete round. A block's start sums its turns' starts; the later blocks' mean is what a
    longer run pays again (the first one's imports may be more, or hidden by nothing)."""
    rounds = len({r.round for r in timed})
    if not rounds or span is None:
        return {}
    per_block: dict[int, float] = {}
    for start in starts:
        per_block[start.block] = per_block.get(start.block, 0.0) + _seconds(start)
    first, *later = per_block.values() if per_block else [0.0]
    start_s = sum(later) / len(later) if later else first
    # The span holds the later blocks' starts and the first one's warm-ups (its first records).
    inside = sum(later) + (starts[0].warmups_s if starts else 0.0)
    round_s = max(span - inside, cells_s) / rounds
    return {"rounds": rounds, "block_start_s": round(start_s, 3), "round_s": round(round_s, 3)}


def advice_cost_s(runs: Sequence[RunTime], rounds: int | None) -> float | None:
    """Seconds a job of `rounds` would take at its runs' measured cost (the slowest run's:
    runs on several hosts measure side by side), block and turn starts included; None
    without rounds or a run whose cost was measured."""
    if not rounds:
        return None
    costs = [
        rounds_cost_s(
            rounds, run.rounds_per_process, start_s=run.block_start_s, round_s=run.round_s
        )
        for run in runs
        if run.block_start_s is not None and run.round_s is not None
    ]
    return round(max(costs), 1) if costs else None


def timeline_section(
    timelines: Sequence[Timeline], records: Sequence[Record]
) -> TimelineSummary | None:
    """The summary's `timeline`: one entry per run that has a timeline, by run id (None
    without any)."""
    if not timelines:
        return None
    ordered = sorted(timelines, key=lambda t: t.run_id)
    return TimelineSummary(runs=[run_time(t, records, t.run_id) for t in ordered])
