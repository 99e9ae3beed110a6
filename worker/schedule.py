"""Balanced, rotated, seeded order of cells within each round (DESIGN.md protocol step 6).

A round is one pass over every (variant, context) cell. The round is cut into context blocks
(their order shuffled per round); within a block the variants follow a row of a Williams
design (a Latin square whose rows also balance which variant follows which), so over rounds
every variant is first equally often (within one) and, with two variants, consecutive blocks
read A B | B A (ABBA). Which variant is index 0 of the design and where the rotation starts
are drawn from the seed; everything depends on (seed, round) only, so the order of round 7 is
the same on every host and in every retry.

Long rounds (many cells, so the machine can drift between a candidate and its baseline) are
bracketed: a control cell of the baseline opens and closes the round. Control cells are extra
measurements, never part of the matrix (records of the matrix stay one per cell per round).

Process blocks. A variant's process carries a speed offset of its own (1-2% between identical
variants on the H200 and on a CPU), so the rounds are cut into blocks of `rounds_per_process`
consecutive rounds and every variant runs each block in a fresh process: the offsets become
independent block-to-block noise that the statistics cluster by (evidence/analysis/stats.py) instead
of a constant bias. Which variant's process starts first rotates over blocks from a seeded order.

Turns. Where the variants' processes cannot be resident side by side (coldbench.engine.memory's
plan), each block runs its variants one after another, one process at a time (`turn_order`); each
round's cells keep their (round, context) and prompts, so they pair as before, and each
process is still the unit the statistics cluster by.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

# A round with at least this many matrix cells gets bracketing controls: with 2 variants and
# up to 3 contexts the baseline is never more than a few cells away from any candidate.
BRACKET_MIN_CELLS = 8


@dataclass(frozen=True)
class Cell:
    """One cell to run: `order` is its position in the round, controls included."""

    round: int
    order: int
    variant: str
    context_tokens: int
    is_control: bool = False

    def message(self) -> dict[str, int]:
        """The line the variant process reads on stdin (engine/runner.py's contract)."""
        return {"round": self.round, "order": self.order, "context_tokens": self.context_tokens}


def _rng(seed: int, *parts: object) -> random.Random:
    # Seeded from a digest, not from Python's hash(): identical on every host and version.
    key = ":".join(str(p) for p in (seed, *parts)).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def williams_rows(n: int) -> list[list[int]]:
    """Rows of a Williams design for n treatments: n rows when n is even, 2n when odd.

    Each row is a permutation; over the rows every treatment is first equally often and every
    ordered pair of distinct treatments is adjacent equally often (first-order carry-over).
    """
    if n < 1:
        raise ValueError("need at least one variant")
    first = [0]
    low, high = 1, n - 1
    take_low = True
    while len(first) < n:
        if take_low:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
        take_low = not take_low
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2 == 1:
        # The mirrored square, reordered so row j starts with treatment j % n: then any run of
        # consecutive rows (wrapping around) puts each treatment first equally often, within one.
        mirrored = {row[-1]: list(reversed(row)) for row in rows}
        rows += [mirrored[k] for k in range(n)]
    return rows


def round_cells(
    variants: Sequence[str],
    contexts: Sequence[int],
    *,
    seed: int,
    round_index: int,
    baseline: str | None = None,
    bracket_min_cells: int | None = BRACKET_MIN_CELLS,
) -> list[Cell]:
    """The ordered cells of one round; a pure function of its arguments."""
    if not variants or not contexts:
        raise ValueError("a round needs at least one variant and one context")
    if len(set(variants)) != len(variants):
        raise ValueError("variant names must be unique")
    if len(set(contexts)) != len(contexts):
        raise ValueError("contexts must be unique")
    if round_index < 0:
        raise ValueError("round index must be >= 0")
    baseline = variants[0] if baseline is None else baseline
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants")

    # Seed-only choices: which variant plays which treatment index, and the rotation's start.
    design_rng = _rng(seed, "design")
    labels = list(variants)
    design_rng.shuffle(labels)
    rows = williams_rows(len(labels))
    start = design_rng.randrange(len(rows))

    block_contexts = sorted(contexts)
    _rng(seed, "round", round_index).shuffle(block_contexts)

    matrix: list[tuple[str, int]] = []
    for block, context in enumerate(block_contexts):
        row = rows[(start + round_index + block) % len(rows)]
        matrix.extend((labels[i], context) for i in row)

    bracketed = bracket_min_cells is not None and len(matrix) >= bracket_min_cells
    ordered: list[tuple[str, int, bool]] = []
    if bracketed:
        ordered.append((baseline, block_contexts[0], True))
    ordered.extend((variant, context, False) for variant, context in matrix)
    if bracketed:
        ordered.append((baseline, block_contexts[-1], True))
    return [
        Cell(round=round_index, order=i, variant=v, context_tokens=c, is_control=control)
        for i, (v, c, control) in enumerate(ordered)
    ]


def process_blocks(rounds: int, rounds_per_process: int) -> list[range]:
    """Consecutive round indices that share one process per variant; the last may be shorter."""
    if rounds < 1 or rounds_per_process < 1:
        raise ValueError("rounds and rounds per process must be >= 1")
    return [
        range(start, min(start + rounds_per_process, rounds))
        for start in range(0, rounds, rounds_per_process)
    ]


def start_order(variants: Sequence[str], *, seed: int, block: int) -> list[str]:
    """The order the variants' processes start in for one block: a seeded order rotated by one
    place per block, so over n blocks each variant starts first (and last) once."""
    if block < 0:
        raise ValueError("block index must be >= 0")
    order = list(variants)
    _rng(seed, "process-order").shuffle(order)
    shift = block % len(order) if order else 0
    return order[shift:] + order[:shift]


def turn_order(
    variants: Sequence[str], *, seed: int, block: int, baseline: str | None = None
) -> list[str]:
    """The variants' turns within one process block of a run in turns (one variant resident
    at a time): the baseline first, then the others in their seeded order rotated by one
    place every two blocks, and every odd block the same order reversed. Consecutive blocks
    read A B | B A (ABBA at block level), the baseline brackets the others in each pair of
    blocks, and every variant's mean position in time is the same in each pair, so a linear
    drift over the run reaches the baseline and the candidates alike."""
    if block < 0:
        raise ValueError("block index must be >= 0")
    if not variants:
        return []
    first = variants[0] if baseline is None or baseline not in variants else baseline
    others = start_order([v for v in variants if v != first], seed=seed, block=block // 2)
    order = [first, *others]
    return order if block % 2 == 0 else order[::-1]


def plan_rounds(
    variants: Sequence[str],
    contexts: Sequence[int],
    *,
    seed: int,
    rounds: int,
    baseline: str | None = None,
    bracket_min_cells: int | None = BRACKET_MIN_CELLS,
) -> list[list[Cell]]:
    """Every round's ordered cells."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    return [
        round_cells(
            variants,
            contexts,
            seed=seed,
            round_index=r,
            baseline=baseline,
            bracket_min_cells=bracket_min_cells,
        )
        for r in range(rounds)
    ]
