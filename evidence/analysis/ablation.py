"""Leave-one-out ablation: what each feature contributes on top of all the others.

For each feature f and context, the paired ratio of `all` over `all-minus-f` (same run, round
and context, so the same prompt): above 1 means removing f makes the candidate slower, i.e. f
earns speed. Verdicts follow `coldbench.evidence.analysis.stats` (Bonferroni across the ablation
entries as one family).
These contributions are measured with every other feature on; they interact and do not add up
to the `all` over `none` ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from coldbench.evidence.analysis.stats import CellIndex, StatsOptions, compare_variants, finish
from coldbench.evidence.contract.summary_schema import Ablation, AblationEntry, Verdict
from coldbench.evidence.contract.variant import ABLATION_ALL, minus_variant_name

ABLATION_NOTE = (
    "Each ratio is all / all-minus-<feature>: what removing that one feature costs with every "
    "other feature on. Features interact, so these contributions are not additive and do not "
    "sum to the all / none ratio."
)


def ablation_section(
    index: CellIndex,
    *,
    features: Sequence[str],
    contexts: Sequence[int],
    options: StatsOptions,
) -> Ablation | None:
    """summary.json's `ablation`, or None when the job has no ablation features."""
    if not features:
        return None
    entries = []
    for context in contexts:
        for feature in features:
            without = minus_variant_name(feature)
            entry, _ = compare_variants(
                index,
                variant=ABLATION_ALL,
                baseline=without,
                context_tokens=context,
                options=options,
            )
            entries.append({"feature": feature, **entry})
    return Ablation(
        note=ABLATION_NOTE, correction="bonferroni", entries=finish(entries, options, AblationEntry)
    )


def ablation_sentence(ablation: Ablation) -> str:
    """The ablation's answer in one sentence: which features pay (all is faster with them than
    without), which cost, and which established nothing, with the contexts where each holds."""
    by_feature: dict[str, list[AblationEntry]] = {}
    for entry in ablation.entries:
        by_feature.setdefault(entry.feature, []).append(entry)
    parts = []
    for feature, entries in by_feature.items():
        found = []
        for verdict, word in ((Verdict.FASTER, "pays"), (Verdict.SLOWER, "costs")):
            held = [e for e in entries if e.verdict == verdict and e.ratio_median is not None]
            if held:
                contexts = ", ".join(str(e.context_tokens) for e in held)
                largest = max(abs((e.ratio_median or 1.0) - 1) for e in held)
                found.append(
                    f"{word} at {contexts} tokens (all is up to {100 * largest:.1f}% "
                    f"{verdict} with it)"
                )
        if found:
            parts.append(f"{feature} {' and '.join(found)}")
        else:
            verdicts = " / ".join(dict.fromkeys(str(e.verdict) for e in entries))
            parts.append(f"{feature}: {verdicts}")
    return f"Leave one out, all features against all but one: {'; '.join(parts)}."
