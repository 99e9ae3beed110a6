"""Reproductions: the same job run on several hosts, compared host by host.

Each run's records are analysed alone (its own pairs, corrected within the run). For each
(context, variant) the hosts' results sit side by side; `agree` is false where two hosts'
95% intervals do not overlap, which says the hosts measure different effects (a host
difference, or drift) rather than noise around one effect. A run with too few pairs for a 95%
interval (its `ci_level` set) is not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from evidence.stats import (
    CellIndex,
    StatsOptions,
    compare_matrix,
    intervals_overlap,
)
from evidence.summary_schema import (
    ReproductionRow,
    ReproductionRun,
    Reproductions,
    decisive_interval,
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
    rows = []
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
                **level_field(comparison.ci_level),
            )
            for run_id in run_ids
            for comparison in (per_run[run_id][position],)
        ]
        # only 95% intervals: two [min, max] intervals of a few pairs can miss each other
        # by chance far more often than 1 time in 20
        intervals = [found for r in results if (found := decisive_interval(r)) is not None]
        agree = all(
            intervals_overlap(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1 :]
        )
        rows.append(
            ReproductionRow(
                context_tokens=first.context_tokens,
                variant=first.variant,
                baseline=baseline,
                runs=results,
                agree=agree,
            )
        )
    return Reproductions(
        rule="agree is false where two runs' 95% intervals of the median ratio do not overlap",
        comparisons=rows,
        all_agree=all(row.agree for row in rows),
    )
