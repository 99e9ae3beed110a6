"""The first screen beside the answer: what was compared and what undercuts the verdict."""

from __future__ import annotations

import re

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.summary_schema import NoiseFloor
from coldbench.evidence.rendering.headline import caveats, compared_lines
from tests.evidence.builders import provenance, simulate_run


def test_a_drift_larger_than_the_effect_is_said_next_to_the_verdict() -> None:
    # A 5% effect over a baseline falling 60% per hour through a 12-round, 12-minute run.
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.05}, rounds=12, drift_per_hour=-0.6, noise=0.005
    )
    summary = summarize(records, baseline="base", provenances=[provenance()], n_resamples=200)
    fast = [c for c in summary.comparisons if c.variant == "fast"]
    assert fast and all(c.verdict == "faster" for c in fast), [c.verdict for c in fast]
    lines = caveats(summary)
    drift = [line for line in lines if line.startswith("The baseline drifted")]
    assert drift, lines
    assert re.search(r"drifted -\d+\.\d+% across run r-1 at 64 tokens, more than the \d", drift[0])
    assert "% effect (fast faster)" in drift[0]


def test_a_clean_run_has_no_caveat_and_names_what_it_compared() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.2}, rounds=8, noise=0.01)
    measured = provenance()
    summary = summarize(records, baseline="base", provenances=[measured], n_resamples=200)
    assert caveats(summary) == []
    rows = dict(compared_lines(summary, [measured]))
    assert rows["compared"].startswith("base (baseline)")
    assert "fast @ feature bbbbbbbbbbbb · compile=true" in rows["compared"]
    assert "contexts 64, 256 tokens" in rows["matrix"] and "model preset:tiny" in rows["matrix"]
    assert measured.created_at.strftime("%Y-%m-%d") in rows["measured on"]


def test_too_few_process_pairs_and_medians_against_the_ratio_are_caveats() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.2}, rounds=8, noise=0.01)
    summary = summarize(records, baseline="base", provenances=[provenance()], n_resamples=200)
    comparison = summary.comparisons[0]
    floor = NoiseFloor(
        process_pairs=2,
        rounds_per_process_pair=2.0,
        between_process_sd=0.01,
        resolvable=0.02,
        rule="test",
    )
    # The medians say faster, the paired ratio slower: the page must say why they differ.
    tweaked = summary.model_copy(
        update={
            "noise_floor": floor,
            "comparisons": [comparison.model_copy(update={"ratio_median": 0.97})]
            + summary.comparisons[1:],
        }
    )
    lines = caveats(tweaked)
    assert any(line.startswith("Only 2 process pairs") for line in lines), lines
    direction = [line for line in lines if "median paired ratio is 0.970" in line]
    assert direction and "above the baseline's" in direction[0], lines
