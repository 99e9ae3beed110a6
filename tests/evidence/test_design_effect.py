"""A calibrated host: variance components, the design effect of a process pair, block length.

The rates under process offsets of 0-2% are checked through the simulation in
test_aa_simulation.py; these tests pin the arithmetic on cases whose answer is known."""

from __future__ import annotations

import html
import math
from datetime import timedelta

import numpy as np
import pytest
from scipy import stats as scipy_stats

from evidence.bundle import build_bundle
from evidence.calibration import (
    MIN_CALIBRATED_BLOCKS,
    HostCalibration,
    VarianceSums,
    block_length,
    merge_calibrations,
    noise_of,
)
from evidence.job_options import build_job_spec
from evidence.schemas import HostNoise, Record
from evidence.stats import (
    StatsOptions,
    block_anova,
    calibration_sums,
    design_effect_interval,
    median_interval,
    signed_rank_p,
)
from evidence.summary import summarize
from evidence.timeline import BlockStart, Timeline
from tests.evidence.builders import START, calibration_sample, provenance, record
from worker.run import process_blocks

OPTIONS = StatsOptions(n_resamples=500)


def _blocks(offsets: list[float], pairs: int, sd: float, seed: int = 0) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(np.exp(offset + rng.normal(0, sd, pairs))) for offset in offsets]


def test_the_anova_of_process_pairs_is_the_textbook_one() -> None:
    blocks = [[1.0, math.e], [math.e, math.e**2], [1.0, 1.0]]
    anova = block_anova(blocks)
    assert anova is not None
    # logs [0, 1], [1, 2], [0, 0]: block means 0.5, 1.5, 0; grand mean 2/3
    assert anova.ss_between == pytest.approx(
        2 * ((0.5 - 2 / 3) ** 2 + (1.5 - 2 / 3) ** 2 + (2 / 3) ** 2)
    )
    assert anova.ss_within == pytest.approx(1.0)
    assert (anova.df_between, anova.df_within, anova.m0) == (2, 3, 2.0)
    assert block_anova([[1.0, 2.0]]) is None  # one process pair tells nothing between pairs


def test_the_upper_bound_inverts_the_f_distribution() -> None:
    sums = VarianceSums(ss_between=2.0, df_between=10, ss_within=4.0, df_within=40, m0=5.0)
    f = (2.0 / 10) / (4.0 / 40)  # 2.0
    within = 0.1
    assert sums.process_variance() == pytest.approx((f - 1) / 5 * within)
    bound = (f / scipy_stats.f.ppf(0.05, 10, 40) - 1) / 5 * within
    assert sums.process_variance(upper=0.95) == pytest.approx(bound)
    assert sums.p_value() == pytest.approx(scipy_stats.f.sf(f, 10, 40))
    total = sums + sums
    assert (total.df_between, total.df_within, total.m0) == (20, 80, 5.0)
    assert (
        noise_of(VarianceSums(ss_between=1, df_between=1, ss_within=0, df_within=0, m0=2)) is None
    )


def test_a_quiet_calibrated_host_counts_every_pair() -> None:
    """Two process pairs of twelve: on an uncalibrated host two units give no interval short of
    the full range; with a calibration bounding the process component at 0 the pairs count."""
    blocks = _blocks([0.02, 0.02], pairs=12, sd=0.005)
    ratios = [r for b in blocks for r in b]
    low, high, p_value, design = design_effect_interval(
        blocks, prior_sd=0.0, seed=1, options=OPTIONS
    )
    assert design == 1.0
    assert (low, high) == median_interval(ratios, seed=1, options=OPTIONS)
    assert low is not None and low > 1.01 and p_value is not None and p_value < 0.001
    # as two units (no calibration) the same pairs cannot pass a test at all
    assert signed_rank_p([float(np.median(b)) for b in blocks]) == 0.5


def test_the_design_effect_follows_the_calibrated_bound() -> None:
    blocks = _blocks([0.0, 0.0, 0.0], pairs=8, sd=0.01, seed=2)
    anova = block_anova(blocks)
    assert anova is not None and anova.within_variance is not None
    within = anova.within_variance
    tau = math.sqrt(within)  # a process pair adds as much as the pairs spread: rho = 1/2
    low, high, _, design = design_effect_interval(blocks, prior_sd=tau, seed=3, options=OPTIONS)
    assert design == pytest.approx(1 + (8 - 1) * 0.5)
    plain_low, plain_high = median_interval([r for b in blocks for r in b], seed=3, options=OPTIONS)
    centre = math.log(float(np.median([r for b in blocks for r in b])))
    assert low is not None and high is not None and plain_low is not None and plain_high is not None
    assert centre - math.log(low) == pytest.approx(
        (centre - math.log(plain_low)) * math.sqrt(design)
    )
    assert math.log(high) - centre == pytest.approx(
        (math.log(plain_high) - centre) * math.sqrt(design)
    )


def test_process_pairs_that_differ_more_than_the_calibration_allows_widen_the_interval() -> None:
    """A host noisier than its calibration: the run's own process pairs (F test) take over."""
    blocks = _blocks([0.0, 0.05, -0.04, 0.06, -0.05, 0.03], pairs=4, sd=0.003, seed=4)
    _, _, _, calibrated = design_effect_interval(blocks, prior_sd=0.0, seed=5, options=OPTIONS)
    assert calibrated > 3.5  # close to the 4 pairs of each process pair: each counts as one


def test_a_summary_on_a_calibrated_host_says_so_and_recomputes() -> None:
    noise = HostNoise(
        process_pair_sd=0.0, process_pair_sd_upper=0.002, pair_sd=0.01, process_pairs=20, pairs=240
    )
    records = _blocked_records(6, seed=6)
    calibrated = summarize(records, baseline="base", provenances=[provenance(noise=noise)])
    plain = summarize(records, baseline="base", provenances=[provenance()])
    (comparison,) = calibrated.comparisons
    assert comparison.design_effect is not None and comparison.unit == "pair"
    assert comparison.verdict == "faster" and comparison.blocks == 2
    assert calibrated.settings.process_blocks is not None
    assert calibrated.settings.process_blocks.unit.startswith("pair, with the design effect")
    # the same records on an uncalibrated host: two process pairs decide nothing
    assert plain.comparisons[0].verdict == "inconclusive"
    assert plain.comparisons[0].design_effect is None


def _noise(process_sd_upper: float, pair_sd: float = 0.01) -> HostNoise:
    return HostNoise(
        process_pair_sd=0.0,
        process_pair_sd_upper=process_sd_upper,
        pair_sd=pair_sd,
        process_pairs=20,
        pairs=240,
        load_s=8.0,
        cell_s_per_token=0.75 / 16384,
        contexts=[16384],
    )


def test_the_block_length_is_the_cheapest_for_the_calibrated_noise() -> None:
    # quiet: as few blocks as the check allows
    length, why = block_length(24, contexts=[16384], variants=3, noise=_noise(0.0))
    assert length == 24 // MIN_CALIBRATED_BLOCKS
    assert why.startswith("12 rounds per process from this host's calibration")
    # rho = 0.0025^2 / (0.0025^2 + 0.01^2) = 5.9%; S = 8 + 3 x 0.75, c = 3 x 0.75
    rho = 0.0025**2 / (0.0025**2 + 0.01**2)
    best = math.sqrt((8 + 2.25) * (1 - rho) / (rho * 2.25))
    length, why = block_length(24, contexts=[16384], variants=3, noise=_noise(0.0025))
    assert length == math.ceil(24 / round(24 / best)) and f"= {best:.1f} rounds" in why
    # as noisy between processes as within: a fresh process nearly every round
    length, _ = block_length(24, contexts=[16384], variants=3, noise=_noise(0.02))
    assert length <= 2


def test_calibration_sums_centre_each_comparison_on_its_own_mean() -> None:
    """A planted 10% effect is the same in every run: it adds nothing between process pairs."""
    rng = np.random.default_rng(7)
    runs = []
    for run in range(6):
        records = []
        for round_ in range(6):
            for variant, effect in (("a", 1.0), ("b", 1.0), ("p", 0.9)):
                tps = 1000 * effect * float(np.exp(rng.normal(0, 0.01)))
                records.append(
                    record(
                        run_id=f"r-{run}",
                        variant=variant,
                        round=round_,
                        prompt_sha256=f"{run:032x}{round_:032x}",
                        prefill_tps=tps,
                        prefill_s=64 / tps,
                        process=1,
                    )
                )
        runs.append(records)
    sums = calibration_sums(runs, baseline="a")
    assert sums is not None and (sums.df_between, sums.df_within) == (10, 60)
    noise = noise_of(sums)
    assert noise is not None and noise.process_pair_sd_upper < 0.01
    assert noise.pair_sd == pytest.approx(0.01 * math.sqrt(2), rel=0.3)


def test_merged_calibrations_add_their_variance_sums() -> None:
    sums = VarianceSums(ss_between=0.001, df_between=9, ss_within=0.01, df_within=100, m0=11.0)
    one = HostCalibration.model_validate(calibration_sample()).model_copy(
        update={"variance": sums, "noise": noise_of(sums)}
    )
    other_jobs = [job.model_copy(update={"seed": job.seed + 100}) for job in one.jobs]
    merged = merge_calibrations([one, one.model_copy(update={"jobs": other_jobs})])
    assert merged.variance == sums + sums
    assert merged.noise == noise_of(
        sums + sums, contexts=one.contexts, model=one.model, calibrated_at=merged.created_at
    )


def test_a_large_effect_in_two_process_pairs_is_significant_on_a_calibrated_host() -> None:
    """As on the H200 end to end: 12 pairs in two process pairs, an 8% effect, quiet pairs
    (0.5%) and a calibrated bound of 0.57% per process pair: the design effect is large (about
    3.9), yet an effect of many times the bound must still be told from 1 (a rank test divided by
    the design effect could never pass here)."""
    blocks = _blocks([math.log(1.08), math.log(1.08)], pairs=6, sd=0.005, seed=12)
    anova = block_anova(blocks)
    assert anova is not None and (anova.p_value() or 0) > 0.05  # within the calibration
    low, high, p_value, design = design_effect_interval(
        blocks, prior_sd=0.0057, seed=9, options=OPTIONS
    )
    assert design > 3
    assert p_value is not None and p_value < 1e-4
    assert low is not None and high is not None and 1.05 < low < 1.08 < high < 1.12
    # no effect at all stays far from significant
    null = _blocks([0.0, 0.0], pairs=6, sd=0.005, seed=10)
    _, _, p_null, _ = design_effect_interval(null, prior_sd=0.0057, seed=9, options=OPTIONS)
    assert p_null is not None and p_null > 0.05
    # two process pairs 2% apart, far beyond the calibration: they are the only two units left
    apart = _blocks([math.log(1.08), math.log(1.08) + 0.02], pairs=6, sd=0.005, seed=8)
    _, _, p_apart, design_apart = design_effect_interval(
        apart, prior_sd=0.0057, seed=9, options=OPTIONS
    )
    assert design_apart > 5 and p_apart is not None and p_apart > 1e-3


def _blocked_records(length: int, seed: int = 8) -> list[Record]:
    """12 rounds of base and a 3% faster variant, a fresh process pair every `length` rounds."""
    rng = np.random.default_rng(seed)
    records = []
    for round_ in range(12):
        for variant, effect in (("base", 1.0), ("fast", 1.03)):
            tps = 1000 * effect * float(np.exp(rng.normal(0, 0.005)))
            records.append(
                record(
                    variant=variant,
                    round=round_,
                    order=round_,
                    prompt_sha256=f"{round_:064x}",
                    prefill_tps=tps,
                    prefill_s=64 / tps,
                    process=1 + round_ // length,
                )
            )
    return records


@pytest.mark.parametrize("calibrated", [True, False])
def test_the_report_says_which_block_length_it_used_and_why(calibrated: bool) -> None:
    """summary.md and the evidence page (report.html) both name the blocks' length and the rule
    that chose it, and explain the statistics that length was analysed with."""
    noise = _noise(0.002) if calibrated else None
    spec = build_job_spec(
        {"variants": [{"name": "base"}, {"name": "fast"}], "contexts": [64], "rounds": 12}
    )
    length, rule = process_blocks(spec, variants=2, noise=noise)
    records = _blocked_records(length)
    timeline = Timeline(
        run_id="r-1",
        started_at=START - timedelta(seconds=5),
        ended_s=60.0,
        rounds_per_process=length,
        block_rule=rule,
        first_cell_s=5.0,
        blocks=[BlockStart(block=0, began_s=0.0, load_s=1.0, warmups_s=1.0)],
    )
    files, summary = build_bundle(
        records=records,
        provenances=[provenance(noise=noise)],
        baseline="base",
        n_resamples=200,
        timelines=[timeline],
    )
    if calibrated:
        assert length == 6
        assert rule.startswith("6 rounds per process from this host's calibration (a process ")
        assert "rounds a block cost least" in rule
        read = "the test is a t test of the median log ratio"
        caveat = "the interval and test count every pair with the design effect"
    else:
        assert length == 1
        assert rule == (
            "1 round per process: rounds // 12, at least 1 (no host calibration: at least 12 "
            "process pairs, or a fresh process every round below 24 rounds)"
        )
        read = "the test ranks the process pairs' median ratios"
        caveat = None
    page = html.unescape(files["report.html"].decode())
    for text in (files["summary.md"].decode(), page):
        assert f"blocks: {rule}." in text
        assert read in text
        assert (caveat in text) if caveat else "Only 1" not in text
    assert ("t test's p-value" in page) == calibrated
