from __future__ import annotations

import json
import math

import numpy as np
import pytest

from coldbench.evidence.analysis.stats import (
    CellIndex,
    Looks,
    StatsOptions,
    compare_matrix,
    decide,
    look_rounds,
    trimmed_estimate,
    units_for_verdict,
)
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.canonical import canonical_json
from coldbench.evidence.contract.schemas import JobSpec
from tests.evidence.builders import record, simulate_run

FAST = StatsOptions(n_resamples=200)


def _matrix(records, *, contexts=(256,), options=FAST, baseline="base"):
    variants = list(dict.fromkeys(r.variant for r in records))
    comparisons, _ = compare_matrix(
        CellIndex.of(records),
        variants=variants,
        baseline=baseline,
        contexts=contexts,
        metric="prefill_tps",
        options=options,
    )
    return comparisons


def test_a_a_false_positive_rate_is_at_or_below_nominal() -> None:
    from scipy import stats as scipy_stats

    verdicts = []
    for seed in range(400):
        records = simulate_run(
            effects={"base": 1.0, "same": 1.0}, contexts=(256,), rounds=12, noise=0.02, seed=seed
        )
        verdicts.append(
            _matrix(records, options=StatsOptions(n_resamples=200, seed=seed))[0].verdict
        )
    false_positives = sum(v in ("faster", "slower") for v in verdicts)
    # The nominal rate is 5% for one comparison: Monte Carlo noise alone may put 400 jobs above
    # it, but not the interval of the rate wholly above.
    found = scipy_stats.binomtest(false_positives, len(verdicts)).proportion_ci()
    assert found.low <= 0.05 and false_positives / len(verdicts) <= 0.075
    # With 2% noise per cell and 12 pairs the interval mostly rules out changes beyond +-5%.
    with_five = [
        _matrix(
            simulate_run(
                effects={"base": 1.0, "same": 1.0}, contexts=(256,), rounds=12, noise=0.02, seed=s
            ),
            options=StatsOptions(precision=0.05, seed=s),
        )[0].verdict
        for s in range(40)
    ]
    assert with_five.count("no established change") / len(with_five) >= 0.85


def test_five_percent_shift_with_two_percent_noise_over_twelve_rounds_is_faster() -> None:
    for seed in range(20):
        records = simulate_run(
            effects={"base": 1.0, "fast": 1.05}, contexts=(256,), rounds=12, noise=0.02, seed=seed
        )
        (comparison,) = _matrix(records)
        assert comparison.verdict == "faster", (seed, comparison)
        assert comparison.ci_low > 1 and comparison.n == 12
        assert comparison.ci_low < comparison.ratio_median < comparison.ci_high
        assert 1.02 < comparison.ratio_median < 1.08


def test_slower_variant_is_slower() -> None:
    records = simulate_run(effects={"base": 1.0, "slow": 0.9}, contexts=(256,), rounds=8, seed=3)
    (comparison,) = _matrix(records)
    assert comparison.verdict == "slower" and comparison.ci_high < 1


def test_the_verdict_is_what_the_interval_shows_at_the_matrix_level() -> None:
    """Six pairs all about 10% faster: faster alone and in a matrix of three (the rank test
    could never pass Holm there); the interval printed is the one the verdict reads, at level
    1 - 0.05 / 3, and the adjusted p-value is below 0.05 exactly where it excludes 1."""
    effects = {"base": 1.0, "fast": 1.10}
    (single,) = _matrix(simulate_run(effects=effects, contexts=(256,), rounds=6, noise=0.002))
    assert single.verdict == "faster" and single.ci_low > 1
    assert single.interval_level == pytest.approx(0.95)
    matrix = _matrix(
        simulate_run(effects=effects, contexts=(64, 128, 256), rounds=6, noise=0.002),
        contexts=(64, 128, 256),
    )
    for comparison in matrix:
        assert comparison.interval_level == pytest.approx(1 - 0.05 / 3)
        assert comparison.verdict == "faster" and comparison.ci_low > 1
        assert comparison.p_adjusted == pytest.approx(min(1.0, 3 * comparison.p_value))
        assert comparison.p_adjusted < 0.05


def test_adjusted_p_and_interval_agree_on_every_comparison() -> None:
    for seed in range(30):
        records = simulate_run(
            effects={"base": 1.0, "a": 1.01, "b": 0.99}, contexts=(64, 256), rounds=8, seed=seed
        )
        for c in _matrix(records, contexts=(64, 256), options=StatsOptions(seed=seed)):
            excludes = c.ci_low > 1 or c.ci_high < 1
            assert excludes == (c.p_adjusted < 0.05), c
            assert (c.verdict in ("faster", "slower")) == excludes


@pytest.mark.parametrize(
    ("n", "low", "high", "verdict"),
    [
        (12, 1.01, 1.08, "faster"),
        (12, 0.90, 0.97, "slower"),
        (12, 0.985, 1.015, "no established change"),
        (12, 0.97, 1.03, "inconclusive"),  # includes 1 but wider than +-2%
        (2, 1.01, 1.08, "inconclusive"),  # too few units
        (12, None, None, "inconclusive"),
    ],
)
def test_verdict_rules(n, low, high, verdict) -> None:
    assert decide(n, low, high, StatsOptions()) == verdict
    assert decide(12, 0.97, 1.03, StatsOptions(precision=0.05)) == "no established change"


def test_one_gross_outlier_in_a_hundred_cells_does_not_hide_a_five_percent_effect() -> None:
    """A cell 5x slow on either side moves the trimmed mean of the units not at all."""
    found = 0
    for seed in range(20):
        records = simulate_run(
            effects={"base": 1.0, "slow": 0.95}, contexts=(256,), rounds=24, noise=0.01, seed=seed
        )
        rng = np.random.default_rng(seed)
        stalled = set(rng.choice(len(records), size=max(1, len(records) // 100), replace=False))
        records = [
            r.model_copy(update={"prefill_tps": r.prefill_tps / 5}) if i in stalled else r
            for i, r in enumerate(records)
        ]
        (row,) = _matrix(records)
        found += row.verdict == "slower"
    assert found == 20


def test_trimmed_estimate_is_yuens() -> None:
    logs = [0.1, -0.2, 0.05, 0.3, 0.0, 2.0, -0.1, 0.02, 0.04, 0.06]
    estimate = trimmed_estimate(logs)
    assert estimate is not None and estimate.trimmed == 2 and estimate.df == 4
    kept = sorted(logs)[2:-2]
    assert estimate.centre == pytest.approx(sum(kept) / len(kept))
    winsorized = np.clip(logs, sorted(logs)[2], sorted(logs)[-3])
    sw = float(np.std(winsorized, ddof=1))
    assert estimate.se == pytest.approx(math.sqrt(9 * sw**2 / (6 * 5)))
    low, high = estimate.interval(0.95)
    from scipy import stats as scipy_stats

    q = scipy_stats.t.ppf(0.975, 4)
    assert math.log(high) == pytest.approx(estimate.centre + q * estimate.se)
    assert math.log(low) == pytest.approx(estimate.centre - q * estimate.se)
    assert trimmed_estimate([0.1]) is None
    assert units_for_verdict() == 10  # two units set aside at each end


def test_looks_double_to_the_budget_and_spend_alpha_by_the_square_of_information() -> None:
    looks = look_rounds(10, 40)
    assert looks == Looks((10, 20, 40))
    shares = [looks.alpha_at(k, 0.05) for k in range(3)]
    assert shares == pytest.approx([0.05 / 16, 0.05 * 3 / 16, 0.05 * 12 / 16])
    assert sum(shares) == pytest.approx(0.05)
    assert look_rounds(10, 40, block=3).rounds == (12, 24, 40)
    assert Looks((10,)).alpha_at(0, 0.05) == pytest.approx(0.05)
    assert looks.taken(9) is None and looks.taken(25) == 1 and looks.taken(40) == 2


def test_wide_interval_is_inconclusive_with_the_rounds_needed() -> None:
    needed = []
    for seed in range(20):
        records = simulate_run(
            effects={"base": 1.0, "same": 1.0}, contexts=(256,), rounds=6, noise=0.10, seed=seed
        )
        (comparison,) = _matrix(records, options=StatsOptions(n_resamples=200, seed=seed))
        if comparison.verdict == "inconclusive":
            assert comparison.rounds_needed >= 7
            needed.append(comparison.rounds_needed)
    assert len(needed) >= 18
    # Log-ratio spread about 0.14: a +-2% t interval needs some hundreds of rounds.
    assert 100 <= sorted(needed)[len(needed) // 2] <= 2000


def test_too_few_pairs_is_inconclusive() -> None:
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.2}, contexts=(256,), rounds=2, noise=0.001
    )
    (comparison,) = _matrix(records)
    assert comparison.n == 2 and comparison.verdict == "inconclusive"
    assert comparison.rounds_needed == units_for_verdict()


def test_invalid_cells_are_excluded_and_counted_per_reason() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, contexts=(256,), rounds=8)
    invalid = [
        record(
            variant="fast",
            round=8,
            context_tokens=256,
            prompt_tokens=256,
            status="invalid",
            reason="silent no-op: prefill_step_size",
        ),
        record(
            variant="fast",
            round=9,
            context_tokens=256,
            prompt_tokens=256,
            status="invalid",
            reason="silent no-op: prefill_step_size",
        ),
        record(
            variant="fast",
            round=10,
            context_tokens=256,
            prompt_tokens=256,
            cached_tokens=32,
            status="invalid",
            reason="cached_tokens=32",
        ),
        record(variant="base", round=8, context_tokens=256, prompt_tokens=256),
    ]
    summary = summarize(records + invalid, baseline="base", n_resamples=200)
    assert summary.invalid.total == 3
    assert summary.invalid.by_reason == {
        "silent no-op: prefill_step_size": 2,
        "cached_tokens=32": 1,
    }
    assert summary.comparisons[0].n == 8  # the lone base cell of round 8 has no partner
    assert summary.warmups == 1


def test_pairs_with_different_prompts_are_dropped_and_counted() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, contexts=(256,), rounds=7)
    victim = next(r for r in records if r.variant == "fast" and r.round == 2)
    victim.prompt_sha256 = "f" * 64
    summary = summarize(records, baseline="base", n_resamples=200)
    assert summary.comparisons[0].n == 6
    assert summary.invalid.pairs_with_different_prompts == 1


def test_summary_is_deterministic_json_with_the_contract_keys() -> None:
    spec = JobSpec.model_validate(
        {
            "variants": [{"name": "base"}, {"name": "fast"}],
            "contexts": [64, 256],
            "rounds": 3,
            "seed": 7,
        }
    )
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=6)
    first = summarize(records, spec=spec, n_resamples=300)
    again = summarize(records, spec=spec, n_resamples=300)
    assert canonical_json(first.to_json_value()) == canonical_json(again.to_json_value())
    assert first.settings.correction.startswith("bonferroni")
    assert first.settings.bootstrap.seed == 7 and "trimmed" in first.settings.interval
    required = {
        "context_tokens",
        "variant",
        "baseline",
        "n",
        "ratio_median",
        "ci_low",
        "ci_high",
        "p_adjusted",
        "verdict",
    }
    value = first.to_json_value()
    for key in ("comparisons", "decode_comparisons"):
        assert len(value[key]) == 2
        for comparison in value[key]:
            assert required <= set(comparison)
            assert comparison["verdict"] in {
                "faster",
                "slower",
                "no established change",
                "inconclusive",
            }
    assert first.ablation is None and first.reproductions is None
    json.dumps(value, allow_nan=False)


def test_summary_without_spec_or_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline"):
        summarize([])


def test_decode_is_compared_separately() -> None:
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.0},
        decode_effects={"base": 1.0, "fast": 0.8},
        contexts=(256,),
        rounds=8,
    )
    summary = summarize(records, baseline="base", n_resamples=200, precision=0.05)
    assert summary.comparisons[0].verdict == "no established change"
    assert summary.decode_comparisons[0].verdict == "slower"
    row = next(d for d in summary.descriptive if d.variant == "fast")
    assert row.n == 8 and row.decode_tps.median < 45
    assert row.prefill_tps.q1 <= row.prefill_tps.median <= row.prefill_tps.q3
    assert row.peak_memory_bytes.max == 256 * 1000 + 17 * 4


def test_order_statistic_interval_interpolates_to_the_level() -> None:
    from coldbench.evidence.analysis.stats import order_statistic_interval

    assert order_statistic_interval([5, 1, 4, 2, 3], 0.95) == (1, 5)  # too few: the range
    low, high = order_statistic_interval(list(range(1, 7)), 0.95)
    assert low == pytest.approx(1.357, abs=1e-3) and high == pytest.approx(5.643, abs=1e-3)
    low, high = order_statistic_interval(list(range(1, 13)), 0.95)
    assert 3 < low < 4 and 9 < high < 10


def test_median_interval_covers_about_95_percent_with_six_pairs() -> None:
    import numpy as np

    from coldbench.evidence.analysis.stats import median_interval

    rng = np.random.default_rng(1)
    options = StatsOptions(n_resamples=100)
    covered = 0
    for draw in range(1000):
        ratios = np.exp(rng.normal(0, 0.03, size=6))
        low, high = median_interval(ratios.tolist(), seed=draw, options=options)
        covered += low <= 1 <= high
    assert 0.93 <= covered / 1000 <= 0.99


def _with_processes(
    records, rounds_per_process: int, offsets: dict[str, list[float]] | None = None
):
    """The records as if each variant ran in a fresh process every `rounds_per_process` rounds,
    each process slowed or sped by `offsets[variant][block]` (a factor on tok/s)."""
    out = []
    for r in records:
        if r.round < 0:
            out.append(r)
            continue
        block = r.round // rounds_per_process
        factor = (offsets or {}).get(r.variant, [1.0] * 100)[block]
        out.append(
            r.model_copy(update={"process": block + 1, "prefill_tps": r.prefill_tps * factor})
        )
    return out


def test_one_pair_per_process_pair_gives_the_per_round_numbers() -> None:
    records = simulate_run(effects={"base": 1.0, "cand": 1.03}, contexts=(256,), rounds=12, seed=5)
    (plain,) = _matrix(records)
    (blocked,) = _matrix(_with_processes(records, 1))
    for key in ("n", "ratio_median", "ci_low", "ci_high", "p_value", "p_adjusted", "verdict"):
        assert getattr(blocked, key) == getattr(plain, key), key
    assert "blocks" not in plain.model_fields_set
    assert "block" not in plain.ratios[0].model_fields_set
    assert blocked.blocks == 12 and blocked.unit == "process pair"
    assert [r.block for r in blocked.ratios] == list(range(12))


def test_a_process_offset_is_not_called_an_effect_once_blocks_are_known() -> None:
    # A/A, 24 rounds: the candidate's first processes ran 2% slow, the later ones 1% fast.
    # Per round (one process per variant, as before rotation) the offset looks like an effect.
    records = simulate_run(
        effects={"base": 1.0, "cand": 1.0}, contexts=(256,), rounds=24, noise=0.004, seed=2
    )
    one_process = [
        r.model_copy(update={"prefill_tps": r.prefill_tps * 0.98}) if r.variant == "cand" else r
        for r in records
    ]
    (per_round,) = _matrix(one_process)
    assert per_round.verdict == "slower"
    offsets = {"cand": [0.98, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99], "base": [1.0] * 8}
    (clustered,) = _matrix(_with_processes(records, 3, offsets))
    assert clustered.blocks == 8 and clustered.n == 24
    assert clustered.verdict in ("no established change", "inconclusive")
    assert clustered.ci_low < 1 < clustered.ci_high
    # The between-process spread of the ratio is reported: about the offsets' SD (1.5%).
    assert 0.008 < clustered.process_sd < 0.025
    # Treating the same 24 pairs as independent would have called it.
    flat = [r.model_copy(update={"process": None}) for r in _with_processes(records, 3, offsets)]
    (naive,) = _matrix(flat)
    assert naive.ci_high - naive.ci_low < clustered.ci_high - clustered.ci_low


def test_a_real_effect_is_still_found_with_process_blocks() -> None:
    records = simulate_run(
        effects={"base": 1.0, "cand": 0.95}, contexts=(256,), rounds=24, noise=0.01, seed=8
    )
    offsets = {"cand": [1.004, 0.996] * 6, "base": [0.997, 1.003, 1.0] * 4}
    (row,) = _matrix(_with_processes(records, 2, offsets))
    assert row.blocks == 12 and row.verdict == "slower" and row.ci_high < 1


def test_too_few_process_pairs_is_inconclusive_with_rounds_at_that_block_length() -> None:
    records = simulate_run(effects={"base": 1.0, "cand": 0.9}, contexts=(256,), rounds=8, seed=1)
    (row,) = _matrix(_with_processes(records, 4))  # 2 blocks of 4 rounds
    assert row.blocks == 2 and row.verdict == "inconclusive"
    assert row.rounds_needed is not None and row.rounds_needed % 4 == 0
    assert row.rounds_needed >= 4 * 6
    (single,) = _matrix(_with_processes(records, 8))  # one process pair for the whole run
    assert single.ci_low is None and single.verdict == "inconclusive"


def test_summary_of_rotated_processes_states_its_noise_floor_and_drift_per_context() -> None:
    from coldbench.evidence.rendering.markdown import render_summary_md
    from coldbench.evidence.rendering.report import render_report_html
    from tests.evidence.builders import provenance

    records = simulate_run(
        effects={"base": 1.0, "fast": 1.05}, contexts=(64, 256), rounds=12, noise=0.01, seed=4
    )
    old = summarize(records, baseline="base", n_resamples=200)
    assert "noise_floor" not in old.model_fields_set
    assert "process_blocks" not in old.settings.model_fields_set
    assert all("by_context" not in run.model_fields_set for run in old.drift.runs)
    rotated = _with_processes(records, 2)
    summary = summarize(rotated, baseline="base", n_resamples=200)
    floor = summary.noise_floor
    assert floor.process_pairs == 6 and floor.rounds_per_process_pair == 2
    assert 0 < floor.between_process_sd < 0.05 and 0 < floor.resolvable < 0.05
    assert summary.settings.process_blocks.unit.startswith("process pair")
    (run,) = summary.drift.runs
    assert [c.context_tokens for c in run.by_context] == [64, 256]
    assert all(c.n == 12 for c in run.by_context)
    text = render_summary_md(summary, [provenance()])
    assert "Noise floor: 6 process pairs of 2 rounds each" in text
    assert "  - 64 tokens: " in text and "the independent unit is the process pair" in text
    html = render_report_html(summary, rotated, [provenance()], None)
    assert 'id="noise-floor"' in html and "the independent unit is the process pair" in html
    assert "r-1 @ 256" in html
    assert "Noise floor" not in render_summary_md(old, [provenance()])


def test_inert_flags_are_listed_per_context_and_variant() -> None:
    from coldbench.evidence.rendering.markdown import render_summary_md
    from coldbench.evidence.rendering.report import render_report_html

    records = simulate_run(effects={"base": 1.0, "wide": 1.0}, contexts=(64, 4096), rounds=6)
    # `wide` asked for 4096-token chunks: stock's single chunk at 64 tokens, not at 4096.
    records = [
        r.model_copy(update={"counters": {**r.counters, "inert": "prefill_step_size"}})
        if r.variant == "wide" and r.context_tokens == 64
        else r
        for r in records
    ]
    summary = summarize(records, baseline="base", n_resamples=200)
    inert = {(d.context_tokens, d.variant): d.inert for d in summary.descriptive}
    assert inert == {
        (64, "base"): [],
        (64, "wide"): ["prefill_step_size"],
        (4096, "base"): [],
        (4096, "wide"): [],
    }
    sentence = "64 tokens: wide (prefill_step_size): at this context the request implies"
    markdown = render_summary_md(summary, [])
    assert "Inert flags per context:" in markdown and f"- {sentence}" in markdown
    assert "4096 tokens:" not in markdown
    html = render_report_html(summary, records, [], None)
    assert '<ul id="inert"><li>' + sentence in html


def test_a_row_with_no_valid_pair_says_so_and_why() -> None:
    from coldbench.evidence.rendering.markdown import render_summary_md

    records = simulate_run(effects={"base": 1.0, "noop": 1.0}, contexts=(64, 128), rounds=6)
    # every `noop` cell at 128 was invalid; at 64 they are fine
    records = [
        r.model_copy(update={"status": "invalid", "reason": "silent no-op: prefill_step_size"})
        if r.variant == "noop" and r.context_tokens == 128
        else r
        for r in records
    ]
    summary = summarize(records, baseline="base", n_resamples=200)
    by_context = {c.context_tokens: c for c in summary.comparisons}
    assert (
        by_context[64].verdict != "no valid pairs" and "why" not in by_context[64].model_fields_set
    )
    row = by_context[128]
    assert row.verdict == "no valid pairs" and row.n == 0
    assert row.why == "no valid cell of noop (6 x silent no-op: prefill_step_size)"
    assert row.rounds_needed is None
    assert summary.decode_comparisons[1].verdict == "no valid pairs"
    markdown = render_summary_md(summary, [])
    assert "no valid pairs: no valid cell of noop (6 x silent no-op: prefill_step_size)" in markdown
    # no cell of the variant at 128 at all, and the baseline's all errors there
    records = [
        r.model_copy(update={"status": "error", "reason": "RuntimeError: boom"})
        if r.variant == "base" and r.context_tokens == 128
        else r
        for r in records
        if not (r.variant == "noop" and r.context_tokens == 128)
    ]
    summary = summarize(records, baseline="base", n_resamples=200)
    assert summary.comparisons[1].why == (
        "no valid cell of noop (none measured); no valid cell of base (6 x RuntimeError: boom)"
    )


@pytest.mark.parametrize("units", [3, 6, 12])
def test_the_interval_holds_its_level_with_few_units(units: int) -> None:
    """A t interval of three, six or twelve units covers its ratio about 95% of the time (the
    level is the one it states); below three units there is no interval at all."""
    rng = np.random.default_rng(units)
    covered = 0
    for _ in range(2000):
        estimate = trimmed_estimate(rng.normal(0.0, 0.02, size=units).tolist())
        assert estimate is not None
        low, high = estimate.interval(0.95)
        covered += low <= 1 <= high
    assert 0.93 <= covered / 2000 <= 0.97
    (row,) = _matrix(simulate_run(effects={"base": 1.0, "cand": 0.9}, contexts=(256,), rounds=2))
    assert row.ci_low is None and row.verdict == "inconclusive"


def test_the_noise_floor_states_no_resolvable_effect_from_too_few_process_pairs() -> None:
    from coldbench.evidence.rendering.markdown import noise_floor_text

    records = simulate_run(effects={"base": 1.0, "cand": 0.99}, contexts=(256,), rounds=12)
    summary = summarize(_with_processes(records, 6), baseline="base", n_resamples=200)
    floor = summary.noise_floor
    assert floor.process_pairs == 2 and summary.comparisons[0].ci_low is None
    assert floor.resolvable is None
    assert noise_floor_text(summary) == (
        "Noise floor: 2 process pairs of 6 rounds each; the ratio varied by "
        f"{100 * floor.between_process_sd:.2f}% (SD) from one process pair to the next; too few "
        "process pairs for a 95% interval (3 are needed), so no resolvable effect is stated."
    )


def test_reproductions_without_intervals_establish_no_disagreement() -> None:
    from coldbench.evidence.analysis.reproduction import reproduction_section

    first = simulate_run(effects={"base": 1.0, "cand": 0.9}, contexts=(256,), rounds=2, seed=1)
    second = simulate_run(
        effects={"base": 1.0, "cand": 1.0}, contexts=(256,), rounds=2, seed=2, run_id="r-2"
    )
    section = reproduction_section(
        CellIndex.of(first + second),
        run_ids=["r-1", "r-2"],
        hosts={},
        variants=["base", "cand"],
        baseline="base",
        contexts=[256],
        options=FAST,
    )
    (row,) = section.comparisons
    assert all(r.ci_low is None for r in row.runs) and row.agree is None
    assert row.test is None and row.statement.startswith("not tested:")
    assert section.all_agree  # untested is no disagreement


def test_rounds_to_detect_a_large_change_are_far_fewer_than_for_the_precision() -> None:
    """A 57% slowdown with a wide spread: detecting it takes a few more units, a +-2% interval
    many; no change observed has nothing to detect."""
    from coldbench.evidence.analysis.stats import rounds_needed, rounds_to_detect

    options = StatsOptions()
    ratios = [0.31, 0.82, 0.40, 0.45, 0.38, 0.52, 0.47, 0.35]
    estimate = trimmed_estimate([math.log(r) for r in ratios])
    detect = rounds_to_detect(estimate, 0.95)
    needed = rounds_needed(estimate, options, 0.95)
    assert detect is not None and needed is not None
    assert len(ratios) < detect <= 12 and needed > 5 * detect
    assert rounds_to_detect(trimmed_estimate([0.1, -0.1, 0.0, 0.2, -0.2]), 0.95) is None


def test_a_calibration_sets_gross_outliers_aside() -> None:
    """One cell 5x slow among 240 pairs would multiply a calibration's within-process variance;
    set aside, the sums are those of the clean records."""
    from coldbench.evidence.analysis.stats import calibration_sums

    records = simulate_run(
        effects={"base": 1.0, "same": 1.0}, contexts=(256,), rounds=24, noise=0.01, seed=3
    )
    blocked = _with_processes(records, 4)
    clean = calibration_sums([blocked], baseline="base")
    stalled = [
        r.model_copy(update={"prefill_tps": r.prefill_tps / 5})
        if (r.variant, r.round) == ("same", 5)
        else r
        for r in blocked
    ]
    robust = calibration_sums([stalled], baseline="base")
    assert clean is not None and robust is not None
    assert robust.within_variance == pytest.approx(clean.within_variance, rel=0.25)
    assert robust.df_within == clean.df_within - 1
