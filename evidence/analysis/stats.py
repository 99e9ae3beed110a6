"""Paired statistics over validated records, and the verdict rules of every comparison.

The bottom layer of the statistics (above only the typed summary,
`coldbench.evidence.contract.summary_schema`): the sections import these primitives, and
`coldbench.evidence.analysis.summary` assembles them; nothing here imports a section.

Pairing. Only cells with status `ok` and round >= 0 enter statistics. A pair is the baseline's
cell and the variant's cell of the same (run, round, context): the same prompt ids (a pair whose
`prompt_sha256` values differ is dropped and counted). The paired ratio is variant tok/s over
baseline tok/s; above 1 means the variant is faster. Prefill and decode are compared separately
(`comparisons`, `decode_comparisons`).

Units. The independent unit is the process pair where records carry process instances (the
pairs measured by one process of the variant and one of the baseline, counted once as the median
of its pairs' log ratios), else the pair. A process has a speed offset of its own, so pairs of
one process pair are not independent; process pairs are.

Per comparison:

- `ratio_median`: the interval's centre, exp of Yuen's 20% trimmed mean of the units' log ratios
  (the floor(0.2 n) smallest and largest units set aside: one cell 5x slow in a hundred, or two
  stalled process pairs at each end of ten, cannot move it).
- `ci_low`, `ci_high`: its t interval, Yuen's standard error from the winsorized variance with
  h - 1 degrees of freedom (h units kept), at level 1 - alpha_look / m (`interval_level`): m the
  comparisons of the family (the prefill matrix, the decode matrix, the ablation entries;
  Bonferroni), alpha_look the share of alpha this look spends (all of it for a job of fixed
  rounds; `Looks`). Every interval of a family and of every look holds at once with probability
  at least 1 - alpha, whatever their correlation (the union bound), so the verdicts read them.
- `p_value`: Yuen's trimmed t test of the log ratio against 0, two-sided; `p_adjusted`: it times
  m x alpha / alpha_look (capped at 1), below alpha exactly where the interval excludes 1.

Verdict, with alpha = 0.05 and `precision` the job's (default 0.02, i.e. +-2%):

0. no pair at all: `no valid pairs`, and `why` says which side had no valid cell there (with
   the reasons its cells were set aside, e.g. `silent no-op: <flag>`), or that no round had
   valid cells of both, or that the pairs' prompts differed.
1. fewer than `min_pairs` (3) units, or too few left after trimming for an interval:
   `inconclusive`.
2. the interval lies above 1: `faster`; below 1: `slower`.
3. the interval includes 1 and lies within [1 - precision, 1 + precision]:
   `no established change` (any change larger than the precision is ruled out; a smaller one
   is not).
4. anything else: `inconclusive` (the interval includes 1 and is too wide for the precision).

Looks. A job measuring until decided (`until: decided`, `rounds` the budget) takes looks after
its first look's rounds (`units_for_verdict` process blocks), at each doubling and at the
budget; look k spends alpha x (t_k^2 - t_(k-1)^2), t_k its share of the budget's rounds. The run
stops at the first look where every prefill comparison is decided; the summary analyses the
records of the last look reached, at that look's share
(`coldbench.evidence.analysis.summary.look_taken`).

`rounds_needed` (inconclusive only): the units at which, with the winsorized spread observed,
the interval at this level would be about +-precision wide; `rounds_to_detect`: the units at
which it would leave 1 for a change of the size observed. Both are in rounds at the run's length
of process block (units x rounds per unit).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, TypeVar

import numpy as np

from coldbench.evidence.contract.calibration import VarianceSums
from coldbench.evidence.contract.schemas import JobRequest, JobSpec, Record
from coldbench.evidence.contract.summary_schema import Comparison, Verdict


def _scipy_stats() -> Any:
    """scipy.stats, imported on first use: the API server, the agents and the command line
    import this module for its rules and constants at start, and scipy.stats costs more than
    the rest of their imports (analysis, in Celery and `coldbench run`, pays it once)."""
    from scipy import stats

    return stats


def prepare() -> None:
    """Import scipy.stats now: a long-lived process (a Celery worker) pays it at start instead
    of in its first analysis."""
    _scipy_stats()


Metric = Literal["prefill_tps", "decode_tps"]
ComparisonT = TypeVar("ComparisonT", bound=Comparison)

CONFIDENCE_LEVEL = 0.95
ALPHA = 0.05
DEFAULT_PRECISION = 0.02
# Fewest units for any verdict: a trimmed-t interval needs two units left after trimming.
MIN_PAIRS = 3
# The share of units set aside at each end by the trimmed mean (Yuen's 20%), from this many
# units on (below, the plain mean and its t interval).
TRIM = 0.2
MIN_TRIMMED_UNITS = 10
# Process pairs a default first look must out-vote at each end (a stalled process, a hiccup).
DISSENTING_UNITS = 2
# Looks spend alpha x t^SPENDING_POWER by information fraction t (`Looks`).
SPENDING_POWER = 2
# The bootstrap of the drift section's bracketing intervals (coldbench.evidence.analysis.drift), not
# of verdicts.
N_RESAMPLES = 2000
BOOTSTRAP_METHOD = "percentile"
CORRECTION = "bonferroni"


@dataclass(frozen=True)
class StatsOptions:
    confidence_level: float = CONFIDENCE_LEVEL
    alpha: float = ALPHA
    precision: float = DEFAULT_PRECISION
    min_pairs: int = MIN_PAIRS
    n_resamples: int = N_RESAMPLES
    seed: int = 0
    # The share of alpha this look spends (`Looks.alpha_at`); None: all of it (one look).
    look_alpha: float | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "confidence_level": self.confidence_level,
            "alpha": self.alpha,
            "precision": self.precision,
            "min_pairs": self.min_pairs,
            "interval": (
                "Yuen's 20% trimmed mean of the units' log ratios with its t interval (units: "
                "process pairs, each the median of its pairs; pairs where records carry no "
                "process); the ratio shown is the interval's centre"
            ),
            "test": "the interval itself: faster above 1, slower below 1 (Yuen's trimmed t test)",
            # The drift section's intervals (coldbench.evidence.analysis.drift), not the verdicts'.
            "bootstrap": {
                "statistic": "median of the drift section's ratios",
                "method": BOOTSTRAP_METHOD,
                "interval": "hull of the percentile bootstrap and the order-statistic interval",
                "n_resamples": self.n_resamples,
                "seed": self.seed,
            },
            "correction": (
                "bonferroni: every interval of a family of m comparisons at level "
                "1 - alpha_look / m, alpha_look this look's share of alpha (all of it with one "
                "look), so every interval of the family and of every look holds together at "
                "1 - alpha"
            ),
        }


@dataclass(frozen=True)
class Pair:
    run_id: str
    round: int
    context_tokens: int
    ratio: float
    variant_record: Record
    baseline_record: Record

    @property
    def block(self) -> tuple[str, int | None, int | None] | None:
        """The process pair that measured it, or None for records without process instances."""
        variant_process = self.variant_record.process
        baseline_process = self.baseline_record.process
        if variant_process is None and baseline_process is None:
            return None
        return (self.run_id, variant_process, baseline_process)


@dataclass
class CellIndex:
    """The `ok` cells of a set of records by (run, variant, round, context), plus what was set
    aside (duplicates)."""

    cells: dict[tuple[str, str, int, int], Record] = field(default_factory=dict)
    duplicates: list[Record] = field(default_factory=list)
    # measured cells kept out (invalid, error), by (variant, context): reason -> count
    set_aside: dict[tuple[str, int], Counter[str]] = field(default_factory=dict)
    _by_variant: dict[str, dict[tuple[str, int, int], Record]] | None = field(
        default=None, repr=False
    )
    _at_context: dict[str, dict[int, list[tuple[tuple[str, int, int], Record]]]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(cls, records: Iterable[Record]) -> CellIndex:
        index = cls()
        for record in records:
            if record.status in ("invalid", "error") and record.round >= 0:
                reasons = index.set_aside.setdefault(
                    (record.variant, record.context_tokens), Counter()
                )
                reasons[record.reason or record.status] += 1
            if record.status != "ok" or record.round < 0:
                continue
            key = (record.run_id, record.variant, record.round, record.context_tokens)
            if key in index.cells:
                index.duplicates.append(record)
            else:
                index.cells[key] = record
        return index

    def of_variant(self, variant: str) -> dict[tuple[str, int, int], Record]:
        """The variant's cells by (run, round, context); grouped once per index."""
        if self._by_variant is None:
            grouped: dict[str, dict[tuple[str, int, int], Record]] = defaultdict(dict)
            for (run, name, rnd, ctx), record in self.cells.items():
                grouped[name][(run, rnd, ctx)] = record
            self._by_variant = dict(grouped)
        return self._by_variant.get(variant, {})

    def of_variant_at(
        self, variant: str, context_tokens: int
    ) -> list[tuple[tuple[str, int, int], Record]]:
        """The variant's cells at one context as sorted ((run, round, context), record) items;
        sorted and split by context once per variant (every comparison of a matrix asks)."""
        if variant not in self._at_context:
            grouped: dict[int, list[tuple[tuple[str, int, int], Record]]] = defaultdict(list)
            for item in sorted(self.of_variant(variant).items()):
                grouped[item[0][2]].append(item)
            self._at_context[variant] = dict(grouped)
        return self._at_context[variant].get(context_tokens, [])


def pairs_for(
    index: CellIndex, variant: str, baseline: str, metric: Metric, context_tokens: int
) -> tuple[list[Pair], int]:
    """Paired ratios variant/baseline at one context, and how many pairs had differing prompts."""
    base = index.of_variant(baseline)
    pairs: list[Pair] = []
    mismatched = 0
    for key, record in index.of_variant_at(variant, context_tokens):
        if key not in base:
            continue
        partner = base[key]
        if (
            record.prompt_sha256
            and partner.prompt_sha256
            and record.prompt_sha256 != partner.prompt_sha256
        ):
            mismatched += 1
            continue
        numerator, denominator = getattr(record, metric), getattr(partner, metric)
        if numerator is None or denominator is None or numerator <= 0 or denominator <= 0:
            continue
        pairs.append(Pair(key[0], key[1], key[2], numerator / denominator, record, partner))
    return pairs, mismatched


def no_pairs_why(
    index: CellIndex, variant: str, baseline: str, context_tokens: int, mismatched: int
) -> str:
    """Why a comparison at this context has no pair (for the `no valid pairs` verdict)."""
    missing = []
    for name in dict.fromkeys((variant, baseline)):
        if not any(key[2] == context_tokens for key in index.of_variant(name)):
            reasons = index.set_aside.get((name, context_tokens))
            detail = (
                ", ".join(f"{count} x {reason}" for reason, count in reasons.most_common(2))
                if reasons
                else "none measured"
            )
            missing.append(f"no valid cell of {name} ({detail})")
    if missing:
        return "; ".join(missing)
    if mismatched:
        return f"{mismatched} pairs had different prompt ids"
    return f"no round has valid cells of both {variant} and {baseline} with this metric"


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def comparison_seed(seed: int, *parts: object) -> int:
    """A per-comparison seed: adding a variant or context does not change the others' draws."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def order_statistic_interval(
    values: Sequence[float], confidence_level: float
) -> tuple[float, float]:
    """Distribution-free interval of the median, interpolated to the level (Hettmansperger and
    Sheather, 1986): [x(d), x(n+1-d)] covers with probability g(d) = 1 - 2 P(B <= d - 1),
    B ~ Binomial(n, 1/2); with d the largest where g(d) >= level, the ends move toward
    x(d+1) and x(n-d) by lambda = (n-d) I / (d + (n-2d) I), I = (g(d) - level) / (g(d) -
    g(d+1)). Below 6 values no d qualifies at 95%: the full range."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = ordered.size
    d, weight = order_statistic_position(n, confidence_level)
    if weight == 0:
        return float(ordered[d - 1]), float(ordered[n - d])
    low = (1 - weight) * ordered[d - 1] + weight * ordered[d]
    high = (1 - weight) * ordered[n - d] + weight * ordered[n - d - 1]
    return float(low), float(high)


@lru_cache(maxsize=256)
def _half_binomial_cdf(n: int) -> tuple[float, ...]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, 1/2), each the correctly rounded float of the
    exact fraction (integer sums of binomial coefficients over 2^n): building a job spec needs
    it for its default rounds, and scipy.stats would cost a command or an API process a second
    to import."""
    outcomes = 2**n
    total, cumulative = 0, []
    for k in range(n + 1):
        total += math.comb(n, k)
        cumulative.append(total / outcomes)
    return tuple(cumulative)


def order_statistic_position(n: int, confidence_level: float) -> tuple[int, float]:
    """(d, lambda) of `order_statistic_interval` for n values: its low end is
    (1 - lambda) x(d) + lambda x(d+1), its high end the mirror; lambda 0: no interpolation."""
    cdf = _half_binomial_cdf(n)

    def coverage(d: int) -> float:
        return 1 - 2 * cdf[d - 1]

    d = 1
    while 2 * (d + 1) <= n and coverage(d + 1) >= confidence_level:
        d += 1
    if coverage(d) < confidence_level or 2 * d + 1 > n:
        return d, 0.0
    share = (coverage(d) - confidence_level) / (coverage(d) - coverage(d + 1))
    return d, (n - d) * share / (d + (n - 2 * d) * share)


def interval_level(units: int, confidence_level: float) -> float:
    """The coverage of the interval of the median from `units` independent values: the
    confidence level where the order-statistic interval reaches it (6 values and more at 95%),
    else that of [min, max], 1 - 2^(1-n) (module docstring)."""
    widest = 1 - 2.0 ** (1 - units) if units >= 1 else 0.0
    return confidence_level if widest >= confidence_level else widest


def median_interval(
    ratios: Sequence[float], *, seed: int, options: StatsOptions
) -> tuple[float | None, float | None]:
    """The hull of a seeded percentile bootstrap interval of the median and the order-statistic
    interval (module docstring); None below two values."""
    values = np.asarray(ratios, dtype=float)
    if values.size < 2:
        return None, None
    if np.ptp(values) == 0:
        return float(values[0]), float(values[0])
    result = _scipy_stats().bootstrap(
        (values,),
        lambda sample, axis: np.median(sample, axis=axis),
        n_resamples=options.n_resamples,
        confidence_level=options.confidence_level,
        method=BOOTSTRAP_METHOD,
        rng=np.random.default_rng(seed),
    )
    exact_low, exact_high = order_statistic_interval(ratios, options.confidence_level)
    return (
        min(float(result.confidence_interval.low), exact_low),
        max(float(result.confidence_interval.high), exact_high),
    )


def blocks_of(pairs: Sequence[Pair]) -> list[list[float]] | None:
    """The pairs' ratios grouped by process pair (first appearance order), or None when the
    records carry no process instances (one process per variant: no blocks to tell apart)."""
    if not any(pair.block is not None for pair in pairs):
        return None
    grouped: dict[tuple[str, int | None, int | None] | None, list[float]] = {}
    for pair in pairs:
        grouped.setdefault(pair.block, []).append(pair.ratio)
    return list(grouped.values())


def log_spread(ratios: Sequence[float]) -> float | None:
    """Standard deviation of the log ratios (None below two values or when all are equal)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size < 2:
        return None
    sd = float(np.std(logs, ddof=1))
    return sd if sd > 0 else None


# --- the units and their robust estimate -------------------------------------------------------


def unit_logs(pairs: Sequence[Pair], blocks: Sequence[Sequence[float]] | None) -> list[float]:
    """The log ratios of a comparison's independent units: one per process pair of `blocks`
    (`blocks_of(pairs)`: the median of its pairs' log ratios), or one per pair where records
    carry no process instances."""
    if blocks is None:
        return [math.log(pair.ratio) for pair in pairs]
    return [float(np.median(np.log(np.asarray(block, dtype=float)))) for block in blocks]


@dataclass(frozen=True)
class Estimate:
    """Yuen's trimmed mean of the units' log ratios with its standard error and degrees of
    freedom (module docstring)."""

    centre: float
    se: float
    df: int
    units: int
    trimmed: int  # units set aside at each end
    winsorized_sd: float

    def interval(self, level: float) -> tuple[float, float]:
        """The two-sided `level` interval of the ratio (not of its log)."""
        if self.se == 0:
            return math.exp(self.centre), math.exp(self.centre)
        q = float(_scipy_stats().t.ppf(1 - (1 - level) / 2, self.df))
        return math.exp(self.centre - q * self.se), math.exp(self.centre + q * self.se)

    def p_value(self) -> float:
        """Two-sided p-value of the trimmed t test that the ratio is 1."""
        if self.se == 0:
            return 1.0 if self.centre == 0 else 0.0
        return float(2 * _scipy_stats().t.sf(abs(self.centre) / self.se, self.df))


def trimmed_df(units: int) -> int:
    """Degrees of freedom of the trimmed mean of `units` units: h - 1 for h units kept, one
    fewer where any are trimmed (`trimmed_estimate`)."""
    trimmed = trimmed_count(units)
    return units - 2 * trimmed - 1 - (1 if trimmed else 0)


def trimmed_count(units: int) -> int:
    """Units set aside at each end of the sorted units: floor(TRIM x n) from MIN_TRIMMED_UNITS
    on, none below (where Yuen's interval of a trimmed mean under-covers most: 93.8% of 20,000
    normal samples of 6 units with one set aside at each end)."""
    return math.floor(TRIM * units) if units >= MIN_TRIMMED_UNITS else 0


def trimmed_estimate(logs: Sequence[float]) -> Estimate | None:
    """Yuen's 20% trimmed mean of `logs` (None below two units left after trimming)."""
    values = np.sort(np.asarray(logs, dtype=float))
    n = values.size
    g = trimmed_count(n)
    kept = n - 2 * g
    if kept < 2:
        return None
    winsorized = np.clip(values, values[g], values[n - g - 1])
    sd = float(np.std(winsorized, ddof=1))
    return Estimate(
        centre=float(values[g : n - g].mean()),
        se=math.sqrt((n - 1) * sd**2 / (kept * (kept - 1))),
        # One degree of freedom fewer than Yuen's h - 1 where units are trimmed: his interval
        # under-covers with few units (94.4% and 94.2% of 20,000 normal samples of 10 and 12
        # units), this one covers 95.3% and 94.7% (benchmarks/interval_coverage.py).
        df=trimmed_df(n),
        units=n,
        trimmed=g,
        winsorized_sd=sd,
    )


def units_for_verdict(dissenting: int = DISSENTING_UNITS) -> int:
    """Fewest units whose trimmed mean sets aside `dissenting` units at each end: a comparison
    still reaches its verdict when that many process pairs stall or race (a host hiccup)."""
    n = 2
    while trimmed_count(n) < dissenting or n - 2 * trimmed_count(n) < 2:
        n += 1
    return n


# --- looks: where a run measuring until decided may stop ---------------------------------------


@dataclass(frozen=True)
class Looks:
    """The rounds after which the verdicts are taken, in order; the last is the budget. Look k
    may spend alpha x (t_k^2 - t_(k-1)^2) of the family's error, t_k = rounds_k / budget (a
    power spending function, Kim and DeMets): every look's interval is at its own share, so the
    chance that any interval of any look misses its ratio is at most alpha whenever the run
    stops (the union bound; no assumption on how looks correlate)."""

    rounds: tuple[int, ...]

    def alpha_at(self, look: int, alpha: float) -> float:
        budget = self.rounds[-1]
        spent = 0.0 if look == 0 else alpha * (self.rounds[look - 1] / budget) ** SPENDING_POWER
        return alpha * (self.rounds[look] / budget) ** SPENDING_POWER - spent

    def taken(self, rounds_done: int) -> int | None:
        """Index of the last look these complete rounds reach (None: not the first)."""
        reached = [k for k, rounds in enumerate(self.rounds) if rounds <= rounds_done]
        return reached[-1] if reached else None


def look_rounds(first: int, budget: int, *, block: int = 1) -> Looks:
    """Looks at `first` rounds, then doubling, then at `budget`, each a whole number of
    process blocks of `block` rounds."""
    block = max(block, 1)
    first = max(block, math.ceil(first / block) * block)
    budget = max(first, budget)
    rounds = []
    look = first
    while look < budget:
        rounds.append(look)
        look = math.ceil(2 * look / block) * block
    rounds.append(budget)
    return Looks(tuple(rounds))


def too_few_rounds(spec: JobRequest) -> str | None:
    """Why a job's rounds cannot reach a verdict, or None when they can (given little spread):
    the first look needs `units_for_verdict` process pairs. None for rounds left to the job's
    default, a whole first look or more by construction."""
    if spec.rounds is None:
        return None
    needed = units_for_verdict() * _look_block(spec)
    first = spec.rounds
    if spec.until == "decided":
        first = look_rounds(min(first_look(spec), first), first, block=_look_block(spec)).rounds[0]
    if first >= needed:
        return None
    return (
        f"{first} round{'s' if first != 1 else ''} cannot reach a verdict: the robust interval "
        f"needs at least {needed} rounds ({units_for_verdict()} independent process pairs, so "
        f"that {DISSENTING_UNITS} stalled at each end cannot decide it), more when the spread "
        "is wide"
    )


def first_look(spec: JobRequest) -> int:
    """The rounds of a job's first look measuring until decided, before its budget caps them:
    its own, else `units_for_verdict` process blocks."""
    return spec.first_look or units_for_verdict() * _look_block(spec)


def _look_block(spec: JobRequest) -> int:
    return 1 if spec.fresh_process else (spec.rounds_per_process or 1)


def job_looks(spec: JobSpec) -> Looks:
    """The looks of a job: its rounds alone, or with `until: decided` the doubling looks from
    its first look to its rounds (the budget)."""
    if spec.until != "decided":
        return Looks((spec.rounds,))
    first = min(first_look(spec), spec.rounds)
    return look_rounds(first, spec.rounds, block=_look_block(spec))


def _units_for_width(sd: float, target: float, level: float) -> int:
    """Units at which a trimmed-t interval of winsorized spread `sd` at `level` is about
    +-`target` (log) wide: n with q(df(n)) sd / ((1 - 2 TRIM) sqrt(n)) <= target."""
    n = units_for_verdict()
    while n < 100_000:
        kept = n - 2 * trimmed_count(n)
        q = float(_scipy_stats().t.ppf(1 - (1 - level) / 2, trimmed_df(n)))
        if q * sd * math.sqrt((n - 1) / (kept * (kept - 1))) <= target:
            return n
        n = max(n + 1, math.ceil(n * 1.05))
    return n


def rounds_needed(estimate: Estimate | None, options: StatsOptions, level: float) -> int | None:
    """Units for a +-precision interval at this level, from the spread observed (module
    docstring); None without an estimate."""
    if estimate is None:
        return None
    if estimate.winsorized_sd == 0:
        return estimate.units
    target = math.log1p(options.precision)
    return max(estimate.units + 1, _units_for_width(estimate.winsorized_sd, target, level))


def rounds_to_detect(estimate: Estimate | None, level: float) -> int | None:
    """Units for an interval that leaves 1 at the change observed; None without a change."""
    if estimate is None or abs(estimate.centre) < 1e-12:
        return None
    if estimate.winsorized_sd == 0:
        return estimate.units
    return max(
        estimate.units + 1, _units_for_width(estimate.winsorized_sd, abs(estimate.centre), level)
    )


def decide(
    n: int,
    ci_low: float | None,
    ci_high: float | None,
    options: StatsOptions,
) -> Verdict:
    """The verdict the interval states (module docstring): above 1 `faster`, below 1 `slower`,
    inside 1 +- precision `no established change`, else `inconclusive`."""
    if n < options.min_pairs or ci_low is None or ci_high is None:
        return Verdict.INCONCLUSIVE
    if ci_low > 1:
        return Verdict.FASTER
    if ci_high < 1:
        return Verdict.SLOWER
    if ci_low >= 1 - options.precision and ci_high <= 1 + options.precision:
        return Verdict.NO_CHANGE
    return Verdict.INCONCLUSIVE


def compare_pairs(
    pairs: Sequence[Pair],
    *,
    context_tokens: int,
    variant: str,
    baseline: str,
    options: StatsOptions,
) -> dict[str, Any]:
    """One comparison before its family is known (`finish` sets the interval, the p-values and
    the verdict). Records with process instances add `blocks` (independent process pairs),
    `unit` and `process_sd`."""
    ratios = [pair.ratio for pair in pairs]
    blocks = blocks_of(pairs)
    logs = unit_logs(pairs, blocks)
    comparison: dict[str, Any] = {
        "context_tokens": context_tokens,
        "variant": variant,
        "baseline": baseline,
        "n": len(ratios),
        "ratio_median": None,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
        "p_adjusted": None,
        "verdict": Verdict.INCONCLUSIVE,
        "rounds_needed": None,
        "ratios": [{"run_id": p.run_id, "round": p.round, "ratio": p.ratio} for p in pairs],
        "_logs": logs,
    }
    if ratios:
        estimate = trimmed_estimate(logs)
        comparison["ratio_median"] = (
            math.exp(estimate.centre) if estimate is not None else float(np.median(ratios))
        )
    if blocks is not None:
        block_of: dict[object, int] = {}
        for pair in pairs:
            block_of.setdefault(pair.block, len(block_of))
        for entry, pair in zip(comparison["ratios"], pairs, strict=True):
            entry["block"] = block_of[pair.block]
        comparison["blocks"] = len(blocks)
        comparison["unit"] = "process pair"
        comparison["process_sd"] = log_spread([math.exp(v) for v in logs])
    return comparison


def finish(
    drafts: Sequence[dict[str, Any]],
    options: StatsOptions,
    model: type[ComparisonT],
) -> list[ComparisonT]:
    """Give each draft of `compare_pairs` its interval at the family's level (Bonferroni over
    the comparisons with an estimate, at this look's share of alpha), the p-values, verdict and
    rounds advice, in its typed form (`model`: Comparison or a subclass)."""
    estimates = [
        trimmed_estimate(draft["_logs"]) if len(draft["_logs"]) >= options.min_pairs else None
        for draft in drafts
    ]
    family_size = max(1, sum(1 for e in estimates if e is not None))
    look_alpha = options.look_alpha if options.look_alpha is not None else options.alpha
    level = 1 - look_alpha / family_size
    finished = []
    for draft, estimate in zip(drafts, estimates, strict=True):
        comparison = {k: v for k, v in draft.items() if not k.startswith("_")}
        if estimate is not None:
            comparison["ci_low"], comparison["ci_high"] = estimate.interval(level)
            p_value = estimate.p_value()
            comparison["p_value"] = p_value
            # below alpha exactly where the interval excludes 1
            comparison["p_adjusted"] = min(1.0, p_value * family_size * options.alpha / look_alpha)
            comparison["interval_level"] = level
        comparison["verdict"] = decide(
            estimate.units if estimate is not None else 0,
            comparison["ci_low"],
            comparison["ci_high"],
            options,
        )
        if comparison["n"] == 0:
            comparison["verdict"] = Verdict.NO_VALID_PAIRS
            comparison.setdefault("why", "no pair of valid cells")
        elif comparison["verdict"] == Verdict.INCONCLUSIVE:
            units = len(draft["_logs"])
            per_unit = max(1, round(comparison["n"] / units)) if units else 1
            needed = rounds_needed(estimate, options, level)
            detect = rounds_to_detect(estimate, level)
            if estimate is None:
                needed = max(units_for_verdict(), units + 1)
            comparison["rounds_needed"] = None if needed is None else needed * per_unit
            comparison["rounds_to_detect"] = None if detect is None else detect * per_unit
        finished.append(model.model_validate(comparison))
    return finished


def compare_variants(
    index: CellIndex,
    *,
    variant: str,
    baseline: str,
    context_tokens: int,
    options: StatsOptions,
    metric: Metric = "prefill_tps",
) -> tuple[dict[str, Any], int]:
    """`variant` against `baseline` at one context before correction (`compare_pairs` over
    their pairs), and how many pairs had differing prompts."""
    pairs, mismatched = pairs_for(index, variant, baseline, metric, context_tokens)
    comparison = compare_pairs(
        pairs,
        context_tokens=context_tokens,
        variant=variant,
        baseline=baseline,
        options=options,
    )
    return comparison, mismatched


def compare_matrix(
    index: CellIndex,
    *,
    variants: Sequence[str],
    baseline: str,
    contexts: Sequence[int],
    metric: Metric,
    options: StatsOptions,
) -> tuple[list[Comparison], int]:
    """Every (context, variant) against the baseline, corrected as one family."""
    comparisons = []
    mismatched = 0
    for context in contexts:
        for variant in variants:
            if variant == baseline:
                continue
            comparison, bad = compare_variants(
                index,
                variant=variant,
                baseline=baseline,
                context_tokens=context,
                options=options,
                metric=metric,
            )
            mismatched += bad
            if comparison["n"] == 0:
                comparison["why"] = no_pairs_why(index, variant, baseline, context, bad)
            comparisons.append(comparison)
    return finish(comparisons, options, Comparison), mismatched


# --- a host's noise, from its calibration runs -------------------------------------------------


def comparison_blocks(
    records: Sequence[Record], *, baseline: str
) -> dict[tuple[str, int], list[list[float]]]:
    """Each (variant, context)'s paired ratios to the baseline grouped by process pair: the
    groups a host's variance components are estimated from, without gross outliers
    (`without_gross_outliers`)."""
    index = CellIndex.of(records)
    measured = [r for r in records if r.round >= 0]
    variants = sorted({r.variant for r in measured} - {baseline})
    contexts = sorted({r.context_tokens for r in measured})
    found: dict[tuple[str, int], list[list[float]]] = {}
    for variant in variants:
        for context in contexts:
            pairs, _ = pairs_for(index, variant, baseline, "prefill_tps", context)
            blocks = blocks_of(pairs)
            if blocks:
                found[(variant, context)] = without_gross_outliers(blocks)
    return found


# A ratio whose log lies further than this many robust SDs (1.4826 MAD) from the comparison's
# median is a stalled or raced cell, not noise: it would inflate a calibration's variances.
GROSS_OUTLIER_SDS = 6.0


def without_gross_outliers(blocks: Sequence[Sequence[float]]) -> list[list[float]]:
    """The blocks' ratios less those further than GROSS_OUTLIER_SDS robust SDs (1.4826 x the
    median absolute deviation of the logs) from the median log ratio; blocks left empty go."""
    logs = np.log(np.concatenate([np.asarray(b, dtype=float) for b in blocks]))
    centre = float(np.median(logs))
    spread = 1.4826 * float(np.median(np.abs(logs - centre)))
    if spread == 0:
        return [list(b) for b in blocks]
    kept = [
        [r for r in block if abs(math.log(r) - centre) <= GROSS_OUTLIER_SDS * spread]
        for block in blocks
    ]
    return [block for block in kept if block]


def calibration_sums(runs: Sequence[Sequence[Record]], *, baseline: str) -> VarianceSums | None:
    """One analysis of variance over every (variant, context) comparison to the baseline of
    these calibration runs, each comparison centred on its own mean (so a planted effect adds
    nothing between process pairs); None below two process pairs of a comparison."""
    groups: dict[tuple[str, int], list[list[float]]] = {}
    for records in runs:
        for key, blocks in comparison_blocks(records, baseline=baseline).items():
            groups.setdefault(key, []).extend(blocks)
    total: VarianceSums | None = None
    for blocks in groups.values():
        anova = block_anova(blocks)
        if anova is not None:
            total = anova if total is None else total + anova
    return total


def block_anova(blocks: Sequence[Sequence[float]]) -> VarianceSums | None:
    """The analysis of variance of the log ratios of these process pairs (None below two
    process pairs or with no pair to spare within them)."""
    logs = [np.log(np.asarray(block, dtype=float)) for block in blocks if len(block)]
    k = len(logs)
    n = sum(block.size for block in logs)
    if k < 2 or n - k < 1:
        return None
    grand = float(np.concatenate(logs).mean())
    ss_between = float(sum(block.size * (block.mean() - grand) ** 2 for block in logs))
    ss_within = float(sum(((block - block.mean()) ** 2).sum() for block in logs))
    m0 = (n - sum(block.size**2 for block in logs) / n) / (k - 1)
    return VarianceSums(
        ss_between=ss_between,
        df_between=k - 1,
        ss_within=ss_within,
        df_within=n - k,
        m0=m0,
        comparisons=1,
    )


def cell_seconds_per_token(runs: Sequence[Sequence[Record]]) -> float | None:
    """The median timed cell's seconds per prompt token (start to end, decode included)."""
    timed = [r for records in runs for r in records if r.round >= 0 and r.status == "ok"]
    per_token = [(r.ended_at - r.started_at).total_seconds() / r.context_tokens for r in timed]
    return float(np.median(per_token)) if per_token else None
