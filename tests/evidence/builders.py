"""Builders for synthetic records and provenance: simulated benchmark runs with known truth."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from coldbench.evidence.contract.schemas import Provenance, Record

START = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


def _sha(*parts: object) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()


def record(**overrides: Any) -> Record:
    """One valid `ok` record; override any field."""
    values: dict[str, Any] = {
        "schema": "coldbench.record/1",
        "run_id": "r-1",
        "variant": "base",
        "round": 0,
        "order": 0,
        "context_tokens": 64,
        "prompt_tokens": 64,
        "prompt_sha256": _sha("prompt", 0, 64),
        "cached_tokens": 0,
        "prefill_s": 0.5,
        "prefill_tps": 128.0,
        "decode_tokens": 4,
        "decode_s": 0.1,
        "decode_tps": 40.0,
        "output_sha256": _sha("out"),
        "output_head": [1, 2, 3, 4],
        "peak_memory_bytes": 1_000_000,
        "counters": {"chunks": 1},
        "started_at": START,
        "ended_at": START + timedelta(seconds=1),
        "status": "ok",
        "reason": None,
    }
    values.update(overrides)
    return Record.model_validate(values)


def simulate_run(
    *,
    effects: Mapping[str, float],
    contexts: Sequence[int] = (64, 256),
    rounds: int = 12,
    noise: float = 0.02,
    seed: int = 0,
    run_id: str = "r-1",
    base_tps: float = 1000.0,
    decode_effects: Mapping[str, float] | None = None,
    drift_per_hour: float = 0.0,
    cell_s: float = 30.0,
    start: datetime = START,
    outputs: Mapping[str, list[int]] | None = None,
    margins: list[float] | None = None,
) -> list[Record]:
    """Records of one simulated run in a rotated order.

    `effects` maps variant -> true prefill speed factor (the first variant is the baseline,
    usually 1.0). Each cell's tok/s is base * effect * (context-dependent scale) * drift(t) *
    exp(N(0, noise)), with one warm-up record first. `outputs` optionally maps variant -> the
    output ids it decodes (default: identical for all); `margins` are the top-2 margins stored
    on every record.
    """
    rng = np.random.default_rng(seed)
    variants = list(effects)
    decode_effects = decode_effects or {v: 1.0 for v in variants}
    records = [
        record(
            run_id=run_id,
            variant=variants[0],
            round=-1,
            order=-1,
            status="warmup",
            reason="discarded warm-up",
            started_at=start,
            ended_at=start + timedelta(seconds=cell_s),
        )
    ]
    t = start + timedelta(seconds=cell_s)
    order = 0
    for round_index in range(rounds):
        cells = [(c, v) for c in contexts for v in variants]
        shift = round_index % len(cells)
        for context, variant in cells[shift:] + cells[:shift]:
            hours = (t - start).total_seconds() / 3600
            scale = base_tps * (1 - context / 8192) * (1 + drift_per_hour) ** hours
            prefill_tps = scale * effects[variant] * float(np.exp(rng.normal(0, noise)))
            decode_tps = 50.0 * decode_effects[variant] * float(np.exp(rng.normal(0, noise)))
            head = list((outputs or {}).get(variant, [5, 6, 7, 8]))
            records.append(
                record(
                    run_id=run_id,
                    variant=variant,
                    round=round_index,
                    order=order,
                    context_tokens=context,
                    prompt_tokens=context,
                    prompt_sha256=_sha(seed, round_index, context),
                    prefill_s=context / prefill_tps,
                    prefill_tps=prefill_tps,
                    decode_tokens=len(head),
                    decode_s=len(head) / decode_tps,
                    decode_tps=decode_tps,
                    output_sha256=_sha(head),
                    output_head=head,
                    output_margins=list(margins) if margins is not None else None,
                    peak_memory_bytes=1000 * context + 17 * len(variant),
                    flags={},
                    started_at=t,
                    ended_at=t + timedelta(seconds=cell_s),
                )
            )
            t += timedelta(seconds=cell_s)
            order += 1
    return records


def provenance(run_id: str = "r-1", hostname: str = "studio-1", **overrides: Any) -> Provenance:
    values: dict[str, Any] = {
        "schema": "coldbench.provenance/1",
        "run_id": run_id,
        "created_at": START,
        "host": {"hostname": hostname, "chip": "Apple M3 Ultra", "cores": 32, "backend": "metal"},
        "software": {"python": "3.11.9", "mlx": "0.32.4", "mlx_lm": "0.32.2", "coldbench": "0.1.0"},
        "targets": [
            {
                "variant": "base",
                "commit": "a" * 40,
                "ref": "main",
                "flags": {"prefill_step_size": 2048},
                "build_log_sha256": _sha("log-base"),
            },
            {"variant": "fast", "commit": "b" * 40, "ref": "feature", "flags": {"compile": True}},
        ],
        "model": {"name": "preset:tiny", "weights_sha256": _sha("weights")},
        "job_spec_sha256": _sha("spec"),
        "command": "coldbench run --model preset:tiny --contexts 64,256 --rounds 12",
    }
    values.update(overrides)
    return Provenance.model_validate(values)


def calibration_sample(hostname: str = "studio-1") -> dict[str, Any]:
    """A `coldbench calibrate` result (coldbench.evidence.contract.calibration.HostCalibration) as
    JSON."""
    comparison = {"context_tokens": 16384, "n": 24, "blocks": 12, "ratio_median": 0.998}
    aa = [
        {
            **comparison,
            "variant": v,
            "ci_low": 0.99,
            "ci_high": 1.006,
            "verdict": "no established change",
        }
        for v in ("b", "c")
    ]
    planted = [
        {
            **comparison,
            "variant": "b",
            "ci_low": 0.99,
            "ci_high": 1.006,
            "verdict": "no established change",
        },
        {**comparison, "variant": "c", "ci_low": 0.972, "ci_high": 0.985, "verdict": "slower"},
    ]
    return {
        "schema": "coldbench.calibration/1",
        "created_at": START.isoformat(),
        "host": {"hostname": hostname, "backend": "cuda", "gpu": "NVIDIA H200"},
        "model": "llama-8b-shape",
        "contexts": [16384],
        "rounds": 24,
        "rounds_per_process": None,
        "decode_tokens": 2,
        "base_flags": {},
        "planted_flags": {"prefill_step_size": 1024},
        "statistics": {"unit": "process pair"},
        "aa_jobs": 10,
        "aa_claims": 0,
        "planted_jobs": 10,
        "planted_detected": 10,
        "planted_verdicts": {"slower": 10},
        "resolvable": 0.008,
        "between_process_sd": 0.006,
        "jobs": [
            {"kind": "aa", "seed": 0, "status": "succeeded", "comparisons": aa},
            {"kind": "planted", "seed": 1, "status": "succeeded", "comparisons": planted},
        ],
    }
