from __future__ import annotations

import pytest

from coldbench.evidence.analysis.summary import summarize
from tests.evidence.builders import simulate_run


def test_steady_machine_is_not_flagged() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=12, noise=0.01)
    drift = summarize(records, baseline="base", n_resamples=200).drift
    (run,) = drift.runs
    assert not drift.flagged and not run.flagged
    assert run.slope_ci_low < 0 < run.slope_ci_high


def test_drift_larger_than_the_claimed_effect_is_flagged_and_bracketing_holds() -> None:
    # The machine slows 30% per hour over a run of about 0.8 hours; the variant is 5% faster.
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.05},
        contexts=(256,),
        rounds=12,
        noise=0.005,
        drift_per_hour=-0.30,
        cell_s=120,
    )
    summary = summarize(records, baseline="base", n_resamples=500)
    drift = summary.drift
    (run,) = drift.runs
    assert run.slope_pct_per_hour == pytest.approx(-30, abs=3)
    assert run.drift_pct_across_run < -5
    assert drift.threshold_source == "smallest claimed effect"
    assert drift.flagged and run.flagged
    (bracket,) = drift.bracketing
    assert bracket.variant == "fast" and bracket.n == 12
    assert bracket.ratio_median == pytest.approx(1.05, abs=0.02)


def test_a_run_of_seconds_gets_no_hourly_rate_and_no_overflow() -> None:
    from coldbench.evidence.rendering.markdown import drift_rate_text

    # Eight seconds in which the machine doubles its speed: an hourly rate would be absurd.
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.0},
        contexts=(64,),
        rounds=8,
        cell_s=0.5,
        drift_per_hour=1e100,
    )
    (run,) = summarize(records, baseline="base", n_resamples=100).drift.runs
    assert run.flagged and run.drift_pct_across_run > 50
    assert drift_rate_text(run) == "no hourly rate (a 0-minute run)"
    steady = summarize(simulate_run(effects={"base": 1.0}, rounds=12, cell_s=120), baseline="base")
    assert drift_rate_text(steady.drift.runs[0]).endswith("]")
