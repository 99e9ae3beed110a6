from __future__ import annotations

from coldbench.evidence.analysis.parity import first_divergence
from coldbench.evidence.analysis.summary import summarize
from tests.evidence.builders import simulate_run


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 9, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_divergence_is_accepted_only_at_a_near_tie_of_the_baseline() -> None:
    records = simulate_run(
        effects={"base": 1.0, "same": 1.0, "tied": 1.0, "wrong": 1.0},
        contexts=(64,),
        rounds=2,
        outputs={
            "base": [5, 6, 7, 8],
            "same": [5, 6, 7, 8],
            "tied": [5, 6, 9, 9],  # differs at step 2, where the baseline margin is 0.02
            "wrong": [4, 6, 7, 8],  # differs at step 0, margin 3.0
        },
        margins=[3.0, 2.5, 0.02, 1.0],
    )
    parity = summarize(records, baseline="base", n_resamples=100).parity
    assert parity.margin_threshold == 0.1
    assert parity.counts.model_dump() == {"exact": 2, "accepted": 2, "diverged": 2, "unknown": 0}
    tied = [c for c in parity.cells if c.variant == "tied"]
    assert all(c.first_divergence == 2 and c.baseline_margin == 0.02 for c in tied)
    strict = summarize(records, baseline="base", n_resamples=100, margin_threshold=0.01)
    assert strict.parity.counts.accepted == 0


def test_missing_margins_or_outputs_are_not_accepted() -> None:
    records = simulate_run(
        effects={"base": 1.0, "other": 1.0},
        contexts=(64,),
        rounds=1,
        outputs={"base": [1, 2], "other": [1, 3]},
    )
    parity = summarize(records, baseline="base", n_resamples=100).parity
    assert parity.counts.diverged == 1
    records[-1].output_head = None
    records[-2].output_head = None
    parity = summarize(records, baseline="base", n_resamples=100).parity
    assert parity.counts.unknown == 1
