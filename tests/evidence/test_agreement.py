"""The hosts' agreement: a test of their difference, not whether their intervals overlap."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from coldbench.evidence.analysis.agreement import HostResult, host_agreement, log_standard_error


def _host(name: str, ratio: float, low: float, high: float, level: float | None = None):
    return HostResult(host=name, ratio_median=ratio, ci_low=low, ci_high=high, ci_level=level)


def test_overlapping_intervals_can_still_be_hosts_that_differ() -> None:
    """1.000 [0.980, 1.020] and 1.035 [1.015, 1.055] overlap, yet their difference (3.4%,
    whose interval is sqrt(2), not 2, times one interval's half-width) is established."""
    a = _host("h100", 1.0, 0.98, 1.02)
    b = _host("h200", 1.035, 1.015, 1.055)
    assert b.ci_low < a.ci_high  # the old rule said: agree
    (outcome,) = host_agreement([[a, b]])
    assert outcome.agree is False
    assert outcome.statement == "hosts disagree: h100 +0.0% [-2.0, 2.0], h200 +3.5% [1.5, 5.5]"
    (difference,) = outcome.test.differences
    assert difference.ratio == pytest.approx(1.035)
    assert 1 < difference.ci_low < difference.ci_high
    # two hosts: Q is the square of the z of their log difference
    se = math.hypot(log_standard_error(0.98, 1.02, 0.95), log_standard_error(1.015, 1.055, 0.95))
    z = math.log(1.035) / se
    assert outcome.test.q == pytest.approx(z**2)
    assert outcome.test.p_value == pytest.approx(2 * stats.norm.sf(abs(z)))


def test_agreement_states_the_difference_it_rules_out() -> None:
    """Hosts that agree say within what: a noisier pair of hosts agrees within a wider bound,
    never more convincingly."""
    (quiet,) = host_agreement([[_host("a", 0.976, 0.967, 0.985), _host("b", 0.98, 0.97, 0.99)]])
    (noisy,) = host_agreement([[_host("a", 0.976, 0.90, 1.05), _host("b", 0.98, 0.91, 1.06)]])
    assert quiet.agree and noisy.agree
    assert quiet.statement == f"hosts agree within +-{quiet.test.within_pct:.1f}%"
    assert quiet.test.within_pct < 2 < 8 < noisy.test.within_pct
    (difference,) = quiet.test.differences
    assert difference.ci_low >= 1 - quiet.test.within_pct / 100 - 1e-12
    assert difference.ci_high <= 1 + quiet.test.within_pct / 100 + 1e-12


def test_three_hosts_are_one_heterogeneity_test() -> None:
    hosts = [_host("a", 1.0, 0.99, 1.01), _host("b", 1.0, 0.99, 1.01), _host("c", 1.05, 1.04, 1.06)]
    (outcome,) = host_agreement([hosts])
    logs = [math.log(h.ratio_median) for h in hosts]
    weights = [1 / log_standard_error(h.ci_low, h.ci_high, 0.95) ** 2 for h in hosts]
    mean = sum(w * y for w, y in zip(weights, logs, strict=True)) / sum(weights)
    q = sum(w * (y - mean) ** 2 for w, y in zip(weights, logs, strict=True))
    assert outcome.test.df == 2 and outcome.test.q == pytest.approx(q)
    assert outcome.test.p_value == pytest.approx(stats.chi2.sf(q, 2))
    assert outcome.test.i_squared == pytest.approx((q - 2) / q)
    assert [d.host for d in outcome.test.differences] == ["b", "c"]
    assert outcome.agree is False and "c +5.0% [4.0, 6.0]" in outcome.statement


def test_a_standard_error_is_read_at_its_interval_level_and_units() -> None:
    """A joint interval (level 1 - 0.05 / m) of 8 process pairs is a t interval of 5 df (20%
    trimmed: 6 kept): the same width is a smaller standard error than a 95% normal one's, and
    the ratio of ratios is drawn at the family's level, so with two hosts it excludes 1 exactly
    where they disagree."""
    wide = log_standard_error(0.98, 1.02, 0.95)
    joint = log_standard_error(0.98, 1.02, 1 - 0.05 / 3, units=8)
    assert joint == pytest.approx(wide * stats.norm.ppf(0.975) / stats.t.ppf(1 - 0.05 / 6, 5))
    a = HostResult("a", 1.0, 0.98, 1.02, interval_level=1 - 0.05 / 3, units=8)
    b = HostResult("b", 1.04, 1.02, 1.06, interval_level=1 - 0.05 / 3, units=8)
    outcomes = host_agreement([[a, b], [a, a], [b, b]])
    (difference,) = outcomes[0].test.differences
    assert outcomes[0].agree is (difference.ci_low <= 1 <= difference.ci_high) is False
    assert outcomes[0].test.p_adjusted == pytest.approx(3 * outcomes[0].test.p_value)


def test_hosts_of_few_units_are_tested_by_welch_not_by_a_normal_approximation() -> None:
    """Six process pairs a host (t intervals of 3 df): the normal approximation would call
    these two hosts different (z = 2.2, p = 0.03); Welch's test, with the hosts' own degrees
    of freedom, does not, and its interval of their ratio agrees with it."""
    a = HostResult("gpu-a", 0.793, 0.561, 1.120, units=6)
    b = HostResult("gpu-b", 1.122, 0.782, 1.609, units=6)
    (outcome,) = host_agreement([[a, b]])
    se_a = log_standard_error(0.561, 1.120, 0.95, units=6)
    se_b = log_standard_error(0.782, 1.609, 0.95, units=6)
    d, variance = math.log(1.122 / 0.793), se_a**2 + se_b**2
    welch_df = variance**2 / (se_a**4 / 3 + se_b**4 / 3)
    assert 2 * stats.norm.sf(d / math.sqrt(variance)) < 0.05  # what the normal test says
    assert outcome.test.p_value == pytest.approx(2 * stats.t.sf(d / math.sqrt(variance), welch_df))
    assert outcome.agree is True
    (difference,) = outcome.test.differences
    assert difference.ci_low < 1 < difference.ci_high


def test_the_comparisons_are_corrected_as_one_family() -> None:
    """A difference at p of about 0.03 is a disagreement alone, not as one of four tests."""
    borderline = [_host("a", 1.0, 0.98, 1.02), _host("b", 1.03, 1.01, 1.05)]
    same = [_host("a", 1.0, 0.98, 1.02), _host("b", 1.0, 0.98, 1.02)]
    (alone,) = host_agreement([borderline])
    assert 0.01 < alone.test.p_value < 0.05 and alone.agree is False
    outcomes = host_agreement([borderline, same, same, same])
    assert outcomes[0].test.p_adjusted == pytest.approx(4 * alone.test.p_value)
    assert outcomes[0].agree is True
    assert outcomes[1].test.q == 0 and outcomes[1].test.i_squared == 0


def test_a_host_without_a_95_percent_interval_is_not_tested() -> None:
    few = _host("laptop", 0.8, 0.7, 0.9, level=0.75)
    (outcome,) = host_agreement([[_host("studio", 1.0, 0.99, 1.01), few]])
    assert outcome.agree is None and outcome.test is None
    assert outcome.statement == "not tested: laptop without an interval (too few units)"
    (none,) = host_agreement([[_host("studio", 1.0, 0.99, 1.01), _host("cpu", 0.9, None, None)]])
    assert none.agree is None and none.statement.startswith("not tested: cpu without")
