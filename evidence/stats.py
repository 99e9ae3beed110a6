"""Paired statistics over validated records, and the verdict rules of every comparison.

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
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats as scipy_stats

from evidence.schemas import JobSpec, Provenance, Record
from evidence.variant import ablation_features, baseline_name, expand_variants, parse_feature

SUMMARY_FORMAT = "coldbench.summary/1"
Metric = Literal["prefill_tps", "decode_tps"]
Verdict = Literal["faster", "slower", "no established change", "inconclusive", "no valid pairs"]

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
    cdf = scipy_stats.binom.cdf(np.arange(n + 1), n, 0.5)

    def coverage(d: int) -> float:
        return float(1 - 2 * cdf[d - 1])

    d = 1
    while 2 * (d + 1) <= n and coverage(d + 1) >= confidence_level:
        d += 1
    if coverage(d) < confidence_level or 2 * d + 1 > n:
        return float(ordered[d - 1]), float(ordered[n - d])
    share = (coverage(d) - confidence_level) / (coverage(d) - coverage(d + 1))
    weight = (n - d) * share / (d + (n - 2 * d) * share)
    low = (1 - weight) * ordered[d - 1] + weight * ordered[d]
    high = (1 - weight) * ordered[n - d] + weight * ordered[n - d - 1]
    return float(low), float(high)


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
    result = scipy_stats.bootstrap(
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
        p = float(scipy_stats.wilcoxon(logs).pvalue)
    return p if math.isfinite(p) else None


def _sign_flip_p(nonzero: np.ndarray) -> float:
    """Exact two-sided p-value of the signed-rank statistic (sum of the positive values' mid-
    ranks) under the null that each sign is + or - with probability 1/2, independently.

    Mid-ranks are multiples of 1/2, so doubled they are integers and the null distribution is
    counted exactly: `counts[t]` = how many of the 2^m sign patterns give doubled statistic t
    (subset sums, one value at a time). Zeros carry no rank and only double every count, so
    they leave each share unchanged: this equals scipy's permutation test over all 2^n flips,
    which counts statistics at most / at least the observed one and doubles the smaller."""
    ranks2 = np.rint(2 * scipy_stats.rankdata(np.abs(nonzero))).astype(np.int64)
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
    if blocks is None or all(len(block) == 1 for block in blocks):
        # Independent pairs: no process offsets to absorb (records predating process rotation
        # are analysed as they always were), or one process pair per round (each pair its own
        # block), where the pair statistics are already the block statistics.
        units = ratios
        comparison["ci_low"], comparison["ci_high"] = median_interval(
            ratios, seed=seed, options=options
        )
    else:
        units = [float(np.median(block)) for block in blocks]
        comparison["ci_low"], comparison["ci_high"] = cluster_median_interval(
            blocks, seed=seed, options=options
        )
    comparison["p_value"] = signed_rank_p(units)
    if blocks is not None:
        block_of: dict[object, int] = {}
        for pair in pairs:
            block_of.setdefault(pair.block, len(block_of))
        for entry, pair in zip(comparison["ratios"], pairs, strict=True):
            entry["block"] = block_of[pair.block]
        comparison["blocks"] = len(blocks)
        comparison["unit"] = "process pair"
        comparison["process_sd"] = log_spread(units)
    return comparison


def unit_ratios(comparison: Mapping[str, Any]) -> list[float]:
    """The independent units of a comparison: its pairs, or the medians of its process
    blocks when pairs come several to a process pair."""
    ratios = comparison["ratios"]
    if not ratios or "block" not in ratios[0]:
        return [r["ratio"] for r in ratios]
    grouped: dict[int, list[float]] = defaultdict(list)
    for r in ratios:
        grouped[r["block"]].append(r["ratio"])
    return [float(np.median(values)) for values in grouped.values()]


def finish(comparisons: list[dict[str, Any]], options: StatsOptions) -> list[dict[str, Any]]:
    """Correct the family's p-values (Holm), then decide each verdict and rounds needed."""
    adjusted = holm([c["p_value"] for c in comparisons])
    for comparison, p_adjusted in zip(comparisons, adjusted, strict=True):
        comparison["p_adjusted"] = p_adjusted
        units = unit_ratios(comparison)
        comparison["verdict"] = decide(
            len(units), comparison["ci_low"], comparison["ci_high"], p_adjusted, options
        )
        if comparison["n"] == 0:
            comparison["verdict"] = "no valid pairs"
            comparison.setdefault("why", "no pair of valid cells")
            continue
        if comparison["verdict"] == "inconclusive":
            needed = rounds_needed(
                units, options, family_size=sum(1 for p in adjusted if p is not None)
            )
            # Units are process pairs: more of them at the same length of block.
            per_unit = max(1, round(comparison["n"] / len(units))) if units else 1
            comparison["rounds_needed"] = None if needed is None else needed * per_unit
    return comparisons


def compare_matrix(
    index: CellIndex,
    *,
    variants: Sequence[str],
    baseline: str,
    contexts: Sequence[int],
    metric: Metric,
    options: StatsOptions,
) -> tuple[list[dict[str, Any]], int]:
    """Every (context, variant) against the baseline, corrected as one family."""
    comparisons = []
    mismatched = 0
    for context in contexts:
        for variant in variants:
            if variant == baseline:
                continue
            pairs, bad = pairs_for(index, variant, baseline, metric, context)
            mismatched += bad
            comparison = compare_pairs(
                pairs,
                context_tokens=context,
                variant=variant,
                baseline=baseline,
                seed=comparison_seed(options.seed, metric, context, variant, baseline),
                options=options,
            )
            if not pairs:
                comparison["why"] = no_pairs_why(index, variant, baseline, context, bad)
            comparisons.append(comparison)
    return finish(comparisons, options), mismatched


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    array = np.asarray(values, dtype=float)
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "min": float(array.min()),
        "max": float(array.max()),
    }


def describe(
    index: CellIndex, *, variants: Sequence[str], contexts: Sequence[int]
) -> list[dict[str, Any]]:
    """Per (context, variant): n and quartiles of prefill and decode tok/s, peak memory, and
    the flags the cells judged inert there (the request implied stock's execution)."""
    groups: dict[tuple[int, str], list[Record]] = defaultdict(list)
    for (_, variant, _, context), record in index.cells.items():
        groups[(context, variant)].append(record)
    rows = []
    for context in contexts:
        for variant in variants:
            records = groups.get((context, variant), [])
            memory = [r.peak_memory_bytes for r in records if r.peak_memory_bytes is not None]
            rows.append(
                {
                    "context_tokens": context,
                    "variant": variant,
                    "n": len(records),
                    "prefill_tps": _quantiles([r.prefill_tps for r in records if r.prefill_tps]),
                    "decode_tps": _quantiles(
                        [r.decode_tps for r in records if r.decode_tps is not None]
                    ),
                    "peak_memory_bytes": {
                        "median": int(np.median(memory)),
                        "max": int(max(memory)),
                    }
                    if memory
                    else None,
                    "inert": inert_flags(records),
                }
            )
    return rows


def inert_flags(records: Iterable[Record]) -> list[str]:
    """Flags any of these cells listed as inert (engine/judge.py: `counters["inert"]`)."""
    names: dict[str, None] = {}
    for record in records:
        listed = record.counters.get("inert")
        if isinstance(listed, str):
            names.update(dict.fromkeys(n for n in listed.split(",") if n))
    return list(names)


def inert_lines(summary: Mapping[str, Any]) -> list[str]:
    """One sentence per context where some variant's flags were inert, for summary.md and
    report.html."""
    by_context: dict[int, list[str]] = defaultdict(list)
    for row in summary["descriptive"]:
        if row.get("inert"):
            by_context[row["context_tokens"]].append(
                f"{row['variant']} ({', '.join(row['inert'])})"
            )
    return [
        f"{context} tokens: {'; '.join(entries)}: at this context the request implies what the "
        "stock value does, so these cells measured the stock execution"
        for context, entries in sorted(by_context.items())
    ]


def invalid_section(records: Iterable[Record], duplicates: Sequence[Record]) -> dict[str, Any]:
    """Cells kept out of statistics, counted per reason (warm-ups are expected, not invalid)."""
    cells = []
    for record in records:
        if record.status in ("invalid", "error"):
            reason = record.reason or record.status
        elif record.status == "ok" and record.round < 0:
            reason = "ok cell outside any round"
        else:
            continue
        cells.append(_invalid_cell(record, reason))
    cells.extend(_invalid_cell(r, "duplicate cell (the first was kept)") for r in duplicates)
    by_reason = Counter(cell["reason"] for cell in cells)
    return {
        "total": len(cells),
        "by_reason": dict(sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))),
        "cells": cells,
    }


def _invalid_cell(record: Record, reason: str) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "variant": record.variant,
        "round": record.round,
        "context_tokens": record.context_tokens,
        "status": record.status,
        "reason": reason[:300],
    }


def host_names(provenances: Sequence[Provenance]) -> dict[str, str]:
    """Each run's host as people should see it: its registered name, else its hostname, else
    the run id; a name shared by several runs gets the run id added, so columns differ."""
    names = {p.run_id: p.host.registered_name or p.host.hostname or p.run_id for p in provenances}
    shared = {name for name in names.values() if list(names.values()).count(name) > 1}
    return {
        run_id: f"{name} (run {run_id})" if name in shared else name
        for run_id, name in names.items()
    }


def _order_of_first_appearance(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def summarize(
    records: Sequence[Record],
    *,
    spec: JobSpec | None = None,
    baseline: str | None = None,
    features: Sequence[str] | None = None,
    provenances: Sequence[Provenance] = (),
    precision: float | None = None,
    seed: int | None = None,
    n_resamples: int = N_RESAMPLES,
    margin_threshold: float | None = None,
) -> dict[str, Any]:
    """summary.json's value for these records (pure; equal inputs give equal output).

    The baseline, ablation features, precision and seed come from `spec` unless given. Without a
    spec, `baseline` is required.
    """
    from evidence.ablation import ablation_section
    from evidence.drift import drift_section
    from evidence.parity import PARITY_MARGIN_THRESHOLD, parity_section
    from evidence.reproduction import reproduction_section

    if baseline is None:
        if spec is None:
            raise ValueError("summarize needs the job spec or the baseline variant's name")
        baseline = baseline_name(spec)
    if features is None:
        features = ablation_features(spec) if spec is not None else []
    else:
        features = [parse_feature(f)[0] for f in features]
    if precision is None:
        precision = spec.precision if spec is not None else DEFAULT_PRECISION
    if seed is None:
        seed = spec.seed if spec is not None else 0
    options = StatsOptions(precision=precision, seed=seed, n_resamples=n_resamples)

    measured = [r for r in records if r.round >= 0]
    # Records stamped with their process instance (process rotation): cluster-aware statistics
    # and the new sections. Older records keep exactly the summary they always had.
    by_process = any(r.process is not None for r in measured)
    planned = [v.name for v in expand_variants(spec)] if spec is not None else []
    variants = _order_of_first_appearance([*planned, baseline, *(r.variant for r in measured)])
    contexts = sorted(
        {*(spec.contexts if spec is not None else []), *(r.context_tokens for r in measured)}
    )
    index = CellIndex.of(records)
    comparisons, mismatched = compare_matrix(
        index,
        variants=variants,
        baseline=baseline,
        contexts=contexts,
        metric="prefill_tps",
        options=options,
    )
    decode_comparisons, _ = compare_matrix(
        index,
        variants=variants,
        baseline=baseline,
        contexts=contexts,
        metric="decode_tps",
        options=options,
    )
    run_ids = _order_of_first_appearance(r.run_id for r in records)
    hosts = host_names(provenances)
    invalid = invalid_section(records, index.duplicates)
    invalid["pairs_with_different_prompts"] = mismatched
    settings = options.settings()
    if by_process:
        settings["process_blocks"] = dict(PROCESS_BLOCK_SETTINGS)
    extra: dict[str, Any] = {}
    if spec is not None and spec.mode == "history":
        from evidence.history import history_section

        extra["history"] = history_section(
            spec=spec, comparisons=comparisons, contexts=contexts, provenances=provenances
        )
    if spec is not None and spec.mode == "bisect":
        from evidence.bisect import bisect_section

        extra["bisect"] = bisect_section(
            spec=spec, comparisons=comparisons, provenances=provenances
        )
    summary: dict[str, Any] = {
        **extra,
        "format": SUMMARY_FORMAT,
        "mode": spec.mode if spec is not None else ("ablation" if features else "ab"),
        "baseline": baseline,
        "variants": variants,
        "contexts": contexts,
        "features": list(features),
        "settings": settings,
        "runs": [
            {
                "run_id": run_id,
                "host": hosts.get(run_id),
                "records": sum(1 for r in records if r.run_id == run_id),
                "ok": sum(1 for key in index.cells if key[0] == run_id),
            }
            for run_id in run_ids
        ],
        "warmups": sum(1 for r in records if r.status == "warmup"),
        "descriptive": describe(index, variants=variants, contexts=contexts),
        "comparisons": comparisons,
        "decode_comparisons": decode_comparisons,
        "ablation": ablation_section(index, features=features, contexts=contexts, options=options),
        "parity": parity_section(
            index,
            variants=variants,
            baseline=baseline,
            margin_threshold=PARITY_MARGIN_THRESHOLD
            if margin_threshold is None
            else margin_threshold,
        ),
        "drift": drift_section(
            index,
            baseline=baseline,
            variants=variants,
            comparisons=comparisons,
            options=options,
            per_context=by_process,
        ),
        "reproductions": reproduction_section(
            index,
            run_ids=run_ids,
            hosts=hosts,
            variants=variants,
            baseline=baseline,
            contexts=contexts,
            options=options,
        ),
        "invalid": invalid,
    }
    if by_process:
        summary["noise_floor"] = noise_floor(comparisons)
    return summary


PROCESS_BLOCK_SETTINGS: dict[str, str] = {
    "unit": "process pair: the pairs measured by one process of the variant and one of the "
    "baseline (records' `process`)",
    "interval": "hull of a two-stage bootstrap (process pairs, then pairs within them) of the "
    "median ratio and the order-statistic interval of the process pairs' median ratios",
    "test": "Wilcoxon signed-rank, two-sided, on the log median ratio of each process pair",
}


def noise_floor(comparisons: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What this run can resolve: the between-process spread of the ratio (SD of the process
    pairs' log median ratios) and the half-width of the intervals (an effect smaller than it
    cannot exclude 1), medians over the comparisons that have them."""
    spreads = [c["process_sd"] for c in comparisons if c.get("process_sd") is not None]
    widths = [
        (c["ci_high"] - c["ci_low"]) / 2
        for c in comparisons
        if c.get("ci_low") is not None and c.get("ci_high") is not None
    ]
    blocks = [c["blocks"] for c in comparisons if c.get("blocks")]
    if not blocks:
        return None
    return {
        "process_pairs": int(np.median(blocks)),
        "rounds_per_process_pair": float(
            np.median([c["n"] / c["blocks"] for c in comparisons if c.get("blocks")])
        ),
        "between_process_sd": float(np.median(spreads)) if spreads else None,
        "resolvable": float(np.median(widths)) if widths else None,
        "rule": "between_process_sd: median over comparisons of the SD of each process pair's "
        "log median ratio; resolvable: median half-width of the 95% intervals (a smaller "
        "effect cannot be told from 1)",
    }


def how_to_read(settings: Mapping[str, Any]) -> list[str]:
    """The verdict rules in plain words, for summary.md and report.html."""
    precision_pct = f"{100 * settings['precision']:g}%"
    level = f"{100 * settings['confidence_level']:g}%"
    lines = [
        "Each ratio is the variant's tok/s over the baseline's on the same prompt in the same "
        "round (paired); above 1 is faster. The table shows the median ratio and a "
        f"{level} interval of that median (a seeded bootstrap, widened where needed to the "
        "distribution-free order-statistic interval, so the level holds with few pairs).",
        f"faster / slower: the interval excludes 1 and the signed-rank p-value, corrected "
        f"(Holm) across the whole matrix, is below {settings['alpha']:g}.",
        f"no established change: the interval includes 1 and lies within 1 +- "
        f"{precision_pct}, so any change larger than {precision_pct} is ruled out; a smaller "
        "one is not.",
        f"inconclusive: fewer than {settings['min_pairs']} pairs, or an interval too wide for "
        f"+-{precision_pct} (the rounds that would reach it are estimated from the observed "
        "spread), or an interval and a corrected test that disagree. An interval that includes "
        "1 establishes nothing more than that.",
        "no valid pairs: no round had valid cells of both the variant and the baseline at "
        "that context; the row says which side had none and why its cells were set aside.",
        "Invalid cells (cached tokens, wrong prompt length, errors, silent no-ops) never enter "
        "the statistics; they are counted per reason. Ablation ratios (all / all-minus-f) "
        "interact and are not additive.",
    ]
    if "process_blocks" in settings:
        lines.insert(
            1,
            "Each variant ran in a fresh process every few rounds, and a process has a speed "
            "offset of its own (about 1% between identical processes), so the independent "
            "unit is the process pair, not the round: the interval resamples process pairs and "
            "then pairs within them, and the test ranks the process pairs' median ratios. The "
            "noise floor under the prefill table says how much processes differed and how small "
            "an effect this run can resolve.",
        )
    return lines


def verdict_counts(comparisons: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return dict(Counter(c["verdict"] for c in comparisons))
