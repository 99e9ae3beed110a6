from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from coldbench.worker.schedule import plan_rounds, round_cells, williams_rows


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_williams_rows_are_permutations_balanced_first_and_carryover(n: int) -> None:
    rows = williams_rows(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    for row in rows:
        assert sorted(row) == list(range(n))
    firsts = Counter(row[0] for row in rows)
    assert set(firsts.values()) == {len(rows) // n}
    if n > 1:
        pairs = Counter(pair for row in rows for pair in pairwise(row))
        assert len(pairs) == n * (n - 1)
        assert len(set(pairs.values())) == 1


@pytest.mark.parametrize(
    ("variants", "contexts"),
    [
        (["base", "cand"], [256]),
        (["base", "cand"], [64, 128, 256]),
        (["none", "all", "all-minus-a", "all-minus-b", "all-minus-c"], [128, 256]),
        (["a", "b", "c", "d"], [64]),
        (["a", "b", "c"], [64, 128, 256, 512]),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_every_cell_once_per_round_and_first_position_balanced(
    variants: list[str], contexts: list[int], seed: int
) -> None:
    rounds = plan_rounds(variants, contexts, seed=seed, rounds=23)
    firsts: Counter[str] = Counter()
    for r, cells in enumerate(rounds):
        matrix = [c for c in cells if not c.is_control]
        assert sorted((c.variant, c.context_tokens) for c in matrix) == sorted(
            (v, ctx) for v in variants for ctx in contexts
        )
        assert [c.order for c in cells] == list(range(len(cells)))
        assert all(c.round == r for c in cells)
        firsts[matrix[0].variant] += 1
        # Balanced within one after every prefix of rounds, not only at the end.
        counts = [firsts[v] for v in variants]
        assert max(counts) - min(counts) <= 1, (r, firsts)


def test_deterministic_by_seed_and_round_and_seed_matters() -> None:
    variants, contexts = ["base", "a", "b"], [64, 128, 256]
    once = round_cells(variants, contexts, seed=5, round_index=3)
    again = round_cells(variants, contexts, seed=5, round_index=3)
    assert once == again
    # Round 3 does not depend on how many rounds were planned.
    assert plan_rounds(variants, contexts, seed=5, rounds=4)[3] == once
    others = {
        tuple(
            (c.variant, c.context_tokens)
            for c in round_cells(variants, contexts, seed=s, round_index=3)
        )
        for s in range(10)
    }
    assert len(others) > 1


def test_two_variants_alternate_abba_within_and_across_rounds() -> None:
    rounds = plan_rounds(["base", "cand"], [64, 128], seed=0, rounds=4, bracket_min_cells=None)
    for cells in rounds:
        blocks = [[c.variant for c in cells[i : i + 2]] for i in (0, 2)]
        assert blocks[0] == list(reversed(blocks[1]))
    firsts = [cells[0].variant for cells in rounds]
    assert firsts[0] != firsts[1] and firsts[0] == firsts[2]


def test_long_rounds_are_bracketed_by_baseline_controls() -> None:
    variants = ["none", "all", "all-minus-a", "all-minus-b"]
    cells = round_cells(variants, [64, 128], seed=3, round_index=0, baseline="none")
    assert cells[0].is_control and cells[-1].is_control
    assert cells[0].variant == "none" and cells[-1].variant == "none"
    assert sum(c.is_control for c in cells) == 2
    assert cells[0].context_tokens == cells[1].context_tokens
    assert cells[-1].context_tokens == cells[-2].context_tokens
    short = round_cells(["base", "cand"], [64], seed=3, round_index=0)
    assert not any(c.is_control for c in short)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variants": [], "contexts": [64]}, "at least one variant"),
        ({"variants": ["a", "a"], "contexts": [64]}, "unique"),
        ({"variants": ["a"], "contexts": [64, 64]}, "unique"),
        ({"variants": ["a"], "contexts": [64], "baseline": "z"}, "baseline"),
    ],
)
def test_bad_input_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        round_cells(seed=0, round_index=0, **kwargs)  # type: ignore[arg-type]


def test_process_blocks_cover_every_round_once() -> None:
    from coldbench.worker.schedule import process_blocks

    assert process_blocks(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert process_blocks(24, 1) == [range(i, i + 1) for i in range(24)]
    assert process_blocks(4, 10) == [range(0, 4)]
    with pytest.raises(ValueError):
        process_blocks(4, 0)


@pytest.mark.parametrize("seed", [0, 5, 41])
def test_process_start_order_rotates_so_each_variant_starts_first_equally(seed: int) -> None:
    from coldbench.worker.schedule import start_order

    variants = ["a", "b", "c"]
    orders = [start_order(variants, seed=seed, block=b) for b in range(6)]
    assert all(sorted(o) == variants for o in orders)
    assert Counter(o[0] for o in orders) == {"a": 2, "b": 2, "c": 2}
    assert Counter(o[-1] for o in orders) == {"a": 2, "b": 2, "c": 2}
    assert orders == [start_order(variants, seed=seed, block=b) for b in range(6)]


def test_turns_read_abba_with_the_baseline_bracketing_the_others() -> None:
    from coldbench.worker.schedule import turn_order

    two = [turn_order(["a", "b"], seed=3, block=b, baseline="a") for b in range(4)]
    assert two == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    three = [turn_order(["a", "b", "c"], seed=3, block=b, baseline="a") for b in range(4)]
    for even, odd in (three[0:2], three[2:4]):
        assert even[0] == "a" and odd == even[::-1]  # a pair of blocks is a palindrome
    assert three[0][1:] != three[2][1:]  # the others' order rotates over pairs of blocks
    assert turn_order(["b", "a"], seed=3, block=0) == ["b", "a"]  # no baseline: the first
