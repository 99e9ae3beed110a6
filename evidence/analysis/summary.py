"""summary.json, assembled: the one place a `Summary` is built from validated records.

Layers (an import-linter contract in pyproject.toml keeps them): `summary_schema` (the typed
models) at the bottom, `stats` (pairing, intervals, tests, verdicts) above it, the sections
(`ablation`, `drift`, `parity`, `reproduction`, `history`, `bisect`, `commits`: each imports
only the layers below it, never another section) above that, then this module, which calls
every section and builds the `Summary` once. The renderers (`markdown`, `report`) and `bundle`
sit above it and only read the result.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from coldbench.evidence.analysis.ablation import ablation_section
from coldbench.evidence.analysis.bisect import STEP_DECIDED, bisect_section, step_decision
from coldbench.evidence.analysis.builds import builds_section
from coldbench.evidence.analysis.canary import canary_invalidations, canary_section
from coldbench.evidence.analysis.commits import commits_section
from coldbench.evidence.analysis.drift import drift_section
from coldbench.evidence.analysis.first_cells import first_cells_applied
from coldbench.evidence.analysis.history import history_section
from coldbench.evidence.analysis.parity import PARITY_MARGIN_THRESHOLD, parity_section
from coldbench.evidence.analysis.peak import over_peak, peak_section
from coldbench.evidence.analysis.reproduction import reproduction_section
from coldbench.evidence.analysis.stats import (
    DEFAULT_PRECISION,
    MIN_PAIRS,
    N_RESAMPLES,
    CellIndex,
    ComparisonT,
    Looks,
    StatsOptions,
    compare_matrix,
    job_looks,
)
from coldbench.evidence.analysis.telemetry import telemetry_section
from coldbench.evidence.contract.schemas import CANARY_ROUND, JobSpec, Provenance, Record
from coldbench.evidence.contract.summary_schema import (
    DECIDED,
    PROCESS_BLOCK_SETTINGS,
    SUMMARY_FORMAT,
    Comparison,
    Descriptive,
    Invalid,
    InvalidCell,
    MemoryStats,
    NoiseFloor,
    Quantiles,
    RunCount,
    RunTime,
    Sequential,
    Settings,
    Summary,
    decisive_interval,
)
from coldbench.evidence.contract.timeline import Timeline, advice_cost_s, timeline_section
from coldbench.evidence.contract.variant import (
    ablation_features,
    baseline_name,
    expand_variants,
    parse_feature,
)


def _quantiles(values: Sequence[float]) -> Quantiles | None:
    if not values:
        return None
    array = np.asarray(values, dtype=float)
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return Quantiles(
        median=float(median),
        q1=float(q1),
        q3=float(q3),
        min=float(array.min()),
        max=float(array.max()),
    )


def describe(
    index: CellIndex, *, variants: Sequence[str], contexts: Sequence[int]
) -> list[Descriptive]:
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
                Descriptive(
                    context_tokens=context,
                    variant=variant,
                    n=len(records),
                    prefill_tps=_quantiles([r.prefill_tps for r in records if r.prefill_tps]),
                    decode_tps=_quantiles(
                        [r.decode_tps for r in records if r.decode_tps is not None]
                    ),
                    peak_memory_bytes=MemoryStats(
                        median=int(np.median(memory)), max=int(max(memory))
                    )
                    if memory
                    else None,
                    inert=inert_flags(records),
                )
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


def invalid_section(
    records: Iterable[Record], duplicates: Sequence[Record], mismatched: int
) -> Invalid:
    """Cells kept out of statistics, counted per reason (warm-ups are expected, not invalid;
    the warm canary has its own section), and how many pairs were dropped for differing
    prompts."""
    cells = []
    for record in records:
        if record.round == CANARY_ROUND:
            continue
        if record.status in ("invalid", "error"):
            reason = record.reason or record.status
        elif record.status == "ok" and record.round < 0:
            reason = "ok cell outside any round"
        else:
            continue
        cells.append(_invalid_cell(record, reason))
    cells.extend(_invalid_cell(r, "duplicate cell (the first was kept)") for r in duplicates)
    by_reason = Counter(cell.reason for cell in cells)
    return Invalid(
        total=len(cells),
        by_reason=dict(sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))),
        cells=cells,
        pairs_with_different_prompts=mismatched,
    )


def _invalid_cell(record: Record, reason: str) -> InvalidCell:
    return InvalidCell(
        run_id=record.run_id,
        variant=record.variant,
        round=record.round,
        context_tokens=record.context_tokens,
        status=record.status,
        reason=reason[:300],
    )


def host_names(provenances: Sequence[Provenance]) -> dict[str, str]:
    """Each run's host as people should see it: its registered name, else its hostname, else
    the run id; a name shared by several runs gets the run id added, so columns differ."""
    names = {p.run_id: p.host.registered_name or p.host.hostname or p.run_id for p in provenances}
    shared = {name for name in names.values() if list(names.values()).count(name) > 1}
    return {
        run_id: f"{name} (run {run_id})" if name in shared else name
        for run_id, name in names.items()
    }


def noise_floor(comparisons: Sequence[Comparison]) -> NoiseFloor | None:
    """What this run can resolve: the between-process spread of the ratio (SD of the process
    pairs' log median ratios) and the half-width of the intervals (an effect smaller than it
    cannot exclude 1), medians over the comparisons that have them."""
    spreads = [c.process_sd for c in comparisons if c.process_sd is not None]
    # only 95% intervals: a [min, max] of a few process pairs says nothing of what resolves
    intervals = [found for c in comparisons if (found := decisive_interval(c)) is not None]
    widths = [(high - low) / 2 for low, high in intervals]
    blocked = [c for c in comparisons if c.blocks]
    if not blocked:
        return None
    return NoiseFloor(
        process_pairs=int(np.median([c.blocks for c in blocked])),
        rounds_per_process_pair=float(np.median([c.n / (c.blocks or 1) for c in blocked])),
        between_process_sd=float(np.median(spreads)) if spreads else None,
        resolvable=float(np.median(widths)) if widths else None,
        rule="between_process_sd: median over comparisons of the SD of each process pair's "
        "log median ratio; resolvable: median half-width of the 95% intervals (a smaller "
        f"effect cannot be told from 1), none below {MIN_PAIRS} process pairs",
    )


def rounds_done(records: Sequence[Record]) -> int:
    """Complete rounds of these records: the fewest any run reached (a run's rounds start at 0
    and a run stops only at a process block's end)."""
    last: dict[str, int] = {}
    for record in records:
        if record.round >= 0:
            last[record.run_id] = max(last.get(record.run_id, -1), record.round)
    return min(last.values()) + 1 if last else 0


@dataclass(frozen=True)
class LookTaken:
    """Which look of a job these records reach, and what it may spend."""

    looks: Looks
    index: int | None  # None: the records stop short of the first look
    rounds: int  # rounds analysed: those of the look taken, or all there are before the first
    alpha: float

    @property
    def is_last(self) -> bool:
        return self.index == len(self.looks.rounds) - 1


def look_taken(spec: JobSpec, records: Sequence[Record], alpha: float) -> LookTaken:
    """The look these records of `spec` reach (coldbench.evidence.analysis.stats `Looks`): a run
    that stops early is analysed at the last look it completed, with that look's share of alpha;
    records short of the first look are analysed with the first look's share."""
    looks = job_looks(spec)
    done = rounds_done(records)
    index = looks.taken(done)
    if index is None:
        return LookTaken(looks, None, done, looks.alpha_at(0, alpha))
    return LookTaken(looks, index, looks.rounds[index], looks.alpha_at(index, alpha))


def prefill_verdicts_at_look(
    records: Sequence[Record], *, spec: JobSpec
) -> tuple[LookTaken, list[Comparison]]:
    """The prefill comparisons of a job at the look its records reach: what a run measuring
    until decided checks after each process block (worker/run.py), by the rule summary.json
    states."""
    options = StatsOptions(precision=spec.precision, seed=spec.seed)
    taken = look_taken(spec, records, options.alpha)
    kept = [r for r in records if r.round < taken.rounds]
    # the cells summary.json leaves out (coldbench.evidence.analysis.first_cells), left out here too
    kept, _ = first_cells_applied(kept, threshold=spec.precision)
    baseline = baseline_name(spec)
    variants = [v.name for v in expand_variants(spec)]
    comparisons, _ = compare_matrix(
        CellIndex.of(kept),
        variants=variants,
        baseline=baseline,
        contexts=sorted(spec.contexts),
        metric="prefill_tps",
        options=replace(options, look_alpha=taken.alpha),
    )
    return taken, comparisons


def all_decided(comparisons: Sequence[Comparison]) -> bool:
    return bool(comparisons) and all(c.verdict in DECIDED for c in comparisons)


def look_decided(spec: JobSpec, comparisons: Sequence[Comparison]) -> str | None:
    """What a run measuring until decided stops on at a look, or None where it measures on:
    every prefill comparison decided; for a bisection step, the step's own decision (it halves
    the line or names the commit), which a mid of lo's code reaches long before its
    `no established change` would."""
    if spec.bisect is not None:
        decision, _ = step_decision(spec, comparisons)
        return f"the step decided {decision!r}" if decision in STEP_DECIDED else None
    return "every comparison decided" if all_decided(comparisons) else None


def _sequential(taken: LookTaken, comparisons: Sequence[Comparison], spec: JobSpec) -> Sequential:
    decided = look_decided(spec, comparisons)
    if taken.index is None:
        stopped = f"the records stop at {taken.rounds} rounds, short of the first look"
    elif decided:
        stopped = f"{decided} at look {taken.index + 1}"
    elif taken.is_last:
        stopped = f"the budget of {taken.rounds} rounds was spent"
    else:
        stopped = (
            f"measuring ended at look {taken.index + 1} before every comparison decided (the "
            "time budget, or the run ended)"
        )
    return Sequential(
        looks=list(taken.looks.rounds),
        taken=0 if taken.index is None else taken.index + 1,
        rounds_analysed=taken.rounds,
        alpha=taken.alpha,
        stopped=stopped,
    )


def priced_advice(comparisons: Sequence[ComparisonT], runs: Sequence[RunTime]) -> list[ComparisonT]:
    """Each inconclusive comparison's rounds advice with the time it would take at the job's
    measured cost (`advice_cost_s`: in turns, every turn's start included)."""
    priced = []
    for comparison in comparisons:
        times = {
            "time_needed_s": advice_cost_s(runs, comparison.rounds_needed),
            "time_to_detect_s": advice_cost_s(runs, comparison.rounds_to_detect),
        }
        known = {key: value for key, value in times.items() if value is not None}
        priced.append(comparison.model_copy(update=known) if known else comparison)
    return priced


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
    timelines: Sequence[Timeline] = (),
) -> Summary:
    """summary.json's value for these records (pure; equal inputs give equal output).

    The baseline, ablation features, precision and seed come from `spec` unless given. Without a
    spec, `baseline` is required. `timelines` (the runs' timeline.json) add the `timeline`
    section.
    """
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
    # A cell faster than its device can compute has a wrong timing: invalid before any statistic.
    records = over_peak(records, provenances)
    options = StatsOptions(precision=precision, seed=seed, n_resamples=n_resamples)
    taken: LookTaken | None = None
    if spec is not None and spec.until == "decided":
        # Analysed at the look the records reach, at that look's share of alpha
        # (coldbench.evidence.analysis.stats `Looks`); rounds past it are not part of the verdicts.
        taken = look_taken(spec, records, options.alpha)
        options = replace(options, look_alpha=taken.alpha)
        records = [r for r in records if r.round < taken.rounds]
    # A block's first timed cell established slower than the rest leaves out (both variants
    # alike) before any statistic; the section says so either way.
    records, first_cells = first_cells_applied(records, threshold=precision)

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
    # Set only where they apply: a summary without them writes no such key (summary_schema).
    conditional: dict[str, Any] = {}
    if by_process:
        conditional["noise_floor"] = noise_floor(comparisons)
    ablation = ablation_section(index, features=features, contexts=contexts, options=options)
    if timelines:
        timeline = conditional["timeline"] = timeline_section(timelines, records)
        if timeline is not None:
            comparisons = priced_advice(comparisons, timeline.runs)
            decode_comparisons = priced_advice(decode_comparisons, timeline.runs)
            if ablation is not None:
                entries = priced_advice(ablation.entries, timeline.runs)
                ablation = ablation.model_copy(update={"entries": entries})
    if spec is not None and spec.mode == "history":
        conditional["history"] = history_section(
            spec=spec, comparisons=comparisons, contexts=contexts, provenances=provenances
        )
    if spec is not None and spec.mode == "bisect":
        conditional["bisect"] = bisect_section(
            spec=spec, comparisons=comparisons, provenances=provenances
        )
    parity = parity_section(
        index,
        variants=variants,
        baseline=baseline,
        margin_threshold=PARITY_MARGIN_THRESHOLD if margin_threshold is None else margin_threshold,
    )
    if spec is not None and spec.mode == "commits" and spec.commits and spec.commits.line:
        conditional["commits"] = commits_section(
            index,
            spec=spec,
            comparisons=comparisons,
            contexts=contexts,
            provenances=provenances,
            parity=parity,
            options=options,
        )
    canary = canary_section(records, run_ids)
    if canary is not None:
        conditional["canary"] = canary
    telemetry = telemetry_section(records, run_ids)
    if telemetry is not None:
        conditional["telemetry"] = telemetry
    if first_cells is not None:
        conditional["first_cells"] = first_cells
    peak = peak_section(records, provenances)
    if peak is not None:
        conditional["peak"] = peak
    builds = builds_section(provenances)
    if builds is not None:
        conditional["mlx_builds"] = builds
    invalidations = canary_invalidations(canary)
    if invalidations:
        conditional["evidence_invalid"] = invalidations
    extra_settings: dict[str, Any] = {}
    if by_process:
        extra_settings["process_blocks"] = PROCESS_BLOCK_SETTINGS
    if taken is not None and spec is not None:  # taken only for a spec measuring until decided
        extra_settings["sequential"] = _sequential(taken, comparisons, spec)
    settings = Settings.model_validate({**options.settings(), **extra_settings})
    return Summary(
        format=SUMMARY_FORMAT,
        mode=spec.mode if spec is not None else ("ablation" if features else "ab"),
        baseline=baseline,
        variants=variants,
        contexts=contexts,
        features=list(features),
        settings=settings,
        runs=[
            RunCount(
                run_id=run_id,
                host=hosts.get(run_id),
                records=sum(1 for r in records if r.run_id == run_id),
                ok=sum(1 for key in index.cells if key[0] == run_id),
            )
            for run_id in run_ids
        ],
        warmups=sum(1 for r in records if r.status == "warmup"),
        descriptive=describe(index, variants=variants, contexts=contexts),
        comparisons=comparisons,
        decode_comparisons=decode_comparisons,
        ablation=ablation,
        parity=parity,
        drift=drift_section(
            index,
            baseline=baseline,
            variants=variants,
            comparisons=comparisons,
            options=options,
            per_context=by_process,
        ),
        reproductions=reproduction_section(
            index,
            run_ids=run_ids,
            hosts=hosts,
            variants=variants,
            baseline=baseline,
            contexts=contexts,
            options=options,
        ),
        invalid=invalid_section(records, index.duplicates, mismatched),
        **conditional,
    )
