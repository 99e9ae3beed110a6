"""The first timed cell of each process block: is it slower than the block's other cells?

Why. A variant process warms every context before its first timed cell (engine/runner.py), so
its first timed cell should cost what its later ones do. In the H200 bundles of 2026-12-03
(benchmarks/results, `benchmarks/first_cells.py` reads them) the first timed cell of every block
but the last ran 1.66-1.84x slow at 16K: the next block's interpreters, started ahead, were
importing beside it (worker/variants.py now lets them import only while a block loads and warms
up). This check is the net under that fix and under anything else a block's first cell may pay
for alone (a clock ramping up after the idle load, a pool the warm-up did not fill).

Blocks, from the records alone, per run: the `ok` timed cells in time order; a cell opens a
block (a start: every variant's process side by side, or one variant's turn) when it is the
first of its process and the cell before it was the last of its own process (or there is none).
A block holds the cells from its first up to the next block's first.

The test. Per block, the first cell's prefill time against the block's other cells of the same
variant and context: its rank r, how many of those k others were faster. With no position effect
a block's cells are exchangeable and r is uniform on 0..k, so the sum of the ranks over a run's
blocks has an exact null distribution (the convolution of those uniforms); p is one-sided,
P(sum >= observed). Both variants together: the seeded rotated order puts each variant first
equally often. The effect is established in a run where p <= ALPHA and the geometric mean of the
first cells' slowdowns exceeds the requested precision (a drift within blocks ranks a first cell
high without making it materially slow).

What the verdicts do with it. Where established, the first cell of every block of that run is
left out of every statistic with the cells paired with it (every variant's cell of that round
and context): both variants alike, whichever measured first, and the process medians are
computed without them. Only where every block keeps at least one cell of each (variant, context)
it measured; otherwise the cells stay and the effect is flagged only, saying why. The summary
names it under "what undercuts it" either way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from coldbench.evidence.contract.schemas import Record
from coldbench.evidence.contract.summary_schema import FirstCellBlock, FirstCells, RunFirstCells

ALPHA = 0.05
LEFT_OUT_REASON = (
    "left out by the first-cell check: a process block's first timed cell and its pairs"
)
RULE = (
    "per run, each process block's first timed cell ranked among the block's other cells of its "
    "variant and context by prefill time; exact one-sided test of the rank sum (no position "
    f"effect: each rank uniform); established at p <= {ALPHA:g} with a geometric mean slowdown "
    "above the requested precision; where established, every block's first cell and its pairs "
    "are left out of the statistics if every block keeps a cell of each variant and context"
)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


@dataclass(frozen=True)
class Block:
    """One start's timed cells in time order (module docstring): `cells[0]` opened it."""

    run_id: str
    index: int
    cells: list[Record]


def process_blocks(records: Sequence[Record]) -> dict[str, list[Block]]:
    """Each run's blocks (module docstring), for records stamped with their process."""
    by_run: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record.status == "ok" and record.round >= 0 and record.process is not None:
            by_run[record.run_id].append(record)
    found: dict[str, list[Block]] = {}
    for run_id, cells in sorted(by_run.items()):
        cells.sort(key=lambda r: (_utc(r.started_at), r.order))
        first: dict[tuple[str, int | None], int] = {}
        last: dict[tuple[str, int | None], int] = {}
        for position, record in enumerate(cells):
            first.setdefault((record.variant, record.process), position)
            last[(record.variant, record.process)] = position
        opens = [
            position
            for position, record in enumerate(cells)
            if first[(record.variant, record.process)] == position
            and (
                position == 0
                or last[(cells[position - 1].variant, cells[position - 1].process)] == position - 1
            )
        ]
        ends = [*opens[1:], len(cells)]
        found[run_id] = [
            Block(run_id, index, cells[start:end])
            for index, (start, end) in enumerate(zip(opens, ends, strict=True))
        ]
    return found


def _seconds_per_token(record: Record) -> float:
    return 1.0 / (record.prefill_tps or math.inf)


def block_row(block: Block) -> FirstCellBlock | None:
    """The block's first cell against its other cells of the same variant and context (None:
    it has none)."""
    head = block.cells[0]
    others = [
        _seconds_per_token(r)
        for r in block.cells[1:]
        if r.variant == head.variant and r.context_tokens == head.context_tokens
    ]
    if not others:
        return None
    mine = _seconds_per_token(head)
    return FirstCellBlock(
        block=block.index,
        variant=head.variant,
        round=head.round,
        context_tokens=head.context_tokens,
        slowdown=mine / float(np.median(others)),
        others=len(others),
        faster_others=sum(1 for other in others if other < mine),
    )


def rank_sum_p(rows: Sequence[FirstCellBlock]) -> float | None:
    """P(rank sum >= observed) where each block's rank is uniform on 0..others (exact)."""
    if not rows:
        return None
    null = np.array([1.0])
    for row in rows:
        null = np.convolve(null, np.full(row.others + 1, 1.0 / (row.others + 1)))
    observed = sum(row.faster_others for row in rows)
    return float(min(1.0, null[observed:].sum()))


def _empties(blocks: Sequence[Block], left_out: set[tuple[str, int, int]]) -> str | None:
    """Why leaving these (run, round, context) cells out is unsound: a block left without a
    cell of a (variant, context) it measured; None when every block keeps one."""
    for block in blocks:
        kept: dict[tuple[str, int], int] = defaultdict(int)
        for record in block.cells:
            key = (record.run_id, record.round, record.context_tokens)
            kept[(record.variant, record.context_tokens)] += key not in left_out
        for (variant, context), count in sorted(kept.items()):
            if not count:
                return (
                    f"leaving them out would leave block {block.index} without a cell of "
                    f"{variant} at {context} tokens"
                )
    return None


def run_check(
    run_id: str, blocks: Sequence[Block], *, threshold: float
) -> tuple[RunFirstCells, set[tuple[str, int, int]]] | None:
    """One run's check and the (run, round, context) cells it leaves out (None: no block has a
    cell to compare its first with)."""
    rows = [found for block in blocks if (found := block_row(block)) is not None]
    if not rows:
        return None
    p = rank_sum_p(rows)
    slowdowns = [row.slowdown for row in rows]
    geomean = math.exp(float(np.mean(np.log(slowdowns))))
    slow = [s for s in slowdowns if s > 1 + threshold]
    established = p is not None and p <= ALPHA and geomean > 1 + threshold
    left_out: set[tuple[str, int, int]] = set()
    treatment = "no established effect: every cell counts"
    if established:
        keys = {(run_id, b.cells[0].round, b.cells[0].context_tokens) for b in blocks}
        unsound = _empties(blocks, keys)
        if unsound:
            treatment = f"flagged only, every cell counts: {unsound}"
        else:
            left_out = keys  # `first_cells_applied` says how many cells that is
    row = RunFirstCells(
        run_id=run_id,
        blocks=len(rows),
        slow_blocks=len(slow),
        slowdown_slow_median=float(np.median(slow)) if slow else None,
        slowdown_geomean=geomean,
        p_value=p,
        established=established,
        left_out=0,
        treatment=treatment,
        cells=rows,
    )
    return row, left_out


def first_cells_applied(
    records: Sequence[Record], *, threshold: float
) -> tuple[list[Record], FirstCells | None]:
    """`records` with the cells the check leaves out made invalid (`LEFT_OUT_REASON`), and
    summary.json's `first_cells` (None where no run has a block to test)."""
    runs: list[RunFirstCells] = []
    left_out: set[tuple[str, int, int]] = set()
    for run_id, blocks in process_blocks(records).items():
        checked = run_check(run_id, blocks, threshold=threshold)
        if checked is None:
            continue
        row, keys = checked
        if keys:
            count = sum(
                1
                for r in records
                if r.status == "ok" and (r.run_id, r.round, r.context_tokens) in keys
            )
            row = row.model_copy(
                update={
                    "left_out": count,
                    "treatment": (
                        f"left out of every statistic: each block's first cell and the cells "
                        f"paired with it ({count} cells), both variants alike; the process "
                        "medians are computed without them"
                    ),
                }
            )
            left_out |= keys
        runs.append(row)
    if not runs:
        return list(records), None
    kept = [
        record.model_copy(update={"status": "invalid", "reason": LEFT_OUT_REASON})
        if record.status == "ok"
        and (record.run_id, record.round, record.context_tokens) in left_out
        else record
        for record in records
    ]
    return kept, FirstCells(threshold=threshold, alpha=ALPHA, runs=runs, rule=RULE)


def first_cells_caveats(section: FirstCells | None) -> list[str]:
    """One sentence per run where the first cells of its blocks were established slow."""
    if section is None:
        return []
    found = []
    for run in section.runs:
        if not run.established:
            continue
        size = run.slowdown_slow_median or run.slowdown_geomean or 1.0
        found.append(
            f"The first timed cell of each process block was {size:.2f}x the rest in "
            f"{run.slow_blocks} of {run.blocks} blocks of run {run.run_id} (geometric mean "
            f"{run.slowdown_geomean or 1.0:.2f}x, rank test p {run.p_value or 0.0:.2g}): "
            f"{run.treatment}."
        )
    return found
