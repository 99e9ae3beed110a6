"""Output parity: does each variant decode the same token ids as the baseline on the same prompt?

Per (run, round, context, variant), comparing `output_head` with the baseline's:

- `exact`: identical ids.
- `accepted`: they first differ at step i, and the baseline's top-2 logit margin at step i
  (`output_margins[i]`) is below `margin_threshold`: the baseline itself was nearly tied there,
  so a different rounding order may flip the choice (tolerance-level parity, not bit-exact).
- `diverged`: they differ where the baseline was not near a tie, or the margin is unknown.
- `unknown`: one side has no output ids.

Greedy decoding continues from the chosen token, so everything after the first divergence is
expected to differ; only the first divergence is judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from coldbench.evidence.analysis.stats import CellIndex
from coldbench.evidence.contract.summary_schema import (
    Parity,
    ParityCell,
    ParityCounts,
    ParityResult,
)

# Logit units. Reduced-precision kernels reorder sums and move logits by about 1e-2; a margin
# under 0.1 is a near tie that such rounding can flip.
PARITY_MARGIN_THRESHOLD = 0.1


def first_divergence(candidate: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first differing id (a shorter output differs at its end); None if equal."""
    for index, (a, b) in enumerate(zip(candidate, reference, strict=False)):
        if a != b:
            return index
    if len(candidate) != len(reference):
        return min(len(candidate), len(reference))
    return None


def parity_section(
    index: CellIndex, *, variants: Sequence[str], baseline: str, margin_threshold: float
) -> Parity:
    """summary.json's `parity`."""
    base = index.of_variant(baseline)
    cells = []
    for variant in variants:
        if variant == baseline:
            continue
        for (run_id, round_index, context), record in sorted(index.of_variant(variant).items()):
            partner = base.get((run_id, round_index, context))
            if partner is None:
                continue
            divergence: int | None = None
            margin: float | None = None
            result: ParityResult
            if record.output_head is None or partner.output_head is None:
                result = "unknown"
            else:
                divergence = first_divergence(record.output_head, partner.output_head)
                margins = partner.output_margins or []
                if divergence is not None and divergence < len(margins):
                    margin = margins[divergence]
                if divergence is None:
                    result = "exact"
                elif margin is not None and margin < margin_threshold:
                    result = "accepted"
                else:
                    result = "diverged"
            cells.append(
                ParityCell(
                    run_id=run_id,
                    round=round_index,
                    context_tokens=context,
                    variant=variant,
                    first_divergence=divergence,
                    baseline_margin=margin,
                    result=result,
                )
            )
    counts = Counter(cell.result for cell in cells)
    return Parity(
        margin_threshold=margin_threshold,
        policy=(
            "exact ids, or a first divergence accepted only where the baseline's top-2 logit "
            f"margin at that step is below {margin_threshold}"
        ),
        counts=ParityCounts(
            exact=counts["exact"],
            accepted=counts["accepted"],
            diverged=counts["diverged"],
            unknown=counts["unknown"],
        ),
        cells=cells,
    )
