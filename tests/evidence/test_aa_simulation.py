"""Operating characteristics of the verdict rule, through the real statistics (seeded, so these
rates are fixed numbers, not chance: the simulation is benchmarks/aa_simulation.py)."""

from __future__ import annotations

from benchmarks.aa_simulation import (
    Scenario,
    proportion_interval,
    rates,
    simulate_job,
)


def test_a_job_has_a_process_per_block_and_six_comparisons() -> None:
    records = simulate_job(Scenario(rounds=24), seed=0)
    assert {r.process for r in records} == set(range(1, 13))  # blocks of 2 at 24 rounds
    assert {r.variant for r in records} == {"a", "b", "c", "d"}
    # the default settings: until decided, a process per round, the default budget of 40
    default = Scenario(rounds=None)
    assert default.spec().until == "decided" and default.spec().rounds == 40
    assert default.how == "default: until decided (10, 20, 40)"
    decided = simulate_job(default, seed=0)
    assert {r.process for r in decided} == set(range(1, 41))


def test_aa_jobs_stay_at_or_below_five_percent_with_outliers_and_looks() -> None:
    """No noise model here reaches a real excess over 5% of jobs with a false claim: 80 jobs
    each (benchmarks/aa_simulation.py runs thousands), so the rate's exact interval must start
    at or below 5%."""
    for scenario in (
        Scenario("gauss", rounds=12),
        Scenario("outliers", rounds=12),
        Scenario("t3", rounds=None),
    ):
        result = rates(scenario, jobs=80, seed=1)
        low, _ = proportion_interval(result.claimed, result.jobs)
        assert low <= 0.05 and result.claimed / result.jobs <= 0.08, (scenario, result)
        assert result.covered / result.compared >= 0.98, result


def test_a_planted_two_percent_effect_is_found_at_the_default_settings() -> None:
    """Process SD 1.3%, with 1% of cells 5x slow too: at the default settings (measuring until
    decided) the planted 2% slowdown is `slower` in at least nine comparisons of ten, never
    `faster`."""
    for model in ("gauss", "outliers"):
        scenario = Scenario(model, rounds=None, process_sd=0.013, effect=0.98)
        result = rates(scenario, jobs=30, seed=2)
        assert result.found / result.planted >= 0.9, result
        assert result.wrong_sign == 0


def test_a_large_step_is_decided_at_six_rounds() -> None:
    """A 3.5x regression at 6 rounds: every comparison `slower` (the rank test after Holm
    could never reach the level with 6 units)."""
    result = rates(Scenario("gauss", rounds=6, effect=1 / 3.5), jobs=10, seed=3)
    assert result.found == result.planted == 20


def test_the_rates_are_the_same_numbers_with_any_number_of_workers() -> None:
    scenario = Scenario("outliers", rounds=12, effect=0.98)
    alone = rates(scenario, jobs=50, seed=5)
    split = rates(scenario, jobs=50, seed=5, workers=2)
    assert alone == split and alone.jobs == 50 and alone.planted == 100


def test_the_binomial_interval_says_what_300_jobs_can_tell_from_five_percent() -> None:
    # 16 A/A claims in 300 jobs (5.3%) cannot be told from 5%; in 4,000 jobs 137 (3.4%) can
    low, high = proportion_interval(16, 300)
    assert low < 0.05 < high and round(low, 3) == 0.031 and round(high, 3) == 0.085
    assert proportion_interval(137, 4000)[1] < 0.05
