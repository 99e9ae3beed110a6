"""Each prefill's achieved FLOP rate against its device's peak: summary.json's `peak`.

The FLOPs of an N-token prefill follow from the model's shape (provenance `model.shape`) alone
(`FLOP_RULE`); divided by the cell's measured `prefill_s` they are the rate the cell achieved.
Held against the device's peak (provenance `device_peak`: evidence/analysis/peaks.py's table or the
CPU's measured matmul rate), a rate above the peak is impossible: the timing is wrong, and the
cell is made `invalid` before any statistics see it (`over_peak`). Only a published peak (the
table) can prove a timing wrong: a measured CPU peak is itself a timing, which the load of the
moment slows as much as the cells (a busy 2-core host measured 1.4 GFLOP/s), so it gives the
share of the peak and invalidates nothing. The share of the peak per context and variant says
how far the engine is from the limit.

A mixture-of-experts model (`shape.experts`) is not counted: which experts a token reaches is
not in the config.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from coldbench.evidence.contract.schemas import DevicePeak, ModelShape, Provenance, Record
from coldbench.evidence.contract.summary_schema import Peak, PrefillRate, RunPeak

OVER_PEAK = "faster than the"
FLOP_RULE = (
    "FLOPs of an N-token prefill: 2 N x the layers' matmul parameters (q, k, v, o, gate, up, "
    "down) + 2 x hidden x vocab (the last position's logits) + 4 x layers x heads x head_dim x "
    "N(N+1)/2 (causal attention: QK^T and AV over the keys each query sees); useful FLOPs, so "
    "a kernel that also computes masked blocks does more work than counted"
)
PEAK_RULE = (
    "a cell whose rate is above the device's published peak has a wrong timing and is invalid "
    "(a measured CPU peak, itself a timing, invalidates nothing)"
)


def prefill_flops(shape: ModelShape, tokens: int) -> float | None:
    """FLOPs of one cold prefill of `tokens` tokens (`FLOP_RULE`); None for a mixture of
    experts."""
    if shape.experts:
        return None
    attention_width = shape.heads * shape.head_dim
    per_layer = (
        2 * shape.hidden * attention_width  # q and o
        + 2 * shape.hidden * shape.kv_heads * shape.head_dim  # k and v
        + 3 * shape.hidden * shape.intermediate  # gate, up, down
    )
    matmul = 2.0 * tokens * shape.layers * per_layer + 2.0 * shape.hidden * shape.vocab
    attention = 4.0 * shape.layers * attention_width * tokens * (tokens + 1) / 2
    return matmul + attention


def _limit(peak: DevicePeak) -> float | None:
    """The rate no cell can reach on this device: a published peak; None for a measured one."""
    return None if peak.measured else peak.tflops


def achieved_tflops(record: Record, shape: ModelShape) -> float | None:
    flops = prefill_flops(shape, record.context_tokens)
    if flops is None or not record.prefill_s:
        return None
    return flops / record.prefill_s / 1e12


def over_peak(records: Sequence[Record], provenances: Sequence[Provenance]) -> list[Record]:
    """`records` with every ok cell whose rate is above its device's limit made invalid."""
    runs = {p.run_id: p for p in provenances}
    kept = []
    for record in records:
        provenance = runs.get(record.run_id)
        shape = provenance.model.shape if provenance else None
        peak = provenance.device_peak if provenance else None
        rate = achieved_tflops(record, shape) if shape and record.status == "ok" else None
        limit = _limit(peak) if peak is not None else None
        if rate is not None and peak is not None and limit is not None and rate > limit:
            record = record.model_copy(
                update={
                    "status": "invalid",
                    # one reason for all such cells (the report counts by reason); the rate
                    # each reached is in its counters
                    "reason": f"prefill {OVER_PEAK} {peak.device} peak of {peak.tflops:.4g} "
                    "TFLOP/s: the timing is wrong",
                    "counters": {**record.counters, "prefill_tflops": round(rate, 4)},
                }
            )
        kept.append(record)
    return kept


def peak_section(records: Sequence[Record], provenances: Sequence[Provenance]) -> Peak | None:
    """The rate per (run, context, variant) over the ok measured cells, with the share of the
    run's device peak; None where no run knows its model's shape."""
    runs = []
    rates = []
    for provenance in provenances:
        shape = provenance.model.shape
        if shape is None:
            continue
        peak = provenance.device_peak
        mine = [r for r in records if r.run_id == provenance.run_id and r.round >= 0]
        over = sum(1 for r in mine if r.status == "invalid" and OVER_PEAK in (r.reason or ""))
        runs.append(
            RunPeak(
                run_id=provenance.run_id,
                device=peak.device if peak else None,
                peak_tflops=peak.tflops if peak else None,
                dtype=peak.dtype if peak else None,
                source=peak.source if peak else None,
                measured=peak.measured if peak else False,
                over_peak=over,
            )
        )
        groups: dict[tuple[int, str], list[float]] = defaultdict(list)
        for record in mine:
            rate = achieved_tflops(record, shape) if record.status == "ok" else None
            if rate is not None:
                groups[(record.context_tokens, record.variant)].append(rate)
        for (context, variant), values in sorted(groups.items()):
            flops = prefill_flops(shape, context)
            assert flops is not None  # a rate was computed from it
            median = float(np.median(values))
            rates.append(
                PrefillRate(
                    run_id=provenance.run_id,
                    context_tokens=context,
                    variant=variant,
                    n=len(values),
                    flops_per_cell=flops,
                    tflops_median=median,
                    share_of_peak=median / peak.tflops if peak else None,
                )
            )
    if not runs:
        return None
    return Peak(runs=runs, rates=rates, flop_rule=FLOP_RULE, rule=PEAK_RULE)


def fastest_lines(peak: Peak) -> list[str]:
    """Per run and context, how far the fastest variant is from its device's peak."""
    lines = []
    for run in peak.runs:
        mine = [r for r in peak.rates if r.run_id == run.run_id]
        for context in sorted({r.context_tokens for r in mine}):
            best = max(
                (r for r in mine if r.context_tokens == context), key=lambda r: r.tflops_median
            )
            if best.share_of_peak is None:
                lines.append(
                    f"{context} tokens: {best.variant} reaches {best.tflops_median:.4g} TFLOP/s "
                    "(the device's peak is unknown)."
                )
                continue
            lines.append(
                f"{context} tokens: the fastest, {best.variant}, reaches "
                f"{best.tflops_median:.4g} TFLOP/s, {best.share_of_peak:.1%} of the "
                f"{run.device} peak ({run.peak_tflops:.4g} TFLOP/s {run.dtype}): "
                f"{1 - best.share_of_peak:.1%} of the peak is left."
            )
    return lines
