"""A host's calibration: how small an effect this host resolves, measured once per host.

`coldbench calibrate` (worker/calibrate.py) runs N runs of identical variants a, b, c beside a
variant p with a planted effect (a chunk width known to cost a few percent), each through the
same run machinery as `coldbench run`; each run is read as an A/A/A job (a, b, c) and a planted
job (a, b, p). Their summaries reduce to a `HostCalibration`:

- `aa_claims`: A/A jobs where any comparison was called `faster` or `slower` (should be at or
  below 5% of `aa_jobs`: identical code must not be called different);
- `planted_detected`: planted jobs where the planted variant got `faster` or `slower`
  (`planted_verdicts` counts each verdict, so a direction can be checked);
- `resolvable`: the median half-width of the A/A jobs' 95% intervals (as a fraction): the
  smallest effect this host can tell from 1 at this model, context and number of rounds;
- `between_process_sd`: the median between-process spread of the A/A ratios;
- `variance` and `noise`: one analysis of variance of every run's paired log ratios by process
  pair (`VarianceSums`), and what it gives this host's runs (`HostNoise`): the process-pair
  component with its one-sided 95% upper bound and the spread within process pairs. A runs'
  statistics count pairs with the design effect that bound implies
  (coldbench.evidence.analysis.stats), and its blocks are as long as the bound makes cheapest
  (`block_length`). Each calibration job's verdicts use the noise of the other runs only, so no job
  is judged by a bound it set.

The agent reports it to the server (`PUT /api/v1/workers/calibration`) and /hosts shows it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np
from pydantic import ConfigDict, Field

from coldbench.evidence.contract.boundary import Checked, Paragraph
from coldbench.evidence.contract.schemas import FlagValue, HostInfo, HostNoise
from coldbench.evidence.contract.spec_text import flags_text
from coldbench.evidence.contract.summary_schema import CLAIMS, Summary, decisive_interval

CALIBRATION_SCHEMA: Final = "coldbench.calibration/1"
# One-sided confidence of the process-pair bound a calibration gives its host's runs.
NOISE_CONFIDENCE = 0.95
# A calibrated host's runs keep at least this many blocks: their own process pairs check the
# calibration (evidence.analysis.stats.design_effect_interval's F test).
MIN_CALIBRATED_BLOCKS = 10


def _f_distribution() -> Any:
    """scipy's F distribution, imported on first use: this module is part of the worker
    protocol's types (coldbench.evidence.contract.protocol), which every API process, Celery worker
    and command imports at start, and scipy.stats costs more than the rest of their imports
    together."""
    from scipy import stats

    return stats.f


class _Strict(Checked):
    model_config = ConfigDict(extra="forbid")


class VarianceSums(_Strict):
    """One-way analysis of variance of paired log ratios by process pair: the between- and
    within-pairs sums of squares with their degrees of freedom, and the effective pairs per
    process pair (`m0`, the n0 of unequal sizes). Sums of several comparisons add up."""

    ss_between: float = Field(ge=0, allow_inf_nan=False)
    df_between: int = Field(ge=0)
    ss_within: float = Field(ge=0, allow_inf_nan=False)
    df_within: int = Field(ge=0)
    m0: float = Field(gt=0, allow_inf_nan=False)
    comparisons: int = Field(1, ge=1)  # analyses pooled: process pairs = df_between + this

    def __add__(self, other: VarianceSums) -> VarianceSums:
        df_between = self.df_between + other.df_between
        m0 = (self.m0 * self.df_between + other.m0 * other.df_between) / max(df_between, 1)
        return VarianceSums(
            ss_between=self.ss_between + other.ss_between,
            df_between=df_between,
            ss_within=self.ss_within + other.ss_within,
            df_within=self.df_within + other.df_within,
            m0=m0,
            comparisons=self.comparisons + other.comparisons,
        )

    @property
    def within_variance(self) -> float | None:
        return self.ss_within / self.df_within if self.df_within >= 1 else None

    def f_ratio(self) -> float | None:
        within = self.within_variance
        if self.df_between < 1 or not within:
            return None
        return (self.ss_between / self.df_between) / within

    def process_variance(self, *, upper: float | None = None) -> float | None:
        """The variance a process pair adds to a log ratio (tau^2): the method-of-moments
        estimate, or with `upper` (e.g. 0.95) its one-sided upper confidence bound from the F
        distribution of the mean squares' ratio. None without both kinds of freedom."""
        f, within = self.f_ratio(), self.within_variance
        if f is None or within is None:
            return None
        if upper is not None:
            f = f / float(_f_distribution().ppf(1 - upper, self.df_between, self.df_within))
        return max(0.0, (f - 1) / self.m0) * within

    def p_value(self) -> float | None:
        """P of an F this large with no process component."""
        f = self.f_ratio()
        if f is None:
            return None
        return float(_f_distribution().sf(f, self.df_between, self.df_within))


def noise_of(
    sums: VarianceSums | None,
    *,
    load_s: float | None = None,
    cell_s_per_token: float | None = None,
    contexts: Sequence[int] = (),
    model: str | None = None,
    calibrated_at: datetime | None = None,
) -> HostNoise | None:
    """The host's noise from its calibration's variance sums (None without within-pair
    freedom or without two process pairs)."""
    within = sums.within_variance if sums is not None else None
    point = sums.process_variance() if sums is not None else None
    upper = sums.process_variance(upper=NOISE_CONFIDENCE) if sums is not None else None
    if sums is None or not within or point is None or upper is None:
        return None
    units = sums.df_between + sums.comparisons
    return HostNoise(
        process_pair_sd=min(1.0, math.sqrt(point)),
        process_pair_sd_upper=min(1.0, math.sqrt(upper)),
        pair_sd=min(1.0, math.sqrt(within)),
        process_pairs=max(2, units),
        pairs=max(2, sums.df_within + units),
        load_s=load_s,
        cell_s_per_token=cell_s_per_token,
        contexts=sorted(set(contexts)),
        model=model,
        calibrated_at=calibrated_at,
    )


def _cell_s(contexts: Sequence[int], noise: HostNoise) -> float:
    """Seconds of one cell at each context, summed (one variant's share of a round)."""
    return sum(noise.cell_s_per_token * c for c in contexts) if noise.cell_s_per_token else 0.0


def block_start_s(
    *, contexts: Sequence[int], variants: int, noise: HostNoise, in_turns: bool = False
) -> float:
    """Seconds a block start costs on this host: side by side, the variants' processes load
    together (one load, the calibration's `load_s`) and warm up one after another; in turns,
    each variant's turn is a start of its own, so a block pays a load per variant."""
    load_s = noise.load_s or 0.0
    warmups_s = variants * _cell_s(contexts, noise)
    return (variants if in_turns else 1) * load_s + warmups_s


def rounds_cost_s(
    rounds: int, rounds_per_process: int | None, *, start_s: float, round_s: float
) -> float:
    """Seconds `rounds` in blocks of `rounds_per_process` (None: one block) cost where a block
    start costs `start_s` (in turns, every turn's start) and a round `round_s`."""
    if rounds < 1:
        return 0.0
    blocks = math.ceil(rounds / (rounds_per_process or rounds))
    return blocks * start_s + rounds * round_s


def run_cost_s(
    rounds: int,
    rounds_per_process: int | None,
    *,
    contexts: Sequence[int],
    variants: int,
    noise: HostNoise,
    in_turns: bool = False,
) -> float:
    """Seconds a run of `rounds` in blocks of `rounds_per_process` (None: one block) costs
    on this host by its calibration: every block's start (`block_start_s`) and every round's
    cells."""
    start_s = block_start_s(contexts=contexts, variants=variants, noise=noise, in_turns=in_turns)
    return rounds_cost_s(
        rounds, rounds_per_process, start_s=start_s, round_s=variants * _cell_s(contexts, noise)
    )


def block_length(
    rounds: int,
    *,
    contexts: Sequence[int],
    variants: int,
    noise: HostNoise,
    in_turns: bool = False,
) -> tuple[int, str]:
    """Rounds per process for a job on a calibrated host, and why.

    A block start costs S (`block_start_s`: the load, once side by side and once per variant in
    turns, and a warm-up per variant and context), a round costs c (a cell per variant and
    context), and the pairs of one process pair share its offset, so the variance of their
    ratios grows by the design effect 1 + (L - 1) rho. For a given precision the time
    (1 + (L - 1) rho)(c + S / L) is least at L = sqrt(S (1 - rho) / (rho c)), the classic
    optimal cluster size; rho uses the calibration's upper bound. At least
    MIN_CALIBRATED_BLOCKS blocks, so the run's own process pairs check the calibration."""
    tau2 = noise.process_pair_sd_upper**2
    rho = tau2 / (tau2 + noise.pair_sd**2)
    start_s = block_start_s(contexts=contexts, variants=variants, noise=noise, in_turns=in_turns)
    round_s = variants * _cell_s(contexts, noise)
    share = f"a process pair adds at most {100 * rho:.1f}% of a paired ratio's variance"
    if rho > 0 and round_s > 0:
        best = math.sqrt(start_s * (1 - rho) / (rho * round_s))
        why = (
            f"{share}; a block start costs about {start_s:.0f} s"
            f"{f' ({variants} turn starts)' if in_turns else ''} against {round_s:.1f} s a "
            f"round, and sqrt(S (1 - rho) / (rho c)) = {best:.1f} rounds a block cost least"
        )
    else:
        best = float(rounds)
        why = f"{share}: as few blocks as the check of the calibration allows"
    blocks = min(rounds, max(MIN_CALIBRATED_BLOCKS, round(rounds / best)))
    length = math.ceil(rounds / blocks)
    rounds_text = f"{length} round{'s' if length != 1 else ''}"
    return length, f"{rounds_text} per process from this host's calibration ({why})"


class CalibrationComparison(_Strict):
    context_tokens: int
    variant: str
    n: int
    blocks: int | None = None
    ratio_median: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str
    # below the confidence level only (too few pairs for it): coldbench.evidence.analysis.stats
    ci_level: float | None = None


class CalibrationJob(_Strict):
    kind: Literal["aa", "planted"]
    seed: int
    status: str
    reason: Paragraph | None = None
    evidence_id: str | None = None
    between_process_sd: float | None = None  # the job's noise floor (summary `noise_floor`)
    statistics: dict[str, str] = Field(default_factory=dict)  # summary settings' process_blocks
    comparisons: list[CalibrationComparison] = Field(default_factory=list)


class HostCalibration(_Strict):
    """The result file of `coldbench calibrate` and the body of the report to the server."""

    schema_: Literal["coldbench.calibration/1"] = Field(CALIBRATION_SCHEMA, alias="schema")
    created_at: datetime
    host: HostInfo
    model: str = Field(max_length=200)
    contexts: list[int] = Field(min_length=1, max_length=64)
    rounds: int = Field(ge=1)
    rounds_per_process: int | None = Field(None, ge=1)
    variants: int = Field(3, ge=2, le=3)
    decode_tokens: int = Field(ge=0)
    base_flags: dict[str, FlagValue] = Field(default_factory=dict)
    planted_flags: dict[str, FlagValue] = Field(default_factory=dict)
    # the variant with the planted flags: "p" beside a, b, c; "c" in results of earlier jobs
    planted_variant: str = Field("c", max_length=64)
    statistics: dict[str, str] = Field(default_factory=dict)  # summary settings' process_blocks
    aa_jobs: int = Field(ge=0)
    aa_claims: int = Field(ge=0)
    planted_jobs: int = Field(ge=0)
    planted_detected: int = Field(ge=0)
    planted_verdicts: dict[str, int] = Field(default_factory=dict)
    resolvable: float | None = Field(None, ge=0)
    between_process_sd: float | None = Field(None, ge=0)
    # The variance components of every run's comparisons and the noise they give this host's
    # runs (coldbench.evidence.contract.schemas.HostNoise); None in results from before they were
    # kept.
    variance: VarianceSums | None = None
    noise: HostNoise | None = None
    jobs: list[CalibrationJob] = Field(default_factory=list, max_length=1000)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def lines(self) -> list[str]:
        """What `coldbench calibrate` prints and /hosts shows, one finding per line."""
        return calibration_lines(self)


def _pct(count: int, total: int) -> str:
    return f"{100 * count / total:.0f}%" if total else "n/a"


def _no_job_had_an_interval(result: HostCalibration) -> bool:
    """Some job measured, none had an interval: a job whose rounds give fewer process pairs than
    an interval needs can be called neither way, so its `inconclusive` says nothing of the host."""
    measured = [job for job in result.jobs if job.status == "succeeded"]
    return bool(measured) and not any(
        c.ci_low is not None for job in measured for c in job.comparisons
    )


def calibration_lines(result: HostCalibration) -> list[str]:
    planted = flags_text(result.planted_flags, empty="none")
    verdicts = ", ".join(f"{v} {n}" for v, n in sorted(result.planted_verdicts.items()))
    if _no_job_had_an_interval(result):
        blocks = (
            f"{result.rounds} rounds in blocks of {result.rounds_per_process}"
            if result.rounds_per_process
            else f"{result.rounds} rounds"
        )
        lines = [
            f"A/A and planted verdicts: none possible ({blocks}: no job had the process pairs "
            "an interval needs); this calibration gives the host's noise only"
        ]
    else:
        lines = [
            f"A/A jobs with a faster/slower verdict: {result.aa_claims} of {result.aa_jobs} "
            f"({_pct(result.aa_claims, result.aa_jobs)})",
            f"planted effect ({planted}) detected: {result.planted_detected} of "
            f"{result.planted_jobs}" + (f" ({verdicts})" if verdicts else ""),
        ]
    if result.resolvable is not None:
        lines.append(
            f"smallest effect this host resolves: +-{100 * result.resolvable:.2f}% "
            f"(median half-width of the A/A 95% intervals, {result.rounds} rounds, "
            f"contexts {', '.join(map(str, result.contexts))})"
        )
    else:
        lines.append("smallest effect this host resolves: unknown (no A/A interval)")
    if result.between_process_sd is not None:
        lines.append(
            f"between-process spread of the ratio: {100 * result.between_process_sd:.2f}% (SD)"
        )
    if result.noise is not None:
        noise = result.noise
        lines.append(
            f"variance components: a process pair adds {100 * noise.process_pair_sd:.2f}% (SD; "
            f"at most {100 * noise.process_pair_sd_upper:.2f}%, one-sided 95%) to a paired "
            f"ratio, pairs within one spread {100 * noise.pair_sd:.2f}% "
            f"({noise.process_pairs} process pairs, {noise.pairs} pairs)"
        )
    return lines


def job_of(
    *,
    kind: Literal["aa", "planted"],
    seed: int,
    status: str,
    reason: str | None,
    evidence_id: str | None,
    summary: Summary | None,
) -> CalibrationJob:
    """One job's verdicts, from its summary (None when nothing was measured)."""
    comparisons = [
        CalibrationComparison(
            context_tokens=c.context_tokens,
            variant=c.variant,
            n=c.n,
            blocks=c.blocks,
            ratio_median=c.ratio_median,
            ci_low=c.ci_low,
            ci_high=c.ci_high,
            verdict=c.verdict,
            ci_level=c.ci_level,
        )
        for c in (summary.comparisons if summary else [])
    ]
    floor = summary.noise_floor if summary else None
    blocks = summary.settings.process_blocks if summary else None
    return CalibrationJob(
        kind=kind,
        seed=seed,
        status=status,
        reason=reason,
        evidence_id=evidence_id,
        between_process_sd=floor.between_process_sd if floor else None,
        statistics=blocks.model_dump() if blocks else {},
        comparisons=comparisons,
    )


def calibrate_result(
    *, jobs: Sequence[CalibrationJob], planted_variant: str = "c", **fields: Any
) -> HostCalibration:
    """Reduce the jobs to the host's calibration (`fields`: the rest of `HostCalibration`)."""
    aa = [job for job in jobs if job.kind == "aa"]
    planted = [job for job in jobs if job.kind == "planted"]
    planted_verdicts: Counter[str] = Counter()
    for job in planted:
        for c in job.comparisons:
            if c.variant == planted_variant:
                planted_verdicts[c.verdict] += 1
    detected = sum(
        any(c.variant == planted_variant and c.verdict in CLAIMS for c in job.comparisons)
        for job in planted
    )
    # only 95% intervals: a [min, max] of a few pairs says nothing of what this host resolves
    intervals = [
        found for job in aa for c in job.comparisons if (found := decisive_interval(c)) is not None
    ]
    widths = [(high - low) / 2 for low, high in intervals]
    spreads = [job.between_process_sd for job in aa if job.between_process_sd is not None]
    statistics = next((job.statistics for job in jobs if job.statistics), {})
    return HostCalibration(
        planted_variant=planted_variant,
        aa_jobs=len(aa),
        aa_claims=sum(any(c.verdict in CLAIMS for c in job.comparisons) for job in aa),
        planted_jobs=len(planted),
        planted_detected=detected,
        planted_verdicts=dict(planted_verdicts),
        resolvable=float(np.median(widths)) if widths else None,
        between_process_sd=float(np.median(spreads)) if spreads else None,
        statistics=dict(statistics),
        jobs=list(jobs),
        **fields,
    )


def merge_calibrations(results: Sequence[HostCalibration]) -> HostCalibration:
    """Several calibrations of one host and setting (e.g. one per GPU of a machine, run side
    by side to save time) as one: their jobs together. Refuses results of other settings."""
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    keys = (
        "planted_variant",
        "model",
        "contexts",
        "rounds",
        "rounds_per_process",
        "variants",
        "decode_tokens",
        "base_flags",
        "planted_flags",
    )
    for other in results[1:]:
        for key in keys:
            if getattr(other, key) != getattr(first, key):
                raise ValueError(
                    f"cannot merge calibrations with different {key}: "
                    f"{getattr(first, key)!r} and {getattr(other, key)!r}"
                )
    seeds = [(job.kind, job.seed) for r in results for job in r.jobs]
    if len(set(seeds)) != len(seeds):
        raise ValueError("cannot merge calibrations that share job seeds (give each --seed apart)")
    variance = None
    if all(r.variance is not None for r in results):
        for r in results:
            assert r.variance is not None
            variance = r.variance if variance is None else variance + r.variance
    noises = [r.noise for r in results if r.noise is not None]
    loads = [n.load_s for n in noises if n.load_s is not None]
    per_token = [n.cell_s_per_token for n in noises if n.cell_s_per_token is not None]
    created_at = min(r.created_at for r in results)
    noise = noise_of(
        variance,
        load_s=float(np.median(loads)) if loads else None,
        cell_s_per_token=float(np.median(per_token)) if per_token else None,
        contexts=first.contexts,
        model=first.model,
        calibrated_at=created_at,
    )
    fields = {key: getattr(first, key) for key in keys if key != "planted_variant"}
    return calibrate_result(
        jobs=[job for r in results for job in r.jobs],
        planted_variant=first.planted_variant,
        created_at=created_at,
        host=first.host,
        variance=variance,
        noise=noise,
        **fields,
    )
