"""Drift: does the machine change speed during a run, and do bracketing controls agree?

Trend. Per run, the baseline's `ok` cells give log(prefill tok/s) minus the mean log tok/s of
the baseline at the same context (so contexts of different speed share one line), against the
cell's start time in hours. A least-squares line gives the slope; `slope_pct_per_hour` is
100 x (exp(slope) - 1) with a 95% t interval, and `drift_pct_across_run` is the change the line
predicts from the first to the last baseline cell. A run is `flagged` when that change exceeds
the smallest effect being claimed (the smallest |ratio - 1| among `faster`/`slower` prefill
verdicts) or, when nothing is claimed, the requested precision. For runs whose records carry
process instances (every context warmed in every process), each run also gets one line per
context (`by_context`, the same fit on that context's cells alone), and the run is flagged when
any of them is: a context whose first cells paid for compilation drifts on its own.

Bracketing. Each candidate cell is divided by the mean tok/s of the baseline cells of the same
run and context immediately before and after it in time (one side when it is first or last).
Per (context, variant) the median of those ratios, with the same bootstrap interval as the
paired ratios. Paired and bracketing ratios that disagree point at drift within rounds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from coldbench.evidence.analysis.stats import (
    CellIndex,
    StatsOptions,
    comparison_seed,
    interval_level,
    median_interval,
)
from coldbench.evidence.contract.schemas import Record
from coldbench.evidence.contract.summary_schema import (
    CLAIMS,
    Bracketing,
    Comparison,
    ContextDrift,
    Drift,
    RunDrift,
    level_field,
)


def as_utc(moment: datetime) -> datetime:
    """Records without a timezone are taken as UTC (the runner writes UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _by_run(index: CellIndex, variant: str) -> dict[str, list[Record]]:
    runs: dict[str, list[Record]] = defaultdict(list)
    for (run_id, _, _), record in index.of_variant(variant).items():
        if record.prefill_tps:
            runs[run_id].append(record)
    for records in runs.values():
        records.sort(key=lambda r: as_utc(r.started_at))
    return runs


def _pct(log_rate: float) -> float:
    # A run of seconds extrapolated to an hour can overflow a float: clamp (exp(700) ~ 1e304).
    return 100 * math.expm1(max(-700.0, min(700.0, log_rate)))


def trend(records: Sequence[Record], threshold_pct: float) -> dict[str, Any]:
    """The baseline's drift line over one run's wall time: the fields of a `DriftLine`, the
    fit's only where there were baseline cells to fit (summary_schema: set fields only)."""
    if not records:
        return {"n": 0, "slope_pct_per_hour": None, "flagged": False}
    logs_by_context: dict[int, list[float]] = defaultdict(list)
    for record in records:
        logs_by_context[record.context_tokens].append(math.log(record.prefill_tps or 1.0))
    means = {context: float(np.mean(values)) for context, values in logs_by_context.items()}
    start = as_utc(records[0].started_at)
    hours = np.array([(as_utc(r.started_at) - start).total_seconds() / 3600 for r in records])
    residuals = np.array(
        [math.log(r.prefill_tps or 1.0) - means[r.context_tokens] for r in records]
    )
    span_h = float(hours.max() - hours.min())
    result: dict[str, Any] = {
        "n": len(records),
        "span_hours": span_h,
        "slope_pct_per_hour": None,
        "slope_ci_low": None,
        "slope_ci_high": None,
        "drift_pct_across_run": None,
        "threshold_pct": threshold_pct,
        "flagged": False,
    }
    if len(records) < 3 or span_h <= 0:
        return result
    from scipy import stats  # on first use: every API process imports this module at start

    fit = stats.linregress(hours, residuals)
    t_crit = float(stats.t.ppf(0.975, len(records) - 2))
    slope, stderr = float(fit.slope), float(fit.stderr)
    across = _pct(slope * span_h)
    result.update(
        slope_pct_per_hour=_pct(slope),
        slope_ci_low=_pct(slope - t_crit * stderr),
        slope_ci_high=_pct(slope + t_crit * stderr),
        drift_pct_across_run=across,
        flagged=abs(across) > threshold_pct,
    )
    return result


def _neighbours(controls: Sequence[tuple[datetime, Record]], moment: datetime) -> list[Record]:
    """The last control (in record order) that started before `moment` and the first that
    started after it; `controls` carry their start times, converted once per run."""
    before = after = None
    for started, record in controls:
        if started < moment:
            before = record
        elif after is None and started > moment:
            after = record
    return [r for r in (before, after) if r is not None]


def bracketing(
    index: CellIndex, *, baseline: str, variants: Sequence[str], options: StatsOptions
) -> list[Bracketing]:
    controls: dict[tuple[str, int], list[tuple[datetime, Record]]] = defaultdict(list)
    for run_id, records in _by_run(index, baseline).items():
        for record in records:
            controls[(run_id, record.context_tokens)].append((as_utc(record.started_at), record))
    rows = []
    for variant in variants:
        if variant == baseline:
            continue
        ratios: dict[int, list[float]] = defaultdict(list)
        for run_id, records in _by_run(index, variant).items():
            for record in records:
                around = _neighbours(
                    controls.get((run_id, record.context_tokens), []), as_utc(record.started_at)
                )
                if around and record.prefill_tps:
                    reference = float(np.mean([r.prefill_tps or 0.0 for r in around]))
                    if reference > 0:
                        ratios[record.context_tokens].append(record.prefill_tps / reference)
        for context in sorted(ratios):
            values = ratios[context]
            low, high = median_interval(
                values,
                seed=comparison_seed(options.seed, "bracketing", context, variant),
                options=options,
            )
            level = interval_level(len(values), options.confidence_level)
            rows.append(
                Bracketing(
                    context_tokens=context,
                    variant=variant,
                    n=len(values),
                    ratio_median=float(np.median(values)),
                    ci_low=low,
                    ci_high=high,
                    **level_field(
                        level if low is not None and level < options.confidence_level else None
                    ),
                )
            )
    return sorted(rows, key=lambda row: (row.context_tokens, variants.index(row.variant)))


def drift_section(
    index: CellIndex,
    *,
    baseline: str,
    variants: Sequence[str],
    comparisons: Sequence[Comparison],
    options: StatsOptions,
    per_context: bool = False,
) -> Drift:
    """summary.json's `drift` (the module docstring)."""
    claimed = [
        abs(c.ratio_median - 1)
        for c in comparisons
        if c.verdict in CLAIMS and c.ratio_median is not None
    ]
    threshold_pct = 100 * (min(claimed) if claimed else options.precision)
    runs: list[RunDrift] = []
    for run_id, records in sorted(_by_run(index, baseline).items()):
        line = trend(records, threshold_pct)
        if per_context:
            by_context = [
                ContextDrift(
                    context_tokens=context,
                    **trend([r for r in records if r.context_tokens == context], threshold_pct),
                )
                for context in sorted({r.context_tokens for r in records})
            ]
            # A context whose first cells paid for compilation drifts on its own.
            line["flagged"] = line["flagged"] or any(c.flagged for c in by_context)
            line["by_context"] = by_context
        runs.append(RunDrift(run_id=run_id, **line))
    return Drift(
        threshold_pct=threshold_pct,
        threshold_source="smallest claimed effect" if claimed else "requested precision",
        flagged=any(run.flagged for run in runs),
        runs=runs,
        bracketing=bracketing(index, baseline=baseline, variants=variants, options=options),
    )
