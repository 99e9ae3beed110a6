"""What a report's first screen says beside its answer: what was compared (refs at their
commits, flags, model, hosts, dates) and what undercuts the verdict (a baseline drift larger
than the effect, invalid cells, diverged outputs, too few process pairs, hosts that disagree,
tok/s medians pointing the other way than the paired ratio).

Plain text (the report escapes it as HTML, summary.md as Markdown).
"""

from __future__ import annotations

from collections.abc import Sequence

from coldbench.evidence.analysis.builds import builds_caveats
from coldbench.evidence.analysis.canary import canary_caveats
from coldbench.evidence.analysis.first_cells import LEFT_OUT_REASON, first_cells_caveats
from coldbench.evidence.analysis.telemetry import telemetry_caveats
from coldbench.evidence.contract.schemas import Provenance, TargetInfo
from coldbench.evidence.contract.spec_text import flags_text
from coldbench.evidence.contract.summary_schema import CLAIMS, Comparison, Summary

# More variants than this are named by count (an ablation's none, all and all-minus-f).
_MAX_NAMED = 6
# A drift or a tok/s difference smaller than this (in %) is not worth a line.
_NEGLIGIBLE_PCT = 0.5


def compared_lines(summary: Summary, provenances: Sequence[Provenance]) -> list[tuple[str, str]]:
    """(label, text) rows: the variants as built, the matrix and model, the hosts and dates."""
    rows: list[tuple[str, str]] = []
    targets: dict[str, TargetInfo] = {}
    for provenance in provenances:
        for target in provenance.targets:
            targets.setdefault(target.variant, target)
    described = []
    for name in summary.variants[:_MAX_NAMED]:
        found = targets.get(name)
        text = name + (" (baseline)" if name == summary.baseline else "")
        if found is not None:
            where = found.ref or found.repository or "embedded engine"
            commit = f" {found.commit[:12]}" if found.commit else ""
            dirty = " dirty" if found.dirty else ""
            flags = flags_text(found.flags, empty="defaults")
            text += f" @ {where}{commit}{dirty} · {flags}"
        described.append(text)
    if len(summary.variants) > _MAX_NAMED:
        described.append(f"and {len(summary.variants) - _MAX_NAMED} more (provenance below)")
    rows.append(("compared", "; ".join(described)))
    model = provenances[0].model if provenances else None
    model_name = (model.name or model.path) if model else None
    rounds = max((c.n for c in summary.comparisons), default=0)
    rows.append(
        (
            "matrix",
            f"{summary.mode} · contexts {', '.join(str(c) for c in summary.contexts)} tokens · "
            f"up to {rounds} pairs per comparison · model {model_name or 'unknown'}",
        )
    )
    hosts = []
    for provenance in provenances:
        host = provenance.host
        name = host.registered_name or host.hostname or provenance.run_id
        machine = host.chip or host.cpu or host.gpu
        backend = f", {host.backend}" if host.backend else ""
        hosts.append(
            f"{name} ({machine or 'unknown machine'}{backend}) "
            f"{provenance.created_at.strftime('%Y-%m-%d %H:%M UTC')}"
        )
    if hosts:
        rows.append(("measured on", "; ".join(hosts)))
    return rows


def caveats(summary: Summary) -> list[str]:
    """Everything in the summary that undercuts its verdicts, one sentence each; empty when
    nothing does."""
    found: list[str] = []
    # The evidence as a whole first: a cold check that cannot see a warm cache.
    found += list(summary.evidence_invalid or [])
    found += canary_caveats(summary.canary)
    found += builds_caveats(summary.mlx_builds)
    found += telemetry_caveats(summary.telemetry)
    found += first_cells_caveats(summary.first_cells)
    found += _drift_caveats(summary)
    invalid = summary.invalid
    # the cells the first-cell check left out have a sentence of their own (above)
    reasons = sorted(
        (
            (reason, count)
            for reason, count in invalid.by_reason.items()
            if reason != LEFT_OUT_REASON
        ),
        key=lambda item: -item[1],
    )
    total = sum(count for _, count in reasons)
    if total:
        listed = "; ".join(f"{count} x {reason}" for reason, count in reasons[:3])
        found.append(f"{total} cells were invalid and left out of the statistics ({listed}).")
    if invalid.pairs_with_different_prompts:
        found.append(
            f"{invalid.pairs_with_different_prompts} pairs were dropped: their variants "
            "measured different prompts."
        )
    diverged = summary.parity.counts.diverged
    if diverged:
        found.append(
            f"{diverged} output{'s' if diverged != 1 else ''} diverged from the baseline's "
            "(output parity): a faster variant "
            "that computes something else has not been shown faster at the same work."
        )
    floor = summary.noise_floor
    if floor and floor.process_pairs < summary.settings.min_pairs:
        found.append(
            f"Only {floor.process_pairs} process pairs: the process pair is the independent "
            f"unit of the interval and test, and fewer than {summary.settings.min_pairs} rest "
            "on too few processes (more rounds, or fewer rounds per process, add pairs)."
        )
    reproductions = summary.reproductions
    if reproductions:
        disagree = [row for row in reproductions.comparisons if row.agree is False]
        if disagree:
            where = ", ".join(f"{row.variant} @ {row.context_tokens}" for row in disagree[:4])
            first = (disagree[0].statement or "").removeprefix("hosts disagree: ")
            found.append(f"The hosts disagree for {where}" + (f" ({first})." if first else "."))
    found += _direction_caveats(summary)
    return found


def _effect_pct(comparison: Comparison) -> float | None:
    if comparison.verdict not in CLAIMS or comparison.ratio_median is None:
        return None
    return abs(comparison.ratio_median - 1) * 100


def _drift_caveats(summary: Summary) -> list[str]:
    found = []
    for comparison in summary.comparisons:
        effect = _effect_pct(comparison)
        if effect is None:
            continue
        for run in summary.drift.runs:
            context = comparison.context_tokens
            lines = [c for c in run.by_context or [] if c.context_tokens == context]
            drift = (lines[0] if lines else run).drift_pct_across_run
            if drift is not None and abs(drift) >= effect:
                found.append(
                    f"The baseline drifted {drift:+.2f}% across run {run.run_id} at "
                    f"{comparison.context_tokens} tokens, more than the {effect:.1f}% effect "
                    f"({comparison.variant} {comparison.verdict}): pairing cancels a steady "
                    "drift, not a jump between the two cells of a pair (drift chart below)."
                )
                break
    flagged = [
        run for run in summary.drift.runs if run.flagged and run.drift_pct_across_run is not None
    ]
    if flagged and not found:
        for run in flagged:
            found.append(
                f"The baseline drifted {run.drift_pct_across_run:+.2f}% across run {run.run_id} "
                f"(threshold {summary.drift.threshold_pct:.2f}%)."
            )
    return found


def _direction_caveats(summary: Summary) -> list[str]:
    """Where the tok/s medians and the median paired ratio point different ways."""
    found = []
    for comparison in summary.comparisons:
        ratio = comparison.ratio_median
        base = _median_prefill(summary, comparison.context_tokens, comparison.baseline)
        mine = _median_prefill(summary, comparison.context_tokens, comparison.variant)
        if ratio is None or not base or mine is None:
            continue
        medians_pct = (mine / base - 1) * 100
        ratio_pct = (ratio - 1) * 100
        if abs(medians_pct) < _NEGLIGIBLE_PCT or abs(ratio_pct) < _NEGLIGIBLE_PCT:
            continue
        if (medians_pct > 0) != (ratio_pct > 0):
            found.append(
                f"At {comparison.context_tokens} tokens {comparison.variant}'s median tok/s is "
                f"{abs(medians_pct):.1f}% {'above' if medians_pct > 0 else 'below'} the "
                f"baseline's, but its median paired ratio is {ratio:.3f}: the ratio is the "
                "median of each round's variant-over-baseline on the same prompt, the tok/s "
                "columns are each side's own median, and the rounds disagree with the medians."
            )
    return found


def _median_prefill(summary: Summary, context: int, variant: str) -> float | None:
    for row in summary.descriptive:
        if row.context_tokens == context and row.variant == variant and row.prefill_tps:
            return row.prefill_tps.median
    return None
