"""summary.md: the Markdown a reviewer pastes into a pull request (under 60,000 characters).

The answer first (one sentence per context, then the cold-prefill verdict table), then host
and commits, the decode table, the ablation table, parity, drift, reproductions, invalid-cell
counts and the evidence id. Inside a bundle the file cannot name its own evidence id (the id
hashes this file); it says where to find it instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from coldbench.evidence.analysis.ablation import ablation_sentence
from coldbench.evidence.analysis.bisect import bisect_sentences
from coldbench.evidence.analysis.commits import commits_sentences
from coldbench.evidence.analysis.history import history_sentences, plural, short
from coldbench.evidence.analysis.peak import fastest_lines
from coldbench.evidence.analysis.telemetry import telemetry_lines
from coldbench.evidence.contract.schemas import CorpusInfo, Provenance, TargetInfo
from coldbench.evidence.contract.spec_text import flags_text
from coldbench.evidence.contract.summary_schema import (
    CLAIMS,
    Bisect,
    Bracketing,
    Canary,
    CommitMarginal,
    Commits,
    Comparison,
    DriftLine,
    History,
    HistoryPoint,
    Peak,
    PhaseTimes,
    ReproductionRow,
    ReproductionRun,
    RunDrift,
    RunTime,
    Settings,
    Summary,
    Verdict,
)
from coldbench.evidence.rendering.escaping import escape_html, md_code, md_fence, md_text, one_line
from coldbench.evidence.rendering.headline import caveats

# Anything with a median ratio and its interval: a comparison, a history point, a host's
# reproduction, a bracketing row.
Interval = Comparison | HistoryPoint | ReproductionRun | Bracketing

MAX_CHARS = 60_000
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
_MAX_LISTED = 20


def fmt_tps(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def fmt_interval(comparison: Interval) -> str:
    """`0.987 [0.950, 1.020]`; an interval below the confidence level (too few pairs for it)
    says its real level: `0.987 [0.950, 1.020] (50% interval)`."""
    median = fmt_ratio(comparison.ratio_median)
    low, high = comparison.ci_low, comparison.ci_high
    if low is None or high is None:
        return median
    level = comparison.ci_level
    label = f" ({100 * level:.4g}% interval)" if level is not None else ""
    return f"{median} [{low:.3f}, {high:.3f}]{label}"


def fmt_p(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def fmt_verdict(comparison: Comparison | HistoryPoint) -> str:
    verdict = str(comparison.verdict)
    if not isinstance(comparison, Comparison):
        return verdict
    if verdict == Verdict.NO_VALID_PAIRS and comparison.why:
        return f"no valid pairs: {comparison.why}"
    if verdict == Verdict.INCONCLUSIVE:
        costs = rounds_costs(comparison)
        return f"inconclusive ({costs})" if costs else verdict
    return verdict


def about_time(seconds: float | None) -> str:
    """` (~40 s)`, ` (~12 min)`, ` (~2.5 h)`: a time the advice would take; empty if unknown."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f" (~{seconds:.0f} s)"
    if seconds < 90 * 60:
        return f" (~{seconds / 60:.0f} min)"
    return f" (~{seconds / 3600:.1f} h)"


def rounds_costs(comparison: Comparison) -> str:
    """`~9 rounds (~4 min) to detect, ~90 (~38 min) for the precision`: what more rounds would
    buy an inconclusive comparison, the two costs told apart (coldbench.evidence.analysis.stats:
    detecting the change observed, and an interval within +-precision), each with the time a
    run of them would take at this job's measured cost where its runs have timelines (in turns,
    every turn's start included); empty when neither is known."""
    detect, needed = comparison.rounds_to_detect, comparison.rounds_needed
    detect_time = about_time(comparison.time_to_detect_s)
    if detect and needed == detect:
        return f"~{detect} rounds{detect_time} to detect or for the precision"
    costs = [f"~{detect} rounds{detect_time} to detect"] if detect else []
    if needed:
        rounds = "" if costs else " rounds"
        costs.append(f"~{needed}{rounds}{about_time(comparison.time_needed_s)} for the precision")
    return ", ".join(costs)


# Below this a per-hour rate is an extrapolation far beyond the data: show only the change
# across the run.
MIN_RATE_SPAN_H = 0.25


def drift_rate_text(run: DriftLine) -> str:
    """`+1.20% per hour [-0.50, +2.90]`, or why no hourly rate is shown."""
    if run.slope_pct_per_hour is None:
        return "no trend (fewer than 3 baseline cells)"
    span_h = run.span_hours or 0.0
    if span_h < MIN_RATE_SPAN_H:
        return f"no hourly rate (a {span_h * 60:.0f}-minute run)"
    interval = (
        f" [{run.slope_ci_low:+.2f}, {run.slope_ci_high:+.2f}]"
        if run.slope_ci_low is not None and run.slope_ci_high is not None
        else ""
    )
    return f"{fmt_pct(run.slope_pct_per_hour)} per hour{interval}"


def source_dirty(target: TargetInfo) -> bool:
    """Whether a variant's local source repository had uncommitted changes to tracked files
    when the run started (worker/checkout.py; none of them was measured)."""
    return (target.model_extra or {}).get("source_dirty") is True


def noise_floor_text(summary: Summary) -> str | None:
    """The noise floor this run measured, in one sentence; None for runs without process
    instances in their records (measured before process rotation)."""
    floor = summary.noise_floor
    if not floor:
        return None
    pairs = floor.process_pairs
    rounds = floor.rounds_per_process_pair
    spread = floor.between_process_sd
    resolvable = floor.resolvable
    parts = [
        f"Noise floor: {plural(pairs, 'process pair')} of {rounds:g} "
        f"round{'s' if rounds != 1 else ''} each"
    ]
    if spread is not None:
        parts.append(
            f"the ratio varied by {100 * spread:.2f}% (SD) from one process pair to the next"
        )
    if resolvable is not None:
        parts.append(
            f"this run resolves effects of about +-{100 * resolvable:.2f}% and larger "
            "(median half-width of the 95% intervals)"
        )
    elif pairs < summary.settings.min_pairs:
        parts.append(
            f"too few process pairs for a 95% interval ({summary.settings.min_pairs} are "
            "needed), so no resolvable effect is stated"
        )
    return "; ".join(parts) + "."


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def _phases_text(phases: PhaseTimes) -> str:
    return (
        f"stop {_seconds(phases.stop_s)}, imports {_seconds(phases.imports_s)}, "
        f"load {_seconds(phases.load_s)}, warm-ups {_seconds(phases.warmups_s)}"
    )


def time_spent_lines(summary: Summary) -> list[str]:
    """Where each run's time went, one sentence per run (coldbench.evidence.contract.timeline); none
    for bundles without a timeline."""
    if summary.timeline is None:
        return []
    several = len(summary.timeline.runs) > 1
    lines = []
    for run in summary.timeline.runs:
        parts = [
            f"measuring {_seconds(run.measuring_wall_s)}, timed cells "
            f"{_seconds(run.timed_cells_s)}"
            + (f" (duty cycle {100 * run.duty_cycle:.0f}%)" if run.duty_cycle is not None else "")
        ]
        if run.time_to_first_cell_s is not None:
            first = f"first cell {_seconds(run.time_to_first_cell_s)} after the start"
            if run.first_block is not None:
                first += f" ({_phases_text(run.first_block)})"
            parts.append(first)
        if run.later_blocks is not None and run.blocks and run.blocks > 1:
            ahead = ", started ahead" if run.prespawn else ""
            parts.append(
                f"{run.blocks - 1} later block start{'s' if run.blocks > 2 else ''}"
                f"{ahead}: {_phases_text(run.later_blocks)}"
            )
        if run.block_rule:
            parts.append(f"blocks: {run.block_rule}")
        text = "; ".join(parts) + "."
        if run.residency == "in-turns":
            text += " " + in_turns_text(run)
        elif run.residency_reason:
            text += f" Variants ran {run.residency_reason}."
        if run.processes_compiling_kernels:
            text += " " + kernel_compiles_text(run)
        if run.stopped:
            text += f" The run was {run.stopped}."
        lines.append(f"Where the time went{f' (run {run.run_id})' if several else ''}: {text}")
    return lines


def kernel_compiles_text(run: RunTime) -> str:
    """The sentence of a run whose processes compiled kernels at run time
    (coldbench.engine.jit_cache): why their warm-ups were long."""
    count = run.processes_compiling_kernels or 0
    most = run.kernels_compiled_max or 0
    processes = f"{count} variant process{'es' if count != 1 else ''}"
    modules = f"{most} kernel module{'s' if most != 1 else ''}"
    return (
        f"{processes} compiled kernels that MLX's CUDA kernel cache lacked (at most {modules} "
        "one), inside their load and warm-ups, before any timed cell: a host compiles them once "
        "and later runs read them from the cache."
    )


def in_turns_text(run: RunTime) -> str:
    """The sentences of a run whose variants were resident one at a time
    (coldbench.engine.memory)."""
    rounds = run.rounds_per_process
    blocks = f"{run.blocks} block{'s' if run.blocks != 1 else ''}" if run.blocks else "blocks"
    of = f" of {rounds} round{'s' if rounds != 1 else ''}" if rounds else ""
    text = f"Variants ran in turns: one resident at a time, {blocks}{of}"
    reason = (run.residency_reason or "").removeprefix("in turns, one variant resident at a time: ")
    text += f" ({reason})." if reason else "."
    if run.turn_starts is not None and run.turns_within_blocks:
        cost = run.turn_starts
        # their warm-ups are not added: side by side every process warms up the same
        added = cost.stop_s + cost.imports_s + cost.load_s
        turns = run.turns_within_blocks
        text += (
            f" The {turns} turn start{'s' if turns > 1 else ''} within blocks added "
            f"{_seconds(added)} (stop {_seconds(cost.stop_s)}, imports "
            f"{_seconds(cost.imports_s)}, load {_seconds(cost.load_s)}; their warm-ups, "
            f"{_seconds(cost.warmups_s)}, a run side by side pays too)."
        )
    return text


def drift_context_text(run: RunDrift) -> list[str]:
    """One phrase per context of the run's per-context drift lines (empty for older runs)."""
    return [
        f"{c.context_tokens} tokens: {fmt_pct(c.drift_pct_across_run)} across the run"
        + (" **flagged**" if c.flagged else "")
        for c in run.by_context or []
    ]


def evidence_id_line(evidence_id: str | None, page_url: str | None = None) -> str:
    """The id, linked to its page where the page's URL is known (the PR Markdown)."""
    if evidence_id and page_url:
        return f"Evidence id: [`{evidence_id}`]({page_url})"
    if evidence_id:
        return f"Evidence id: `{evidence_id}`"
    return (
        "Evidence id: the first 24 hex digits of the sha256 of this bundle's manifest.json "
        "(`coldbench verify BUNDLE` prints it)."
    )


def verify_command(evidence_id: str | None) -> str:
    """The command that checks a downloaded bundle is the one this id names."""
    if evidence_id:
        return f"coldbench verify --expect {evidence_id} coldbench-{evidence_id}.zip"
    return "coldbench verify BUNDLE"


def _cell(text: object) -> str:
    """A Markdown table cell: on one line, no pipe that is not escaped already (host text in
    it went through `md_text` or `md_code`)."""
    return _UNESCAPED_PIPE.sub(r"\\|", one_line(text))


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def median_tps(
    summary: Summary, context: int, variant: str, metric: Literal["prefill_tps", "decode_tps"]
) -> float | None:
    for row in summary.descriptive:
        quantiles = getattr(row, metric)
        if row.context_tokens == context and row.variant == variant and quantiles:
            return float(quantiles.median)
    return None


def host_line(provenance: Provenance) -> str:
    host = provenance.host
    parts = [
        host.machine_model,
        host.chip or host.cpu,
        host.gpu,
        f"{host.cores} cores" if host.cores else None,
        f"{host.memory_bytes / 2**30:.0f} GiB" if host.memory_bytes else None,
        host.os,
        f"backend {host.backend}" if host.backend else None,
        f"power {host.power_source}" if host.power_source else None,
        f"thermal {host.thermal_state}" if host.thermal_state else None,
    ]
    devices = device_ids(provenance)
    if devices:  # machines that share a hostname (cloud images) are told apart by their cards
        parts.append("device " + ", ".join(devices))
    name = host.registered_name or host.hostname or provenance.run_id
    machine = (
        f"hostname {md_code(host.hostname)}, "
        if host.registered_name and host.hostname and host.hostname != host.registered_name
        else ""
    )
    return f"{md_text(name)} ({machine}run {md_code(provenance.run_id)}): " + ", ".join(
        md_text(p) for p in parts if p
    )


def device_ids(provenance: Provenance) -> list[str]:
    """The accelerators the run's variant processes reported when ready (NVML's UUID, its first
    12 characters: `GPU-` and 8 hex digits), each once."""
    found: list[str] = []
    for target in provenance.targets:
        ready = getattr(target, "ready", None)
        device = ready.get("device") if isinstance(ready, dict) else None
        uuid = device.get("uuid") if isinstance(device, dict) else None
        if isinstance(uuid, str) and uuid and uuid[:12] not in found:
            found.append(uuid[:12])
    return found


def software_line(provenance: Provenance) -> str:
    software = provenance.software
    parts = [
        f"Python {software.python}" if software.python else None,
        f"mlx {software.mlx}" if software.mlx else None,
        f"mlx-lm {software.mlx_lm}" if software.mlx_lm else None,
        f"coldbench {software.coldbench}" if software.coldbench else None,
    ]
    return ", ".join(md_text(p) for p in parts if p) or "unknown"


def agreement_text(row: ReproductionRow) -> str:
    """A reproduction row's agreement: its statement (bold where the hosts disagree), or for
    a bundle from before the test, whether the intervals overlapped."""
    if row.statement is None:
        return "intervals overlap" if row.agree else "**intervals apart**"
    text = md_text(row.statement)
    return f"**{text}**" if row.agree is False else text


def reproduction_machines(provenances: Sequence[Provenance]) -> list[str]:
    """Each run's host fingerprint, software and MLX build: what a difference between hosts
    may come from."""
    return [f"{host_line(p)}; {software_line(p)}; {mlx_build_text(p)}" for p in provenances]


def mlx_build_text(provenance: Provenance) -> str:
    """The MLX each variant process imported, and the digest of the host's installed packages
    (`pip freeze`): two hosts with one MLX version may still run different builds of it, whose
    extension's file provenance.json keeps."""
    versions = []
    for target in provenance.targets:
        version = (target.software or {}).get("mlx") or provenance.software.mlx
        if version and version not in versions:
            versions.append(version)
    text = f"MLX {', '.join(md_text(v) for v in versions)}" if versions else "MLX unknown"
    freeze = provenance.software.pip_freeze_sha256
    return text + (f", packages {freeze[:12]}" if freeze else "")


_NATIVE_SUFFIXES = (".so", ".dylib", ".pyd")


def _is_native(path: str) -> bool:
    return path.endswith(_NATIVE_SUFFIXES) or ".so." in path


def variant_software_text(software: Mapping[str, Any] | None, *, native_files: bool = True) -> str:
    """What a variant's own process imported: versions, then the file of each module. Without
    `native_files` (the Markdown) a compiled extension's path is left out: the version beside
    it names that build, and provenance.json keeps the path."""
    if not software:
        return "not reported"
    parts = [
        f"mlx {software['mlx']}" if software.get("mlx") else None,
        f"mlx-lm {software['mlx_lm']}" if software.get("mlx_lm") else None,
        f"coldbench {software['coldbench']}" if software.get("coldbench") else None,
    ]
    files = {
        name: path
        for name, path in (software.get("files") or {}).items()
        if native_files or not _is_native(str(path))
    }
    imported = ", ".join(
        f"{md_text(name)} {md_code(path)}" for name, path in sorted(files.items(), key=str)
    )
    versions = ", ".join(md_text(p) for p in parts if p)
    build = software.get("mlx_build")
    built = (
        f"MLX build {md_text(build.get('origin'))} {md_code(str(build.get('digest'))[:12])}"
        if isinstance(build, dict) and build.get("digest")
        else None
    )
    environment = software.get("environment")
    set_here = (
        "environment "
        + ", ".join(md_code(f"{name}={value}") for name, value in sorted(environment.items()))
        if isinstance(environment, dict) and environment
        else None
    )
    return "; ".join(p for p in [versions, built, set_here, imported] if p) or "n/a"


def _flags(flags: Mapping[str, Any]) -> str:
    return md_text(flags_text(flags, empty="defaults"))


def _pct(value: float) -> str:
    return f"{abs(value) * 100:.1f}%"


def _change(ratio: float) -> str:
    """A ratio as the change it is: `3.2% slower`, `1.1% faster`, `no change`."""
    if abs(ratio - 1) < 0.0005:  # shown as 0.0%
        return "no change"
    return f"{_pct(ratio - 1)} {'faster' if ratio > 1 else 'slower'}"


def verdict_clause(comparison: Comparison, settings: Settings) -> str:
    """One comparison in words: `cand is 7.0% slower at 128 tokens, 95% interval 3.2% to
    8.4%`. The interval is stated in the direction of the verdict."""
    variant, context = comparison.variant, comparison.context_tokens
    verdict = comparison.verdict
    low, high, median = comparison.ci_low, comparison.ci_high, comparison.ratio_median
    level = f"{100 * settings.confidence_level:g}%"
    where = f"at {context} tokens"
    if verdict in CLAIMS and None not in (low, high, median):
        assert low is not None and high is not None and median is not None  # for mypy
        near, far = (low - 1, high - 1) if verdict == Verdict.FASTER else (1 - high, 1 - low)
        return (
            f"{variant} is {_pct(median - 1)} {verdict} {where}, "
            f"{level} interval {_pct(near)} to {_pct(far)}"
        )
    if verdict == Verdict.NO_CHANGE and low is not None and high is not None:
        return (
            f"{variant}: no established change {where} ({level} interval {_change(low)} to "
            f"{_change(high)}, inside +-{100 * settings.precision:g}%)"
        )
    if not comparison.n:  # the verdict table says why
        return f"{variant}: no valid pairs {where}"
    detect, needed = comparison.rounds_to_detect, comparison.rounds_needed
    precision = f"+-{100 * settings.precision:g}%"
    detect_time = about_time(comparison.time_to_detect_s)
    needed_time = about_time(comparison.time_needed_s)
    if detect and needed == detect:
        settle = (
            f"; about {detect} rounds{detect_time} would detect a change this size and bound "
            f"it within {precision}"
        )
    elif detect and needed:
        settle = (
            f"; about {detect} rounds{detect_time} would detect a change this size, "
            f"{needed}{needed_time} would bound it within {precision}"
        )
    elif detect:
        settle = f"; about {detect} rounds{detect_time} would detect a change this size"
    elif needed:
        settle = f"; about {needed} rounds{needed_time} would bound it within {precision}"
    else:
        settle = ""
    return f"{variant}: inconclusive {where} ({comparison.n} pairs{settle})"


def verdict_sentences(summary: Summary, *, compact: bool = False) -> list[str]:
    """The answer first: one sentence per context, every variant's prefill verdict in it
    (`compact`: only how many variants got each verdict there)."""
    by_context: dict[int, list[Comparison]] = {}
    for comparison in summary.comparisons:
        by_context.setdefault(comparison.context_tokens, []).append(comparison)
    sentences = []
    for context, comparisons in sorted(by_context.items()):
        if compact:
            counts: dict[str, int] = {}
            for comparison in comparisons:
                counts[comparison.verdict] = counts.get(comparison.verdict, 0) + 1
            text = ", ".join(f"{count} {verdict}" for verdict, count in counts.items())
            sentences.append(f"At {context} tokens: {text}.")
        else:
            clauses = [verdict_clause(c, summary.settings) for c in comparisons]
            sentences.append(f"{'; '.join(clauses)}.")
    return sentences


def answer_sentences(
    summary: Summary, *, compact: bool = False, text: Callable[[object], str] = str
) -> list[str]:
    """What every page opens with: a history's steps, a bisection's result, an ablation's one
    sentence, or one verdict sentence per context (summary.md, report.html and the job page
    all call this). `text` formats what a host wrote for where the sentences are shown
    (`md_text` for Markdown; HTML templates escape on their own)."""
    if summary.history:
        return history_sentences(summary.history, text)
    if summary.bisect:
        return bisect_sentences(summary.bisect, text)
    if summary.commits:
        return commits_sentences(summary.commits, text)
    if summary.ablation and summary.ablation.entries:
        # One sentence over the leave-one-out table, not one per context and variant.
        return [ablation_sentence(summary.ablation)]
    return verdict_sentences(summary, compact=compact)


ComparisonKey = Literal["comparisons", "decode_comparisons"]


def verdict_rows(summary: Summary, key: ComparisonKey = "comparisons") -> list[dict[str, Any]]:
    """The verdict table as display strings, one dict per comparison (`comparisons` or
    `decode_comparisons`): what summary.md, report.html and a CLI table show."""
    metric: Literal["prefill_tps", "decode_tps"] = (
        "decode_tps" if key == "decode_comparisons" else "prefill_tps"
    )
    comparisons = summary.decode_comparisons if key == "decode_comparisons" else summary.comparisons
    return [
        {
            "context": c.context_tokens,
            "variant": c.variant,
            "baseline_tps": fmt_tps(median_tps(summary, c.context_tokens, c.baseline, metric)),
            "variant_tps": fmt_tps(median_tps(summary, c.context_tokens, c.variant, metric)),
            "interval": fmt_interval(c),
            "p": fmt_p(c.p_adjusted),
            "n": c.n,
            "verdict": fmt_verdict(c),
            "verdict_code": c.verdict,
        }
        for c in comparisons
    ]


def _comparison_rows(summary: Summary, key: ComparisonKey) -> list[list[object]]:
    columns = ("context", "variant", "baseline_tps", "variant_tps", "interval", "p", "n", "verdict")
    return [[row[c] for c in columns] for row in verdict_rows(summary, key)]


_COMPARISON_HEADER = [
    "context",
    "variant",
    "baseline tok/s",
    "variant tok/s",
    "ratio [95% joint CI]",
    "p (adjusted)",
    "pairs",
    "verdict",
]


def corpus_line(corpus: CorpusInfo) -> str:
    """`the built-in corpus, sha256 `c4a0185d3de21394`` or `host corpus `code`, sha256 ...`."""
    which = (
        "the built-in corpus"
        if corpus.source == "builtin"
        else f"host corpus {md_code(corpus.name)}"
    )
    version = f" ({md_text(corpus.prompt_version)})" if corpus.prompt_version else ""
    return f"{which}, sha256 `{corpus.sha256[:16]}`{version}"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**30:,.2f} GiB" if value >= 2**30 else f"{value / 2**20:,.1f} MiB"


def memory_rows(summary: Summary) -> list[list[object]]:
    """Per (context, variant): median prefill tok/s, the time per cell it implies (context /
    median tok/s) and the largest peak memory, so memory can be read against context."""
    rows: list[list[object]] = []
    for row in summary.descriptive:
        prefill, memory = row.prefill_tps, row.peak_memory_bytes
        median = prefill.median if prefill else None
        rows.append(
            [
                row.context_tokens,
                row.variant,
                row.n,
                fmt_tps(median),
                f"{row.context_tokens / median:,.3f}" if median else "n/a",
                fmt_bytes(memory.max if memory else None),
            ]
        )
    return rows


def inert_lines(summary: Summary) -> list[str]:
    """One sentence per context where some variant's flags were inert, for summary.md and
    report.html."""
    by_context: dict[int, list[str]] = defaultdict(list)
    for row in summary.descriptive:
        if row.inert:
            by_context[row.context_tokens].append(f"{row.variant} ({', '.join(row.inert)})")
    return [
        f"{context} tokens: {'; '.join(entries)}: at this context the request implies what the "
        "stock value does, so these cells measured the stock execution"
        for context, entries in sorted(by_context.items())
    ]


def how_to_read(settings: Settings) -> list[str]:
    """The verdict rules in plain words, for summary.md and report.html."""
    precision_pct = f"{100 * settings.precision:g}%"
    level = f"{100 * settings.confidence_level:g}%"
    lines = [
        "Each ratio is the variant's tok/s over the baseline's on the same prompt in the same "
        "round (paired); above 1 is faster. The table shows a robust centre of the ratios (the "
        "20% trimmed mean of their logs: a stalled cell at either end cannot move it) and its "
        "t interval (Yuen). The intervals hold together: every interval of the table, and of "
        f"every look a run took, covers its ratio with {level} confidence at once (each at "
        "its share of the error, Bonferroni), so the verdicts read them directly.",
        "faster / slower: the interval lies above / below 1.",
        f"no established change: the interval includes 1 and lies within 1 +- "
        f"{precision_pct}, so any change larger than {precision_pct} is ruled out; a smaller "
        "one is not.",
        f"inconclusive: fewer than {settings.min_pairs} units, or an interval that includes "
        f"1 but is wider than +-{precision_pct}; from the observed spread, the rounds that "
        "would detect a change of the size observed and those that would bound it within "
        f"+-{precision_pct} are two estimates (a large change is detected long before its "
        "interval is that narrow), each, where the runs kept their timelines, with the time a "
        "run of those rounds would take at this job's measured cost (its block starts, in "
        "turns every turn's start, included). An interval that includes 1 establishes nothing "
        "more than that.",
        "no valid pairs: no round had valid cells of both the variant and the baseline at "
        "that context; the row says which side had none and why its cells were set aside.",
        "Invalid cells (cached tokens, wrong prompt length, errors, silent no-ops) never enter "
        "the statistics; they are counted per reason. Ablation ratios (all / all-minus-f) "
        "interact and are not additive.",
    ]
    if settings.process_blocks is not None:
        lines.insert(
            1,
            "Each variant ran in a fresh process every few rounds, and a process has a speed "
            "offset of its own (about 1% between identical processes), so the independent "
            "unit is the process pair, not the round: each process pair counts once, as the "
            "median of its pairs' log ratios. The noise floor under the prefill table says how "
            "much processes differed and how small an effect this run can resolve.",
        )
    sequential = settings.sequential
    if sequential is not None:
        looks = ", ".join(str(r) for r in sequential.looks)
        lines.insert(
            1,
            f"Measured until decided: looks after {looks} rounds (the last is the budget); "
            f"{sequential.taken} taken, {sequential.rounds_analysed} rounds analysed, this "
            f"look's share of alpha {sequential.alpha:.4g}. Why it stopped: {sequential.stopped}.",
        )
    return lines


def render_summary_md(
    summary: Summary,
    provenances: Sequence[Provenance],
    *,
    evidence_id: str | None = None,
    page_url: str | None = None,
) -> str:
    """summary.md for this summary; compacted (details dropped, then cut) above 60,000 chars.

    With `evidence_id` and `page_url` this is the PR Markdown (the id linked to its page):
    what the evidence page copies, `/e/{id}.md` serves and the terminal prints. Inside a
    bundle (no id) it is the bundle's summary.md."""
    text = _render(summary, provenances, evidence_id, page_url, compact=False)
    if len(text) > MAX_CHARS:
        text = _render(summary, provenances, evidence_id, page_url, compact=True)
    if len(text) > MAX_CHARS:
        notice = "\n\n(cut at 60,000 characters: the full tables are in summary.json)\n"
        text = text[: MAX_CHARS - len(notice)] + notice
    return text


def peak_lines(peak: Peak, *, compact: bool = False) -> list[str]:
    """The achieved FLOP rate per context and variant against the device's peak
    (evidence/analysis/peak.py), and how far the fastest variant is from it."""
    lines = ["### Achieved FLOP rate against the device's peak", ""]
    for run in peak.runs:
        if run.peak_tflops is None:
            lines.append(f"- run {md_code(run.run_id)}: the device's peak is unknown")
        else:
            lines.append(
                f"- run {md_code(run.run_id)}: {md_text(run.device)}, peak "
                f"{run.peak_tflops:.4g} TFLOP/s {md_text(run.dtype)} ({md_text(run.source)})"
            )
    lines += [f"- {md_text(line)}" for line in fastest_lines(peak)]
    if not compact and peak.rates:
        rows = [
            [
                r.context_tokens,
                md_text(r.variant),
                f"{r.tflops_median:.4g}",
                "n/a" if r.share_of_peak is None else f"{r.share_of_peak:.1%}",
                r.n,
            ]
            for r in peak.rates
        ]
        lines += ["", *_table(["context", "variant", "TFLOP/s (median)", "of peak", "cells"], rows)]
    lines += ["", f"_{md_text(peak.flop_rule)}; {md_text(peak.rule)}._"]
    return lines


def canary_lines(canary: Canary) -> list[str]:
    """One line per run's warm canary (evidence/analysis/canary.py): what the cold check made of
    it."""
    lines = []
    for cell in canary.runs:
        if cell.result == "missing":
            lines.append(f"Warm canary of run {cell.run_id}: none (the cold check is unproven)")
            continue
        said = {
            "caught": "caught, as it must be",
            "passed": "PASSED AS COLD: the evidence is invalid",
            "unwarmed": "not warm (the server keeps no prompt cache; the count is unproven)",
            "unverified": "not verified (the server counted none; its timing could not tell)",
            "error": "did not run to a verdict",
        }[cell.result]
        lines.append(
            f"Warm canary of run {cell.run_id} ({cell.variant}, {cell.context_tokens} tokens, "
            f"cached_tokens={cell.cached_tokens}): {said}"
        )
    return lines


def history_lines(history: History) -> list[str]:
    """The history's steps (with their commit subjects) and the commits that did not build."""
    reference = history.reference
    lines = [
        f"### History against {md_code(short(reference.commit, reference.variant))}"
        + (f" ({md_text(history.range)})" if history.range else ""),
        "",
        f"_{history.rule}._",
        "",
    ]
    if history.steps:
        rows = [
            [
                step.context_tokens,
                md_text(short(step.from_commit, step.from_variant)),
                md_text(short(step.to_commit, step.to_variant)),
                md_text(step.subject or ""),
                f"{step.from_ratio:.3f} to {step.to_ratio:.3f}",
                step.direction,
            ]
            for step in history.steps
        ]
        lines += _table(
            ["context", "step after", "at commit", "subject", "ratio", "direction"], rows
        )
    else:
        lines.append("No step: every pair of neighbouring intervals overlaps.")
    if history.change_points:
        rows = [
            [
                cut.context_tokens,
                md_text(short(cut.commit, cut.variant)),
                f"{md_text(cut.first_variant)} .. {md_text(cut.last_variant)}",
                f"{cut.level_before:.3f} to {cut.level_after:.3f}",
                "**step**" if cut.kind == "step" else "drift",
            ]
            for cut in history.change_points
        ]
        lines += [
            "",
            *_table(["context", "change point at", "levels over", "level", "kind"], rows),
            "",
            f"_{md_text(history.change_point_rule or '')}._",
        ]
    skipped = [c for c in history.commits if c.skipped]
    if skipped:
        lines.append("")
        lines += [
            f"- {md_code(short(c.commit, c.variant))} skipped: {md_text(c.skipped)}"
            for c in skipped
        ]
    return lines


def bisect_lines(bisect: Bisect) -> list[str]:
    """Every step of the bisection so far (with its evidence) and this one."""
    rows: list[list[object]] = [
        [
            position,
            step.lo[:12],
            (step.mid or "-")[:12],
            step.hi[:12],
            md_text(step.decision),
            md_code(step.evidence_id) + (f" ({md_text(step.location)})" if step.location else ""),
        ]
        for position, step in enumerate(bisect.steps, 1)
    ]
    rows.append(
        [
            bisect.step,
            (bisect.lo or "")[:12],
            (bisect.mid or "-")[:12],
            (bisect.hi or "")[:12],
            bisect.decision,
            "this evidence",
        ]
    )
    header = ["step", "lo (good)", "mid", "hi (bad)", "decision", "evidence"]
    return [
        f"### Bisection: first {bisect.direction} commit at {bisect.context_tokens} "
        f"tokens between {md_code(bisect.good)} and {md_code(bisect.bad)}",
        "",
        *_table(header, rows),
    ]


def tree_text(commits: Commits, variant: str) -> str:
    """How the host made a variant's tree, as Markdown: `1234567890` with c2 `abcdef0123`
    reverted: tree `<git tree id>`, and why it was not measured where it was not."""
    for entry in commits.commits:
        for name, tree, why in (
            (entry.without, entry.tree, entry.not_separable),
            (entry.alone, entry.alone_tree, entry.alone_not_separable),
        ):
            if name != variant or tree is None:
                continue
            done = "reverted" if tree.change == "revert" else "picked"
            made = [f"tree {md_code(tree.tree)}"] if tree.tree else []
            made += [f"not separable: {md_text(why)}"] if why else []
            return (
                f"{md_code(tree.onto[:10])} with c{entry.position} {md_code(tree.commit[:10])} "
                f"{done}: " + ", ".join(made)
            )
    return ""


def _commit_rows(commits: Commits, marginals: Sequence[CommitMarginal]) -> list[list[object]]:
    by_position = {entry.position: entry for entry in commits.commits}
    alone = {(a.context_tokens, a.position): a for a in commits.alone}
    rows: list[list[object]] = []
    for m in marginals:
        entry = by_position[m.position]
        parity = entry.parity
        row: list[object] = [
            m.context_tokens,
            f"c{m.position}",
            md_code(m.commit[:10]),
            md_text(entry.subject or ""),
            fmt_interval(m),
            fmt_p(m.p_adjusted),
            m.n,
            fmt_verdict(m),
        ]
        if entry.alone is not None:
            only = alone.get((m.context_tokens, m.position))
            row.append(f"{fmt_interval(only)} {only.verdict}" if only else "n/a")
        row.append(f"{parity.exact} exact, {parity.accepted} accepted, {parity.diverged} diverged")
        rows.append(row)
    return rows


def commits_lines(commits: Commits) -> list[str]:
    """Each commit's marginal (and, where asked, its effect alone on base), the sums against
    the PR's total, the commits that are not separable, and every tree the host made."""
    base, head = (commits.base.commit or "")[:10], (commits.head.commit or "")[:10]
    header = [
        "context",
        "c",
        "commit",
        "subject",
        "head / head without it [95% joint CI]",
        "p (adjusted)",
        "pairs",
        "verdict",
    ]
    if any(e.alone for e in commits.commits):
        header.append("base with only it / base")
    header.append("output vs base (head without it)")
    lines = [f"### Commits of {md_code(f'{base}..{head}')}: each left out of head", ""]
    if commits.marginals:
        lines += _table(header, _commit_rows(commits, commits.marginals))
    else:
        lines.append("No commit was separable: no marginal was measured.")
    lines.append("")
    for sums in commits.additivity:
        if sums.sum_of_marginals_pct is None or sums.total_pct is None:
            continue
        alone = (
            f"; alone on base they sum to {sums.sum_alone_pct:+.1f}%"
            if sums.sum_alone_pct is not None
            else ""
        )
        lines.append(
            f"- {sums.context_tokens} tokens: the {sums.marginals} marginals of "
            f"{sums.commits} commits sum to {sums.sum_of_marginals_pct:+.1f}% against the PR's "
            f"total of {sums.total_pct:+.1f}% ({sums.interaction_pct:+.1f}% unaccounted for)"
            f"{alone}"
        )
    not_separable = [e for e in commits.commits if e.not_separable]
    if not_separable:
        lines += ["", "Not separable (never measured):", ""]
        lines += [
            f"- c{e.position} {md_code(e.commit[:10])} {md_text(e.subject or '')}: "
            f"{md_text(e.not_separable or '')}"
            for e in not_separable
        ]
    trees = [
        (name, tree_text(commits, name))
        for e in commits.commits
        for name in (e.without, e.alone)
        if name
    ]
    lines += ["", "Trees the host made (provenance.json has each in full):", ""]
    lines += [f"- {md_code(name)}: {text}" for name, text in trees if text]
    lines += ["", f"_{commits.note}_"]
    return lines


def _render(
    summary: Summary,
    provenances: Sequence[Provenance],
    evidence_id: str | None,
    page_url: str | None = None,
    *,
    compact: bool,
) -> str:
    """summary.md: the answer, the prefill table with the evidence id, the hosts, the
    measurements, each section in summary.json's order, then the folded details."""
    lines = [
        *_answer_lines(summary, compact=compact),
        *_prefill_lines(summary, evidence_id, page_url),
        *_provenance_lines(provenances),
        *_measurement_lines(summary, compact=compact),
        *_ablation_lines(summary),
        *_parity_lines(summary),
        *_drift_lines(summary),
        *_reproduction_lines(summary, provenances, compact=compact),
        *_invalid_lines(summary),
        *_reproduce_lines(provenances),
    ]
    # Hosts supply names, reasons, versions and commands: no HTML of theirs reaches a page
    # that renders this Markdown (evidence/rendering/escaping.py).
    body = escape_html("\n".join(lines))
    return body + "\n" + "\n".join(_details(_variants_built(provenances), summary.settings))


def _answer_lines(summary: Summary, *, compact: bool) -> list[str]:
    """The title, the answer, what undercuts it and the mode's own section."""
    lines: list[str] = []
    variants = [v for v in summary.variants if v != summary.baseline]
    lines.append(
        f"## coldbench: {', '.join(variants) or 'no variant'} vs `{summary.baseline}` "
        f"({summary.mode})"
    )
    history = summary.history
    bisect = summary.bisect
    if summary.evidence_invalid:
        lines += ["", "**Evidence invalid:** " + md_text(" ".join(summary.evidence_invalid))]
    answer = answer_sentences(summary, compact=compact, text=md_text)
    lines += ["", *(f"- {sentence}" for sentence in answer)]
    undercut = caveats(summary)
    if undercut:
        # Reasons and names in them come from hosts.
        lines += ["", "**What undercuts it:**", "", *(f"- {md_text(line)}" for line in undercut)]
    if history:
        lines += ["", *history_lines(history)]
    if bisect:
        lines += ["", *bisect_lines(bisect)]
    if summary.commits:
        lines += ["", *commits_lines(summary.commits)]
    return lines


def _prefill_lines(summary: Summary, evidence_id: str | None, page_url: str | None) -> list[str]:
    """The cold-prefill table, its noise floor, time and inert flags, and the evidence id."""
    lines: list[str] = []
    lines += [
        "",
        "### Cold prefill",
        "",
        *_table(_COMPARISON_HEADER, _comparison_rows(summary, "comparisons")),
    ]
    floor = noise_floor_text(summary)
    if floor:
        lines += ["", floor]
    for line in time_spent_lines(summary):
        lines += ["", line]
    inert = inert_lines(summary)
    if inert:
        lines += ["", "Inert flags per context:", "", *(f"- {md_text(line)}" for line in inert)]
    lines += ["", evidence_id_line(evidence_id, page_url), ""]
    if evidence_id:
        lines += [f"Check the downloaded bundle: `{verify_command(evidence_id)}`", ""]
    return lines


def _provenance_lines(provenances: Sequence[Provenance]) -> list[str]:
    """Each host's machine, software, model and prompts."""
    lines: list[str] = []
    for provenance in provenances:
        lines.append(f"- Host: {host_line(provenance)}")
        lines.append(f"- Software (orchestrator): {software_line(provenance)}")
        model = provenance.model
        weights = f", weights sha256 `{model.weights_sha256[:16]}`" if model.weights_sha256 else ""
        lines.append(f"- Model: {md_text(model.name or model.path or 'unknown')}{weights}")
        if provenance.corpus is not None:
            lines.append(f"- Prompts: {corpus_line(provenance.corpus)}")
        dirty = sorted({t.repository or "" for t in provenance.targets if source_dirty(t)})
        if dirty:
            lines.append(
                f"- Uncommitted changes in {', '.join(md_code(url) for url in dirty)} were not "
                "measured: only commits are"
            )
    return lines


def _variants_built(provenances: Sequence[Provenance]) -> list[str]:
    """The refs, commits, flags and software of every variant, for the folded details."""
    # Folded away at the end: refs, commits and flags of every variant (what the page's
    # first screen states), with the software each process imported.
    if not provenances:
        return []
    rows: list[list[object]] = []
    seen = set()
    for provenance in provenances:
        for target in provenance.targets:
            if target.variant in seen:
                continue
            seen.add(target.variant)
            commit = (target.commit or "n/a")[:12] + (" (dirty)" if target.dirty else "")
            rows.append(
                [
                    md_text(target.variant),
                    md_text(target.repository or "embedded"),
                    md_text(target.ref or "n/a"),
                    md_text(commit),
                    _flags(target.flags),
                    variant_software_text(target.software, native_files=False),
                ]
            )
    return _table(
        ["variant", "repository", "ref", "commit", "flags", "software (its own process)"],
        rows,
    )


def _measurement_lines(summary: Summary, *, compact: bool) -> list[str]:
    """Prefill time and memory by context, the peak, telemetry and the decode table."""
    lines: list[str] = []
    if not compact:
        lines += ["", "### Prefill time and peak memory by context", ""]
        lines += _table(
            [
                "context",
                "variant",
                "cells",
                "prefill tok/s (median)",
                "prefill s per cell",
                "peak memory (max)",
            ],
            memory_rows(summary),
        )
    if summary.peak is not None:
        lines += ["", *peak_lines(summary.peak, compact=compact)]
    if summary.telemetry is not None:
        lines += ["", *(f"- {md_text(line)}" for line in telemetry_lines(summary.telemetry))]
    if not compact:
        lines += [
            "",
            "### Decode",
            "",
            *_table(_COMPARISON_HEADER, _comparison_rows(summary, "decode_comparisons")),
        ]
    return lines


def _ablation_lines(summary: Summary) -> list[str]:
    """The leave-one-out table, where the job is an ablation."""
    lines: list[str] = []
    ablation = summary.ablation
    if ablation:
        rows = [
            [
                e.context_tokens,
                e.feature,
                fmt_interval(e),
                fmt_p(e.p_adjusted),
                e.n,
                fmt_verdict(e),
            ]
            for e in ablation.entries
        ]
        lines += [
            "",
            "### Ablation (leave one out)",
            "",
            *_table(
                [
                    "context",
                    "feature",
                    "all / all-minus-f [95% joint CI]",
                    "p (adjusted)",
                    "pairs",
                    "verdict",
                ],
                rows,
            ),
            "",
            f"_{ablation.note}_",
        ]
    return lines


def _parity_lines(summary: Summary) -> list[str]:
    """Output parity's counts and its diverged cells."""
    lines: list[str] = []
    parity = summary.parity
    counts = parity.counts
    lines += [
        "",
        "### Output parity",
        "",
        f"{counts.exact} exact, {counts.accepted} accepted near-ties, "
        f"{counts.diverged} diverged, {counts.unknown} unknown. Policy: {parity.policy}.",
    ]
    diverged = [c for c in parity.cells if c.result == "diverged"]
    if diverged:
        lines.append("")
        rows = [
            [
                c.variant,
                c.context_tokens,
                c.round,
                c.first_divergence,
                "n/a" if c.baseline_margin is None else f"{c.baseline_margin:.4g}",
            ]
            for c in diverged[:_MAX_LISTED]
        ]
        lines += _table(
            ["variant", "context", "round", "first divergence", "baseline margin"], rows
        )
        if len(diverged) > _MAX_LISTED:
            lines.append(f"\n...and {len(diverged) - _MAX_LISTED} more in summary.json.")
    return lines


def _drift_lines(summary: Summary) -> list[str]:
    """The baseline's drift per run."""
    lines: list[str] = []
    drift = summary.drift
    lines += ["", "### Drift of the baseline", ""]
    for run in drift.runs:
        flag = " **flagged**" if run.flagged else ""
        lines.append(
            f"- run {md_code(run.run_id)}: {drift_rate_text(run)}, "
            f"{fmt_pct(run.drift_pct_across_run)} across the run "
            f"(threshold {drift.threshold_pct:.2f}%, {drift.threshold_source}){flag}"
        )
        lines += [f"  - {text}" for text in drift_context_text(run)]
    if not drift.runs:
        lines.append("- no baseline cells to measure drift")
    return lines


def _reproduction_lines(
    summary: Summary, provenances: Sequence[Provenance], *, compact: bool
) -> list[str]:
    """The hosts' verdicts side by side, where several hosts ran the job."""
    lines: list[str] = []
    reproductions = summary.reproductions
    if reproductions and not compact:
        hosts = [md_text(r.host or r.run_id) for r in reproductions.comparisons[0].runs]
        rows = []
        for row in reproductions.comparisons:
            cells = [f"{fmt_interval(r)} {r.verdict}" for r in row.runs]
            detail = md_text(row.test.detail) if row.test else "-"
            rows.append([row.context_tokens, row.variant, *cells, agreement_text(row), detail])
        lines += [
            "",
            "### Reproductions",
            "",
            *_table(["context", "variant", *hosts, "hosts", "ratio of ratios, test"], rows),
            "",
            f"Agreement: {md_text(reproductions.rule)}.",
            "",
            *(f"- {text}" for text in reproduction_machines(provenances)),
        ]
    return lines


def _invalid_lines(summary: Summary) -> list[str]:
    """The cells set aside and the canary."""
    lines: list[str] = []
    invalid = summary.invalid
    lines += ["", "### Invalid cells", ""]
    if invalid.total == 0:
        lines.append("None: every measured cell was cold, complete and executed what it asked for.")
    else:
        lines.append(f"{invalid.total} cells excluded from the statistics:")
        lines.append("")
        for reason, count in list(invalid.by_reason.items())[:_MAX_LISTED]:
            lines.append(f"- {count} x {md_text(reason)}")
    if invalid.pairs_with_different_prompts:
        lines.append(
            f"- {invalid.pairs_with_different_prompts} pairs dropped: different prompt ids"
        )
    if summary.canary is not None:
        lines += ["", *(f"- {md_text(line)}" for line in canary_lines(summary.canary))]
    return lines


def _reproduce_lines(provenances: Sequence[Provenance]) -> list[str]:
    """The commands that reproduce the runs."""
    lines: list[str] = []
    commands = list(dict.fromkeys(p.command for p in provenances if p.command))
    if commands:
        lines += ["", "Reproduce:", "", *md_fence(commands, "sh")]
    return lines


def _details(variant_lines: list[str], settings: Settings) -> list[str]:
    """The folded sections: the variants as built and how to read this."""
    details: list[str] = []
    if variant_lines:
        details += ["", "<details><summary>Variants as built</summary>", ""]
        details += [escape_html(line) for line in variant_lines]
        details += ["", "</details>"]
    details += ["", "<details><summary>How to read this</summary>", ""]
    details += [f"- {escape_html(sentence)}" for sentence in how_to_read(settings)]
    details += ["", "</details>", ""]
    return details
