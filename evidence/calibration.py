"""A host's calibration: how small an effect this host resolves, measured once per host.

`coldbench calibrate` runs N A/A jobs of three identical variants and N jobs whose third
variant carries a planted effect (a chunk width known to cost a few percent), each through the
same run machinery as `coldbench run`, and reduces their summaries to a `HostCalibration`:

- `aa_claims`: A/A jobs where any comparison was called `faster` or `slower` (should be at or
  below 5% of `aa_jobs`: identical code must not be called different);
- `planted_detected`: planted jobs where the planted variant got `faster` or `slower`
  (`planted_verdicts` counts each verdict, so a direction can be checked);
- `resolvable`: the median half-width of the A/A jobs' 95% intervals (as a fraction): the
  smallest effect this host can tell from 1 at this model, context and number of rounds;
- `between_process_sd`: the median between-process spread of the A/A ratios.

The agent reports it to the server (`PUT /api/v1/workers/calibration`) and /hosts shows it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np
from pydantic import ConfigDict, Field

from evidence.boundary import Checked, Paragraph
from evidence.schemas import FlagValue, HostInfo
from evidence.summary_schema import Summary, decisive_interval

CALIBRATION_SCHEMA: Final = "coldbench.calibration/1"
CLAIMS = ("faster", "slower")


class _Strict(Checked):
    model_config = ConfigDict(extra="forbid")


class CalibrationComparison(_Strict):
    context_tokens: int
    variant: str
    n: int
    blocks: int | None = None
    ratio_median: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str
    # below the confidence level only (too few pairs for it): evidence.stats
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
    statistics: dict[str, str] = Field(default_factory=dict)  # summary settings' process_blocks
    aa_jobs: int = Field(ge=0)
    aa_claims: int = Field(ge=0)
    planted_jobs: int = Field(ge=0)
    planted_detected: int = Field(ge=0)
    planted_verdicts: dict[str, int] = Field(default_factory=dict)
    resolvable: float | None = Field(None, ge=0)
    between_process_sd: float | None = Field(None, ge=0)
    jobs: list[CalibrationJob] = Field(default_factory=list, max_length=1000)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def lines(self) -> list[str]:
        """What `coldbench calibrate` prints and /hosts shows, one finding per line."""
        return calibration_lines(self)


def _pct(count: int, total: int) -> str:
    return f"{100 * count / total:.0f}%" if total else "n/a"


def calibration_lines(result: HostCalibration) -> list[str]:
    planted = ", ".join(f"{k}={v}" for k, v in sorted(result.planted_flags.items())) or "none"
    verdicts = ", ".join(f"{v} {n}" for v, n in sorted(result.planted_verdicts.items()))
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
    seeds = [job.seed for r in results for job in r.jobs]
    if len(set(seeds)) != len(seeds):
        raise ValueError("cannot merge calibrations that share job seeds (give each --seed apart)")
    return calibrate_result(
        jobs=[job for r in results for job in r.jobs],
        created_at=min(r.created_at for r in results),
        host=first.host,
        **{key: getattr(first, key) for key in keys},
    )
