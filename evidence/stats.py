"""Paired statistics over validated records, and the verdict rules of every comparison.

The bottom layer of the statistics (above only the typed summary, `evidence.summary_schema`):
the sections import these primitives, and `evidence.summary` assembles them; nothing here
imports a section.

Pairing. Only cells with status `ok` and round >= 0 enter statistics. A pair is the baseline's
cell and the variant's cell of the same (run, round, context): the same prompt ids (a pair whose
`prompt_sha256` values differ is dropped and counted). The paired ratio is variant tok/s over
baseline tok/s; above 1 means the variant is faster. Prefill and decode are compared separately
(`comparisons`, `decode_comparisons`).

Per comparison:

- `ratio_median`: the median of the paired ratios.
- `ci_low`, `ci_high`: a 95% interval of that median: the hull of a percentile bootstrap
  interval (`scipy.stats.bootstrap`, 2,000 resamples of the pairs, seeded per comparison from
  the job seed, the metric, the context and the variant, so results repeat exactly) and the
  distribution-free order-statistic interval of the median, interpolated between order
  statistics to 95% (Hettmansperger and Sheather; `order_statistic_interval`). The percentile
  bootstrap of a median slightly under-covers with few pairs (94.1%, 92.9% and 94.0% of 2,000
  normal samples of 6, 8 and 12 pairs); the hull covered 95.1%, 94.7% and 95.9%.
- `ci_level` (set only below the confidence level): the interval's real coverage. Below 6
  independent units (pairs, or process pairs) no order-statistic interval reaches 95%: the
  interval is the units' [min, max] (the bootstrap's lies inside it), which covers the median
  with probability 1 - 2^(1-n): 50% at 2, 75% at 3, 87.5% at 4, 93.75% at 5. It is labelled
  so, and no rule that needs a 95% interval (a history step, a bisection decision, two
  reproductions disagreeing, the noise floor's resolvable effect) uses it
  (`evidence.summary_schema.decisive_interval`).
- `p_value`: two-sided Wilcoxon signed-rank test of the log ratios against 0.
- `p_adjusted`: Holm's step-down correction across every comparison of the same family (the
  prefill matrix, the decode matrix, the ablation entries), so claiming "faster" somewhere in a
  large matrix does not become likely by chance.

Verdict, with `alpha` = 0.05, `precision` = the job's requested precision (default 0.05, i.e.
+-5%) and `min_pairs` = 6 (below 6 pairs a two-sided signed-rank test cannot reach p < 0.05):

0. no pair at all: `no valid pairs`, and `why` says which side had no valid cell there (with
   the reasons its cells were set aside, e.g. `silent no-op: <flag>`), or that no round had
   valid cells of both, or that the pairs' prompts differed.
1. fewer than `min_pairs` pairs: `inconclusive`.
2. the interval excludes 1 and `p_adjusted` < alpha: `faster` (ci_low > 1) or `slower`
   (ci_high < 1).
3. the interval includes 1 and lies within [1 - precision, 1 + precision]:
   `no established change` (any change larger than the precision is ruled out; a smaller one
   is not).
4. anything else: `inconclusive`. The interval is too wide for the precision, or it excludes 1
   while the corrected test does not agree.

`rounds_needed` (inconclusive only): the rounds at which, with the spread observed, the 95%
interval of the median would be about +-precision wide: ceil((1.96 x 1.2533 x s / ln(1 +
precision))^2), s the standard deviation of the log ratios (the median's standard error is
1.2533 times the mean's). Never less than `min_pairs`, nor than n + 1, nor than the smallest n
at which the signed-rank test of m comparisons can pass Holm at all (2^(1-n) x m < alpha, e.g.
7 rounds for a matrix of 2). A ratio close to a precision bound may need more.

`rounds_to_detect` (inconclusive only, where a change is observed): the rounds at which, with
the spread observed, the interval would leave 1 for a change of the size observed (the median
ratio r): the same formula with ln(r) in place of ln(1 + precision), and the same floors. It is
the cost of detecting this change; `rounds_needed` is the cost of a +-precision interval, which
only a change smaller than the precision needs (a 70% change is detected long before its
interval is +-5% wide).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, TypeVar

import numpy as np

from evidence.calibration import VarianceSums
from evidence.schemas import JobSpec, Record
from evidence.summary_schema import Comparison, Verdict
from evidence.variant import expand_variants


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
DEFAULT_PRECISION = 0.05
MIN_PAIRS = 6
N_RESAMPLES = 2000
BOOTSTRAP_METHOD = "percentile"
CORRECTION = "holm"
# A normal sample's median has a standard error 1.2533 (sqrt(pi/2)) times the mean's.
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
_Z = 1.959963984540054


@dataclass(frozen=True)
class StatsOptions:
    confidence_level: float = CONFIDENCE_LEVEL
    alpha: float = ALPHA
    precision: float = DEFAULT_PRECISION
    min_pairs: int = MIN_PAIRS
    n_resamples: int = N_RESAMPLES
    seed: int = 0
    # The host's calibrated bound on the process-pair component of a log ratio (HostNoise's
    # process_pair_sd_upper): pairs of one process pair then count with a design effect
    # instead of as one unit per process pair (`design_effect_interval`).
    process_pair_sd: float | None = None

    def settings(self) -> dict[str, Any]:
        return {
            "confidence_level": self.confidence_level,
            "alpha": self.alpha,
            "precision": self.precision,
            "min_pairs": self.min_pairs,
            "bootstrap": {
                "statistic": "median of paired ratios",
                "method": BOOTSTRAP_METHOD,
                "interval": "hull of the percentile bootstrap and the order-statistic interval",
                "n_resamples": self.n_resamples,
                "seed": self.seed,
            },
            "test": "Wilcoxon signed-rank, two-sided, on log paired ratios",
            "correction": CORRECTION,
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


def cluster_median_interval(
    blocks: Sequence[Sequence[float]], *, seed: int, options: StatsOptions
) -> tuple[float | None, float | None]:
    """95% interval of the median ratio when pairs come in process blocks (module docstring):
    the hull of a two-stage bootstrap (resample blocks, then pairs within each drawn block;
    percentile interval of the pooled median) and the order-statistic interval of the block
    medians. None below two blocks: one process pair cannot tell its offset from an effect."""
    if len(blocks) < 2:
        return None, None
    sizes = np.array([len(b) for b in blocks])
    padded = np.full((len(blocks), int(sizes.max())), np.nan)
    for i, block in enumerate(blocks):
        padded[i, : len(block)] = block
    if np.nanmax(padded) == np.nanmin(padded):
        return float(padded[0, 0]), float(padded[0, 0])
    rng = np.random.default_rng(seed)
    n, k, m = options.n_resamples, len(blocks), padded.shape[1]
    drawn = rng.integers(0, k, size=(n, k))
    drawn_sizes = sizes[drawn]
    within = np.floor(rng.random((n, k, m)) * drawn_sizes[..., None]).astype(int)
    values = padded[drawn[..., None], within]
    values[np.arange(m)[None, None, :] >= drawn_sizes[..., None]] = np.nan
    medians = np.nanmedian(values.reshape(n, k * m), axis=1)
    tail = 100 * (1 - options.confidence_level) / 2
    boot_low, boot_high = np.percentile(medians, [tail, 100 - tail])
    block_medians = [float(np.median(b)) for b in blocks]
    exact_low, exact_high = order_statistic_interval(block_medians, options.confidence_level)
    return min(float(boot_low), exact_low), max(float(boot_high), exact_high)


# scipy.stats.wilcoxon's own limit (method "auto"): up to 13 values with ties or zeros it runs
# an exact permutation test over all 2^n sign flips; above, the normal approximation.
_SIGN_FLIPS_EXACT_MAX_N = 13


def signed_rank_p(ratios: Sequence[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value of the log ratios; 1.0 when all ratios are 1.

    The p-value is scipy.stats.wilcoxon's (method "auto", zeros dropped), computed here in
    one case: up to 13 values with ties or zeros, where scipy runs `permutation_test` over
    every sign flip through its generic machinery (about a second a call, several calls per
    job). `_sign_flip_p` gives that same exact p-value from the null distribution counted
    directly, in microseconds."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size == 0:
        return None
    if not np.any(logs != 0):
        return 1.0
    nonzero = logs[logs != 0]
    if logs.size <= _SIGN_FLIPS_EXACT_MAX_N and (
        nonzero.size < logs.size or np.unique(np.abs(nonzero)).size < nonzero.size
    ):
        return _sign_flip_p(nonzero)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = float(_scipy_stats().wilcoxon(logs).pvalue)
    return p if math.isfinite(p) else None


def _sign_flip_p(nonzero: np.ndarray) -> float:
    """Exact two-sided p-value of the signed-rank statistic (sum of the positive values' mid-
    ranks) under the null that each sign is + or - with probability 1/2, independently.

    Mid-ranks are multiples of 1/2, so doubled they are integers and the null distribution is
    counted exactly: `counts[t]` = how many of the 2^m sign patterns give doubled statistic t
    (subset sums, one value at a time). Zeros carry no rank and only double every count, so
    they leave each share unchanged: this equals scipy's permutation test over all 2^n flips,
    which counts statistics at most / at least the observed one and doubles the smaller."""
    ranks2 = np.rint(2 * _scipy_stats().rankdata(np.abs(nonzero))).astype(np.int64)
    observed = int(ranks2[nonzero > 0].sum())
    counts = np.zeros(int(ranks2.sum()) + 1, dtype=np.int64)
    counts[0] = 1
    for rank in ranks2:
        shifted = np.zeros_like(counts)
        shifted[rank:] = counts[: counts.size - rank]
        counts += shifted
    flips = float(2**nonzero.size)
    at_most = float(counts[: observed + 1].sum()) / flips
    at_least = float(counts[observed:].sum()) / flips
    return min(1.0, 2 * min(at_most, at_least))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (family-wise error); None entries are not part of the family."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def log_spread(ratios: Sequence[float]) -> float | None:
    """Standard deviation of the log ratios (None below two values or when all are equal)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if logs.size < 2:
        return None
    sd = float(np.std(logs, ddof=1))
    return sd if sd > 0 else None


def rounds_for_test(family_size: int, alpha: float) -> int:
    """Smallest n at which a two-sided signed-rank test can pass Holm among `family_size`:
    its smallest p-value is 2 / 2^n (every sign alike)."""
    return math.floor(1 + math.log2(max(family_size, 1) / alpha)) + 1


def rounds_for_verdict(family_size: int, options: StatsOptions | None = None) -> int:
    """Fewest rounds with which a comparison among `family_size` can reach any verdict but
    inconclusive: `min_pairs` for an interval at all, and enough for the signed-rank test to
    pass Holm (`faster`/`slower`). More are needed when the spread is wide."""
    options = options or StatsOptions()
    return max(options.min_pairs, rounds_for_test(family_size, options.alpha))


# Process pairs a default number of rounds must out-vote: a comparison still reaches its verdict
# when this many of its independent units point the other way (a stalled process, a host hiccup).
DISSENTING_UNITS = 2


def rounds_to_outvote(
    family_size: int, dissenting: int = DISSENTING_UNITS, options: StatsOptions | None = None
) -> int:
    """Fewest independent units (process pairs; rounds with the default blocks) with which a
    comparison among `family_size` still reaches `faster` or `slower` when `dissenting` of them
    point the other way, by less than the rest point their way:

    - the order-statistic interval starts above them: its end (`order_statistic_position`) lies
      beyond the dissenting units, or between the last of them and the next unit but at least
      halfway to that unit (then (1 - lambda) / r + lambda r > 1 for any r > 1);
    - the signed-rank test, with them at the smallest ranks, passes Holm's strictest step:
      2 x #{subsets of ranks 1..n summing to at most 1 + ... + dissenting} / 2^n x family_size
      < alpha.

    At 95% and two dissenting units: 10 up to 5 comparisons, 11 up to 10, then about one more
    per doubling of the family. Never fewer than `rounds_for_verdict`."""
    options = options or StatsOptions()
    family_size = max(family_size, 1)
    worst = dissenting * (dissenting + 1) // 2
    n = max(2 * dissenting + 1, options.min_pairs)
    while True:
        d, weight = order_statistic_position(n, options.confidence_level)
        outside = d > dissenting or (d == dissenting and weight > 0.5)
        # Rank sums of subsets of 1..n up to `worst` (those sums only use ranks <= worst).
        sums = [1] + [0] * worst
        for rank in range(1, min(n, worst) + 1):
            for total in range(worst, rank - 1, -1):
                sums[total] += sums[total - rank]
        p = 2 * sum(sums) / 2**n
        if outside and p * family_size < options.alpha:
            return max(n, rounds_for_verdict(family_size, options))
        n += 1


def comparison_family_size(spec: JobSpec) -> int:
    """How many prefill comparisons a job's verdicts are corrected over (Holm's m)."""
    return len(spec.contexts) * max(len(expand_variants(spec)) - 1, 1)


def too_few_rounds(spec: JobSpec) -> str | None:
    """Why a job's rounds cannot reach a verdict, or None when they can (given little spread)."""
    family = comparison_family_size(spec)
    needed = rounds_for_verdict(family, StatsOptions(precision=spec.precision))
    if spec.rounds >= needed:
        return None
    return (
        f"{spec.rounds} round{'s' if spec.rounds != 1 else ''} cannot reach a verdict: "
        f"{family} comparison{'s' if family != 1 else ''} corrected together (Holm) need at "
        f"least {needed} rounds, more when the spread is wide"
    )


def rounds_needed(
    ratios: Sequence[float], options: StatsOptions, family_size: int = 1
) -> int | None:
    """Rounds for a +-precision interval, from the observed spread (module docstring)."""
    n = len(ratios)
    target = math.log1p(options.precision)
    spread = log_spread(ratios)
    if spread is None:
        return options.min_pairs if n >= 2 else None
    needed = math.ceil((_Z * _MEDIAN_SE_FACTOR * spread / target) ** 2)
    return max(needed, options.min_pairs, n + 1, rounds_for_test(family_size, options.alpha))


def rounds_to_detect(
    ratios: Sequence[float], options: StatsOptions, family_size: int = 1
) -> int | None:
    """Rounds for an interval that leaves 1 at the change observed (module docstring); None
    when the median ratio is 1 (no change to detect) or there are fewer than two units."""
    n = len(ratios)
    if n < 2:
        return None
    effect = abs(math.log(float(np.median(ratios))))
    if effect == 0:
        return None
    floor = max(options.min_pairs, n + 1, rounds_for_test(family_size, options.alpha))
    spread = log_spread(ratios)
    if spread is None:
        return floor
    return max(math.ceil((_Z * _MEDIAN_SE_FACTOR * spread / effect) ** 2), floor)


def decide(
    n: int,
    ci_low: float | None,
    ci_high: float | None,
    p_adjusted: float | None,
    options: StatsOptions,
) -> Verdict:
    """The verdict rules of the module docstring."""
    if n < options.min_pairs or ci_low is None or ci_high is None:
        return "inconclusive"
    if p_adjusted is not None and p_adjusted < options.alpha:
        if ci_low > 1:
            return "faster"
        if ci_high < 1:
            return "slower"
    if ci_low <= 1 <= ci_high and (
        ci_low >= 1 - options.precision and ci_high <= 1 + options.precision
    ):
        return "no established change"
    return "inconclusive"


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


def design_effect_interval(
    blocks: Sequence[Sequence[float]], *, prior_sd: float, seed: int, options: StatsOptions
) -> tuple[float | None, float | None, float | None, float]:
    """(ci_low, ci_high, p_value, design effect) of the pooled pairs of these process pairs, on
    a host whose calibration bounds the process-pair component by `prior_sd` (module
    docstring). Under the random-effects model (each process pair adds an offset of SD tau, each
    pair noise of SD sigma) the median log ratio of n pairs in process pairs of m (weighted by
    size) has variance (pi / 2)(m tau^2 + sigma^2) / n, i.e. the pairs' own variance times the
    design effect 1 + (m - 1) rho, rho = tau^2 / (tau^2 + sigma^2). The interval is the pairs'
    own (bootstrap hull) widened by sqrt(design effect); the test is that of the median against
    that variance, a t test (a rank test of n pairs could not pass its smallest p-value once
    divided by the design effect, however large the effect). tau is the calibration's bound,
    taken as known: the degrees of freedom are those of sigma^2 alone (Satterthwaite), many;
    where the run's own process pairs differ more than the calibration allows (F test at alpha)
    tau is the run's estimate and the process pairs, less one, are the degrees of freedom.
    sigma is the spread within process pairs."""
    ratios = [ratio for block in blocks for ratio in block]
    n = len(ratios)
    anova = block_anova(blocks)
    within = anova.within_variance if anova is not None else None
    if within is None:
        spread = log_spread(ratios)
        within = spread**2 if spread else 0.0
    tau2 = prior_sd**2
    freedom_within = anova.df_within if anova is not None else max(n - 1, 1)
    own_freedom: int | None = None  # the run's own process pairs decide
    if anova is not None:
        p = anova.p_value()
        measured = anova.process_variance()
        if p is not None and p < options.alpha and measured is not None and measured > tau2:
            tau2, own_freedom = measured, anova.df_between
    sizes = [len(block) for block in blocks if len(block)]
    weighted = sum(size**2 for size in sizes) / n if n else 1.0
    total = tau2 + within
    rho = tau2 / total if total > 0 else 0.0
    design = 1 + (weighted - 1) * rho
    low, high = median_interval(ratios, seed=seed, options=options)
    if low is None or high is None or n < 2:
        return low, high, None, design
    centre = math.log(float(np.median(ratios)))
    widen = math.sqrt(design)
    low = math.exp(centre - (centre - math.log(low)) * widen)
    high = math.exp(centre + (math.log(high) - centre) * widen)
    spread = weighted * tau2 + within
    if spread <= 0:
        return low, high, 1.0 if centre == 0 else 0.0, design
    t = centre / math.sqrt(_MEDIAN_SE_FACTOR**2 * spread / n)
    if own_freedom is not None:
        freedom = float(max(own_freedom, 1))
    else:  # Satterthwaite: only sigma^2 is estimated
        freedom = spread**2 / (within**2 / max(freedom_within, 1)) if within > 0 else 1e6
    return low, high, float(2 * _scipy_stats().t.sf(abs(t), freedom)), design


def compare_pairs(
    pairs: Sequence[Pair],
    *,
    context_tokens: int,
    variant: str,
    baseline: str,
    seed: int,
    options: StatsOptions,
) -> dict[str, Any]:
    """One comparison before correction (`p_adjusted` and `verdict` are set by `finish`).

    Records with process instances add `blocks` (independent process pairs), `unit` and
    `process_sd`; with several pairs per process pair the interval and the test are the
    cluster-aware ones (module docstring). Records without them are analysed per round.
    """
    ratios = [pair.ratio for pair in pairs]
    blocks = blocks_of(pairs)
    comparison: dict[str, Any] = {
        "context_tokens": context_tokens,
        "variant": variant,
        "baseline": baseline,
        "n": len(ratios),
        "ratio_median": float(np.median(ratios)) if ratios else None,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
        "p_adjusted": None,
        "verdict": "inconclusive",
        "rounds_needed": None,
        "ratios": [{"run_id": p.run_id, "round": p.round, "ratio": p.ratio} for p in pairs],
    }
    calibrated = options.process_pair_sd is not None
    if blocks is None or all(len(block) == 1 for block in blocks):
        # Independent pairs: no process offsets to absorb (records predating process rotation
        # are analysed as they always were), or one process pair per round (each pair its own
        # block), where the pair statistics are already the block statistics.
        units = ratios
        comparison["ci_low"], comparison["ci_high"] = median_interval(
            ratios, seed=seed, options=options
        )
        comparison["p_value"] = signed_rank_p(units)
    elif calibrated:
        units = [float(np.median(block)) for block in blocks]
        assert options.process_pair_sd is not None
        low, high, p_value, design = design_effect_interval(
            blocks, prior_sd=options.process_pair_sd, seed=seed, options=options
        )
        comparison["ci_low"], comparison["ci_high"], comparison["p_value"] = low, high, p_value
        comparison["design_effect"] = round(design, 4)
    else:
        units = [float(np.median(block)) for block in blocks]
        comparison["ci_low"], comparison["ci_high"] = cluster_median_interval(
            blocks, seed=seed, options=options
        )
        comparison["p_value"] = signed_rank_p(units)
    if comparison["ci_low"] is not None:
        # pairs under a design effect are the units of their interval and test
        tested = len(ratios) if "design_effect" in comparison else len(units)
        level = interval_level(tested, options.confidence_level)
        if level < options.confidence_level:
            comparison["ci_level"] = level
    if blocks is not None:
        block_of: dict[object, int] = {}
        for pair in pairs:
            block_of.setdefault(pair.block, len(block_of))
        for entry, pair in zip(comparison["ratios"], pairs, strict=True):
            entry["block"] = block_of[pair.block]
        comparison["blocks"] = len(blocks)
        comparison["unit"] = "pair" if "design_effect" in comparison else "process pair"
        comparison["process_sd"] = log_spread(units)
    return comparison


def unit_ratios(comparison: Mapping[str, Any]) -> list[float]:
    """The units of a comparison's test: its pairs (also under a design effect), or the
    medians of its process blocks when pairs come several to a process pair."""
    ratios = comparison["ratios"]
    if not ratios or "block" not in ratios[0] or comparison.get("design_effect") is not None:
        return [r["ratio"] for r in ratios]
    grouped: dict[int, list[float]] = defaultdict(list)
    for r in ratios:
        grouped[r["block"]].append(r["ratio"])
    return [float(np.median(values)) for values in grouped.values()]


def finish(
    drafts: Sequence[dict[str, Any]],
    options: StatsOptions,
    model: type[ComparisonT],
) -> list[ComparisonT]:
    """Correct the family's p-values (Holm), decide each verdict and rounds needed, and give
    the drafts of `compare_pairs` their typed form (`model`: Comparison or a subclass)."""
    adjusted = holm([c["p_value"] for c in drafts])
    family_size = sum(1 for p in adjusted if p is not None)
    finished = []
    for draft, p_adjusted in zip(drafts, adjusted, strict=True):
        comparison = {**draft, "p_adjusted": p_adjusted}
        units = unit_ratios(comparison)
        comparison["verdict"] = decide(
            len(units), comparison["ci_low"], comparison["ci_high"], p_adjusted, options
        )
        if comparison["n"] == 0:
            comparison["verdict"] = "no valid pairs"
            comparison.setdefault("why", "no pair of valid cells")
        elif comparison["verdict"] == "inconclusive":
            needed = rounds_needed(units, options, family_size=family_size)
            detect = rounds_to_detect(units, options, family_size=family_size)
            # Units are process pairs: more of them at the same length of block. Pairs under
            # a design effect: as many more as it takes.
            per_unit = max(1, round(comparison["n"] / len(units))) if units else 1
            design = comparison.get("design_effect")
            if design is not None:
                needed = None if needed is None else math.ceil(needed * design)
                detect = None if detect is None else math.ceil(detect * design)
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
    seed_parts: Sequence[object],
    options: StatsOptions,
    metric: Metric = "prefill_tps",
) -> tuple[dict[str, Any], int]:
    """`variant` against `baseline` at one context before correction (`compare_pairs` over
    their pairs), and how many pairs had differing prompts. `seed_parts` name the comparison's
    bootstrap draws (`comparison_seed`), so adding a comparison leaves the others' alone."""
    pairs, mismatched = pairs_for(index, variant, baseline, metric, context_tokens)
    comparison = compare_pairs(
        pairs,
        context_tokens=context_tokens,
        variant=variant,
        baseline=baseline,
        seed=comparison_seed(options.seed, *seed_parts),
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
                seed_parts=(metric, context, variant, baseline),
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
    groups a host's variance components are estimated from."""
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
                found[(variant, context)] = blocks
    return found


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


def cell_seconds_per_token(runs: Sequence[Sequence[Record]]) -> float | None:
    """The median timed cell's seconds per prompt token (start to end, decode included)."""
    timed = [r for records in runs for r in records if r.round >= 0 and r.status == "ok"]
    per_token = [(r.ended_at - r.started_at).total_seconds() / r.context_tokens for r in timed]
    return float(np.median(per_token)) if per_token else None
