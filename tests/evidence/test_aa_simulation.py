"""Operating characteristics under process offsets, through the real statistics (seeded, so
these rates are fixed numbers, not chance: the simulation is benchmarks/aa_simulation.py)."""

from __future__ import annotations

from benchmarks.aa_simulation import Scenario, proportion_interval, rates, simulate_job
from evidence.schemas import default_rounds_per_process

RESAMPLES = 500
BLOCK = default_rounds_per_process(24)


def test_the_default_block_gives_twelve_process_pairs_at_24_rounds() -> None:
    assert BLOCK == 2
    records = simulate_job(Scenario("x", rounds_per_process=BLOCK), seed=0)
    assert {r.process for r in records} == set(range(1, 13))


def test_one_process_per_variant_calls_identical_code_different_most_of_the_time() -> None:
    old = rates(Scenario("one process", process_sd=0.01), jobs=60, n_resamples=RESAMPLES)
    assert old.claimed_pct >= 50, old


def test_rotation_without_cluster_statistics_is_not_enough() -> None:
    scenario = Scenario(
        "blocks, per-round statistics",
        rounds_per_process=3,
        per_round_statistics=True,
        process_sd=0.01,
    )
    assert rates(scenario, jobs=100, n_resamples=RESAMPLES).claimed_pct > 10


def test_aa_jobs_of_three_variants_stay_at_or_below_five_percent() -> None:
    for process_sd in (0.01, 0.02):
        scenario = Scenario("blocks", rounds_per_process=BLOCK, process_sd=process_sd)
        result = rates(scenario, jobs=200, n_resamples=RESAMPLES, seed=1)
        assert result.claimed_pct <= 5, result


def test_a_planted_two_percent_effect_is_found_in_nine_jobs_of_ten() -> None:
    for pair_sd in (0.005, 0.01):
        scenario = Scenario(
            "blocks", rounds_per_process=BLOCK, process_sd=0.01, pair_sd=pair_sd, effect=0.98
        )
        result = rates(scenario, jobs=100, n_resamples=RESAMPLES, seed=2)
        assert result.detected_pct >= 90, result
        assert result.verdicts.get("faster", 0) == 0


def test_a_calibrated_host_keeps_aa_claims_at_or_below_five_percent() -> None:
    """The host's calibration sets the blocks (long on a quiet host, a process a round on a
    noisy one) and the design effect: identical code is still not called different. At 1-2%
    a fresh process every round is cheapest, where the statistics are the per-pair ones at
    their nominal 5%: 300 jobs each, so no rate may be more than two standard errors above 5%
    and together they must be at or below it."""
    jobs, claimed = 300, []
    for process_sd in (0.0, 0.01, 0.02):
        scenario = Scenario("calibrated", calibrated=True, process_sd=process_sd)
        result = rates(scenario, jobs=jobs, n_resamples=RESAMPLES, seed=3)
        claimed.append(result.claimed)
        assert result.claimed_pct <= 5 + 200 * (0.05 * 0.95 / jobs) ** 0.5, result
    assert sum(claimed) <= 0.05 * jobs * len(claimed), claimed


def test_a_quiet_calibrated_host_runs_long_blocks_and_still_finds_the_effect() -> None:
    for pair_sd in (0.005, 0.01):
        scenario = Scenario(
            "calibrated", calibrated=True, process_sd=0.0, pair_sd=pair_sd, effect=0.98
        )
        result = rates(scenario, jobs=60, n_resamples=RESAMPLES, seed=4)
        assert min(result.block_lengths) >= 4, result.block_lengths  # 6 blocks or fewer
        assert result.detected_pct >= 90, result


def test_the_rates_are_the_same_numbers_with_any_number_of_workers() -> None:
    """Jobs are split at the recalibrations, so a calibrated scenario's calibrations, and with
    them its block lengths and verdicts, do not depend on the split."""
    scenario = Scenario("calibrated", calibrated=True, process_sd=0.005, effect=0.98)
    alone = rates(scenario, jobs=50, n_resamples=RESAMPLES, seed=5)
    split = rates(scenario, jobs=50, n_resamples=RESAMPLES, seed=5, workers=2)
    assert alone == split and alone.jobs == 50 and len(alone.block_lengths) == 50


def test_the_binomial_interval_says_what_300_jobs_can_tell_from_five_percent() -> None:
    # 16 A/A claims in 300 jobs (5.3%) cannot be told from 5%; in 4,000 jobs 137 (3.4%) can
    low, high = proportion_interval(16, 300)
    assert low < 0.05 < high and round(low, 3) == 0.031 and round(high, 3) == 0.085
    assert proportion_interval(137, 4000)[1] < 0.05
