"""Do hosts agree? A test of their difference, for one job measured on several hosts.

Each host's result at a comparison (context, variant against the baseline) is its ratio with
its interval, as its own run's statistics made them (coldbench.evidence.analysis.stats), read
through the typed fields of `Comparison` or `ReproductionRun`: `ratio_median`, `ci_low`, `ci_high`,
the interval's level (`interval_level`; the confidence level where a summary does not say) and the
independent units (`blocks`, else `n`). On the log scale a host's estimate is y = ln(ratio)
with standard error se = (ln ci_high - ln ci_low) / (2 t), t the quantile of its interval's
level with the degrees of freedom a 20%-trimmed interval of those units has (h - 1, h the
units kept): the interval's width read back as its standard error. The interval already
carries what the host's statistics knew about its noise (its process pairs), so nothing else
is needed.

- The heterogeneity test across all hosts: Cochran's Q = sum w_i (y_i - y_w)^2, w_i = 1/se_i^2,
  y_w the weighted mean, read as Welch's heteroscedastic F (Welch 1951: each host's variance is
  estimated from its own few units, so Q against chi-squared would be anti-conservative; with
  two hosts it is Welch's t test squared, with Satterthwaite's degrees of freedom; as the
  hosts' degrees of freedom grow it tends to Q against chi-squared with hosts - 1 degrees of
  freedom, which is what hosts of unknown units get). I^2 = (Q - df) / Q (at least 0), the
  share of the hosts' spread beyond what their own noise explains.
- Bonferroni over the section's comparisons, as the verdicts' intervals are (a matrix of 12
  comparisons must not find a host difference somewhere by chance): p_adjusted = min(1, m p).
- The ratio of ratios of each host to the reference host (the first): exp(y_i - y_0) with the
  interval exp((y_i - y_0) +- t sqrt(se_i^2 + se_0^2)) at the same level 1 - alpha / m (t with
  the pair's Welch-Satterthwaite degrees of freedom), so with two hosts it excludes 1 exactly
  where they disagree.

The hosts disagree where the corrected p-value is below alpha; they agree within +-X% where it
is not, X the largest distance from 1 of the ratio-of-ratios intervals (a difference larger
than X is ruled out, jointly over the comparisons at 95%; one smaller is not). A host without
an interval at its level (too few units: no interval, or `ci_level` set) is not tested.

This replaces the earlier rule that two hosts agree where their 95% intervals overlap: two
intervals can overlap while the hosts differ by more than either interval's width (the
difference's interval is only sqrt(2) times wider, not 2 times), and overlap grows more likely
the noisier the hosts, so a noisy host "agreed" with everything.

May import: `coldbench.evidence.contract.summary_schema`, scipy, the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from coldbench.evidence.contract.summary_schema import HostAgreement, HostDifference

CONFIDENCE_LEVEL = 0.95
ALPHA = 0.05
# Yuen's interval of coldbench.evidence.analysis.stats trims 20% of the units at each end (h - 1 df,
# h kept).
TRIM = 0.2
RULE = (
    "hosts disagree where Welch's test of their log ratios (Cochran's Q read as Welch's F, each "
    "host's standard error and degrees of freedom from its interval's width, level and units), "
    "Bonferroni-corrected over the comparisons, has p < 0.05; otherwise they agree within "
    "+-X%, X the largest distance from 1 of the intervals (jointly 95%) of each host's ratio "
    "over the first host's; a host without an interval is not tested"
)


@dataclass(frozen=True)
class HostResult:
    """One host's result at one comparison, as agreement reads it."""

    host: str
    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None = None
    interval_level: float | None = None  # None: the confidence level
    units: int | None = None  # None: a normal interval (large samples)


@dataclass(frozen=True)
class Outcome:
    """The test at one comparison: `agree` None where it was not tested (then `test` is None
    and `statement` says why)."""

    agree: bool | None
    test: HostAgreement | None
    statement: str


@dataclass(frozen=True)
class _Draft:
    hosts: list[str]
    logs: list[float]
    ses: list[float]
    dfs: list[float]  # each host's degrees of freedom (infinite: a normal interval)
    q: float
    df: int
    p_value: float


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - level) / 2))


def freedom(units: int | None) -> float:
    """The degrees of freedom of a host's interval: h - 1 of a 20%-trimmed interval of `units`
    (h kept), infinite (a normal interval) where the units are not known."""
    if units is None:
        return math.inf
    kept = units - 2 * math.floor(TRIM * units)
    return float(kept - 1) if kept >= 2 else math.inf


def _quantile(level: float, df: float) -> float:
    """The two-sided quantile of `level`: t with `df` degrees of freedom, normal when infinite."""
    if math.isinf(df):
        return _z(level)
    from scipy.stats import t

    return float(t.ppf(1 - (1 - level) / 2, df))


def log_standard_error(
    ci_low: float, ci_high: float, level: float, units: int | None = None
) -> float:
    """A host's standard error of its log ratio, from its interval's width and level."""
    return (math.log(ci_high) - math.log(ci_low)) / (2 * _quantile(level, freedom(units)))


def _draft(results: Sequence[HostResult], confidence_level: float) -> _Draft | str:
    # a [min, max] interval of a few units (ci_level set) gives no standard error
    missing = [
        r.host
        for r in results
        if r.ratio_median is None or r.ci_low is None or r.ci_high is None or r.ci_level
    ]
    if missing:
        return f"not tested: {', '.join(missing)} without an interval (too few units)"
    logs = [math.log(r.ratio_median) for r in results]  # type: ignore[arg-type]
    # A zero-width interval (identical ratios) would weigh infinitely: the smallest positive
    # spread instead, so equal results still give Q = 0.
    ses = [
        max(
            log_standard_error(
                r.ci_low,  # type: ignore[arg-type]
                r.ci_high,  # type: ignore[arg-type]
                r.interval_level or confidence_level,
                r.units,
            ),
            1e-12,
        )
        for r in results
    ]
    dfs = [freedom(r.units) for r in results]
    weights = [1 / se**2 for se in ses]
    total = sum(weights)
    mean = sum(w * y for w, y in zip(weights, logs, strict=True)) / total
    q = sum(w * (y - mean) ** 2 for w, y in zip(weights, logs, strict=True))
    k = len(results)
    # Welch's heteroscedastic F (1951): Cochran's Q with each host's variance estimated from
    # few units (t intervals of h - 1 df) is anti-conservative against chi-squared; Welch's
    # F corrects for it, is the Welch t test squared for two hosts, and tends to Q / (k - 1)
    # against chi-squared as the hosts' degrees of freedom grow.
    spread = sum((1 - w / total) ** 2 / df for w, df in zip(weights, dfs, strict=True))
    from scipy.stats import chi2, f

    if spread == 0:
        p_value = float(chi2.sf(q, k - 1))
    else:
        statistic = (q / (k - 1)) / (1 + 2 * (k - 2) / (k**2 - 1) * spread)
        p_value = float(f.sf(statistic, k - 1, (k**2 - 1) / (3 * spread)))
    return _Draft(
        hosts=[r.host for r in results], logs=logs, ses=ses, dfs=dfs, q=q, df=k - 1, p_value=p_value
    )


def pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def _host_text(result: HostResult) -> str:
    assert result.ratio_median is not None and result.ci_low is not None
    assert result.ci_high is not None
    low, high = (result.ci_low - 1) * 100, (result.ci_high - 1) * 100
    return f"{result.host} {pct(result.ratio_median)} [{low:.1f}, {high:.1f}]"


def _finish(
    draft: _Draft,
    results: Sequence[HostResult],
    p_adjusted: float,
    *,
    level: float,
    alpha: float,
) -> Outcome:
    differences = []
    se0, df0 = draft.ses[0], draft.dfs[0]
    for host, y, se, df in zip(
        draft.hosts[1:], draft.logs[1:], draft.ses[1:], draft.dfs[1:], strict=True
    ):
        d = y - draft.logs[0]
        # Welch-Satterthwaite degrees of freedom of the difference (infinite: normal)
        variance = se**2 + se0**2
        normal = math.isinf(df) and math.isinf(df0)
        welch = math.inf if normal else variance**2 / (se**4 / df + se0**4 / df0)
        half = _quantile(level, welch) * math.sqrt(variance)
        differences.append(
            HostDifference(
                host=host,
                reference=draft.hosts[0],
                ratio=math.exp(d),
                ci_low=math.exp(d - half),
                ci_high=math.exp(d + half),
            )
        )
    within = max(max(d.ci_high - 1, 1 - d.ci_low) for d in differences) * 100
    i_squared = max(0.0, (draft.q - draft.df) / draft.q) if draft.q > 0 else 0.0
    agree = p_adjusted >= alpha
    if agree:
        statement = f"hosts agree within +-{within:.1f}%"
    else:
        statement = "hosts disagree: " + ", ".join(_host_text(r) for r in results)
    detail = "; ".join(
        f"{d.host} / {d.reference} {d.ratio:.3f} [{d.ci_low:.3f}, {d.ci_high:.3f}]"
        for d in differences
    ) + (
        f"; Q = {draft.q:.2f}, {draft.df} df, p {_p_text(draft.p_value)}, "
        f"corrected p {_p_text(p_adjusted)}, I^2 = {100 * i_squared:.0f}%"
    )
    return Outcome(
        agree=agree,
        test=HostAgreement(
            differences=differences,
            q=draft.q,
            df=draft.df,
            p_value=draft.p_value,
            p_adjusted=p_adjusted,
            i_squared=i_squared,
            within_pct=within,
            detail=detail,
        ),
        statement=statement,
    )


def _p_text(p: float) -> str:
    return f"= {p:.2g}" if p >= 1e-4 else "< 1e-4"


def host_agreement(
    comparisons: Sequence[Sequence[HostResult]],
    *,
    confidence_level: float = CONFIDENCE_LEVEL,
    alpha: float = ALPHA,
) -> list[Outcome]:
    """The hosts' agreement at each comparison (each a sequence of at least two hosts' results,
    the reference host first), corrected as one family (Bonferroni)."""
    drafts = [_draft(results, confidence_level) for results in comparisons]
    family = max(1, sum(1 for d in drafts if isinstance(d, _Draft)))
    outcomes = []
    for draft, results in zip(drafts, comparisons, strict=True):
        if isinstance(draft, str):
            outcomes.append(Outcome(agree=None, test=None, statement=draft))
            continue
        outcomes.append(
            _finish(
                draft,
                results,
                min(1.0, draft.p_value * family),
                level=1 - alpha / family,
                alpha=alpha,
            )
        )
    return outcomes
