"""Reproductions: the same job run on several hosts, compared host by host.

Each run's records are analysed alone (its own pairs, corrected within the run). For each
(context, variant) the hosts' results sit side by side with the test of their difference
(coldbench.evidence.analysis.agreement): `agree` is false where the hosts measure different effects
(a host difference, or drift) rather than noise around one effect, None where a run had too few
pairs for a 95% interval (its `ci_level` set) and was not tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coldbench.evidence.analysis.agreement import RULE, HostResult, host_agreement
from coldbench.evidence.analysis.stats import CellIndex, StatsOptions, compare_matrix
from coldbench.evidence.contract.summary_schema import (
    ReproductionRow,
    ReproductionRun,
    Reproductions,
    level_field,
)


def reproduction_section(
    index: CellIndex,
    *,
    run_ids: Sequence[str],
    hosts: Mapping[str, str | None],
    variants: Sequence[str],
    baseline: str,
    contexts: Sequence[int],
    options: StatsOptions,
) -> Reproductions | None:
    """summary.json's `reproductions`, or None for a single run."""
    if len(run_ids) < 2:
        return None
    per_run = {}
    for run_id in run_ids:
        sub = CellIndex(cells={k: v for k, v in index.cells.items() if k[0] == run_id})
        per_run[run_id], _ = compare_matrix(
            sub,
            variants=variants,
            baseline=baseline,
            contexts=contexts,
            metric="prefill_tps",
            options=options,
        )
    drafts = []
    for position, first in enumerate(per_run[run_ids[0]]):
        results = [
            ReproductionRun(
                run_id=run_id,
                host=hosts.get(run_id),
                n=comparison.n,
                ratio_median=comparison.ratio_median,
                ci_low=comparison.ci_low,
                ci_high=comparison.ci_high,
                p_adjusted=comparison.p_adjusted,
                verdict=comparison.verdict,
                **_levels(comparison.ci_level, comparison.interval_level, comparison.blocks),
            )
            for run_id in run_ids
            for comparison in (per_run[run_id][position],)
        ]
        drafts.append((first, results))
    outcomes = host_agreement(
        [[host_result(r) for r in results] for _, results in drafts],
        confidence_level=options.confidence_level,
        alpha=options.alpha,
    )
    rows = [
        ReproductionRow(
            context_tokens=first.context_tokens,
            variant=first.variant,
            baseline=baseline,
            runs=results,
            agree=outcome.agree,
            test=outcome.test,
            statement=outcome.statement,
        )
        for (first, results), outcome in zip(drafts, outcomes, strict=True)
    ]
    return Reproductions(
        rule=RULE,
        comparisons=rows,
        all_agree=all(row.agree is not False for row in rows),
    )


def _levels(ci_level: float | None, level: float | None, blocks: int | None) -> dict[str, Any]:
    """The interval's real coverage, its level and the process pairs, where the comparison has
    them (summary.json keeps only the keys a section set)."""
    found: dict[str, Any] = dict(level_field(ci_level))
    if level is not None:
        found["interval_level"] = level
    if blocks is not None:
        found["blocks"] = blocks
    return found


def host_result(run: ReproductionRun) -> HostResult:
    """A run's result as the agreement test reads it, named by its host (or run id)."""
    return HostResult(
        host=run.host or run.run_id,
        ratio_median=run.ratio_median,
        ci_low=run.ci_low,
        ci_high=run.ci_high,
        ci_level=run.ci_level,
        interval_level=run.interval_level,
        units=run.blocks or run.n,
    )
