"""Leave-one-out ablation: what each feature contributes on top of all the others.

For each feature f and context, the paired ratio of `all` over `all-minus-f` (same run, round
and context, so the same prompt): above 1 means removing f makes the candidate slower, i.e. f
earns speed. Verdicts follow `evidence.stats` (Holm across the ablation entries as one family).
These contributions are measured with every other feature on; they interact and do not add up
to the `all` over `none` ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from evidence.stats import (
    CellIndex,
    StatsOptions,
    compare_pairs,
    comparison_seed,
    finish,
    pairs_for,
)
from evidence.summary_schema import Ablation, AblationEntry
from evidence.variant import ABLATION_ALL, minus_variant_name

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
            pairs, _ = pairs_for(index, ABLATION_ALL, without, "prefill_tps", context)
            entry = compare_pairs(
                pairs,
                context_tokens=context,
                variant=ABLATION_ALL,
                baseline=without,
                seed=comparison_seed(options.seed, "ablation", context, feature),
                options=options,
            )
            entries.append({"feature": feature, **entry})
    return Ablation(
        note=ABLATION_NOTE, correction="holm", entries=finish(entries, options, AblationEntry)
    )
