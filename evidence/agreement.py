"""Do hosts agree? A test of their difference, for one job measured on several hosts.

Each host's result at a comparison (context, variant against the baseline) is its median
ratio with its 95% interval, as its own run's statistics made them (evidence.stats, read
through the typed fields of `Comparison` or `ReproductionRun`). On the log scale a host's
estimate is y = ln(ratio) with standard error se = (ln ci_high - ln ci_low) / (2 x 1.96):
the interval's width read as a normal interval's. The interval already carries what the
host's own statistics knew about its noise (process pairs, a calibrated design effect), and
it is the hull of a bootstrap and an order-statistic interval, so se tends to be too large,
never too small: the test errs toward "agree", not toward a false disagreement.

- The ratio of ratios of each host to the reference host (the first: the original evidence):
  exp(y_i - y_0) with the interval exp((y_i - y_0) +- 1.96 x sqrt(se_i^2 + se_0^2)).
- The heterogeneity test across all hosts: Cochran's Q = sum w_i (y_i - y_w)^2, w_i = 1/se_i^2,
  y_w the weighted mean, against chi-squared with hosts - 1 degrees of freedom; I^2 = (Q - df)
  / Q (at least 0), the share of the hosts' spread beyond what their own noise explains. With
  two hosts Q is the square of the z statistic of their log difference.
- Holm's correction over the section's comparisons, as the verdicts' (a matrix of 12
  comparisons must not find a host difference somewhere by chance).

The hosts disagree where the corrected p-value is below alpha; they agree within +-X% where it
is not, X the largest distance from 1 of the ratio-of-ratios intervals (a difference larger
than X is ruled out at 95%, one smaller is not). A host without a 95% interval (too few
process pairs: `ci_level` set) is not tested.

This replaces the earlier rule that two hosts agree where their 95% intervals overlap: two
intervals can overlap while the hosts differ by more than either interval's width (the
difference's interval is only sqrt(2) times wider, not 2 times), and overlap grows more likely
the noisier the hosts, so a noisy host "agreed" with everything.

May import: `evidence.summary_schema`, `evidence.stats` (Holm), scipy, the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from evidence.stats import holm
from evidence.summary_schema import HostAgreement, HostDifference

CONFIDENCE_LEVEL = 0.95
ALPHA = 0.05
RULE = (
    "hosts disagree where Cochran's Q of their log median ratios (each host's standard error "
    "from its 95% interval's width, df = hosts - 1), Holm-corrected over the comparisons, has "
    "p < 0.05; otherwise they agree within +-X%, X the largest distance from 1 of the 95% "
    "intervals of each host's ratio over the first host's; a host without a 95% interval is "
    "not tested"
)


@dataclass(frozen=True)
class HostResult:
    """One host's result at one comparison, as agreement reads it."""

    host: str
    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None = None


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
    q: float
    df: int
    p_value: float


def _z(confidence_level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - confidence_level) / 2))


def log_standard_error(ci_low: float, ci_high: float, confidence_level: float) -> float:
    """A host's standard error of its log ratio, from its interval's width."""
    return (math.log(ci_high) - math.log(ci_low)) / (2 * _z(confidence_level))


def _draft(results: Sequence[HostResult], confidence_level: float) -> _Draft | str:
    # only 95% intervals: a [min, max] interval of a few pairs gives no standard error
    missing = [
        r.host
        for r in results
        if r.ratio_median is None or r.ci_low is None or r.ci_high is None or r.ci_level
    ]
    if missing:
        return f"not tested: {', '.join(missing)} without a 95% interval (too few pairs)"
    logs = [math.log(r.ratio_median) for r in results]  # type: ignore[arg-type]
    # A zero-width interval (identical ratios) would weigh infinitely: the smallest positive
    # spread instead, so equal results still give Q = 0.
    ses = [
        max(log_standard_error(r.ci_low, r.ci_high, confidence_level), 1e-12)  # type: ignore[arg-type]
        for r in results
    ]
    weights = [1 / se**2 for se in ses]
    mean = sum(w * y for w, y in zip(weights, logs, strict=True)) / sum(weights)
    q = sum(w * (y - mean) ** 2 for w, y in zip(weights, logs, strict=True))
    df = len(results) - 1
    from scipy.stats import chi2

    return _Draft(
        hosts=[r.host for r in results],
        logs=logs,
        ses=ses,
        q=q,
        df=df,
        p_value=float(chi2.sf(q, df)),
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
    confidence_level: float,
    alpha: float,
) -> Outcome:
    z = _z(confidence_level)
    differences = []
    for host, y, se in zip(draft.hosts[1:], draft.logs[1:], draft.ses[1:], strict=True):
        d = y - draft.logs[0]
        half = z * math.sqrt(se**2 + draft.ses[0] ** 2)
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
        f"Holm p {_p_text(p_adjusted)}, I^2 = {100 * i_squared:.0f}%"
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
    the reference host first), corrected as one family."""
    drafts = [_draft(results, confidence_level) for results in comparisons]
    adjusted = holm([d.p_value if isinstance(d, _Draft) else None for d in drafts])
    outcomes = []
    for draft, results, p_adjusted in zip(drafts, comparisons, adjusted, strict=True):
        if isinstance(draft, str):
            outcomes.append(Outcome(agree=None, test=None, statement=draft))
            continue
        assert p_adjusted is not None
        outcomes.append(
            _finish(draft, results, p_adjusted, confidence_level=confidence_level, alpha=alpha)
        )
    return outcomes
