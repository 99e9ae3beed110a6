"""What every fast path shares: the backend, the escape hatch, the gate's decision, counters.

A gate answers with a `Decision`: dispatch the kernel, or run the reference with a reason a
person can read (`needs metal or cuda; this host runs MLX on cpu`, `dtype int32 is not one of
float16, bfloat16, float32`, `disabled by COLDBENCH_DISABLE_KERNELS=all`). The reason is what
`<flag>.fallback` carries into a record, and engine/judge.py turns it into `fell back: <flag>`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx

# The fast paths this package provides (each is also an engine flag of the same name).
FAST_PATHS = ("fused_swiglu", "fused_add_rms_norm")
# Backends on which a fast path can dispatch: it has a Metal and a CUDA source, nothing else.
BACKENDS = ("metal", "cuda")
DTYPES = (mx.float16, mx.bfloat16, mx.float32)
DISABLE_ENV = "COLDBENCH_DISABLE_KERNELS"


def detect_backend() -> str:
    """`metal`, `cuda` or `cpu`: which MLX backend this host has (coldbench.engine.backend asks
    here)."""
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "cpu"


def disabled(name: str) -> str | None:
    """The escape hatch: a reason when COLDBENCH_DISABLE_KERNELS names `name` (or `all`)."""
    value = os.environ.get(DISABLE_ENV, "")
    names = {part.strip() for part in value.split(",") if part.strip()}
    if name in names or "all" in names:
        return f"disabled by {DISABLE_ENV}={value}"
    return None


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


@dataclass(frozen=True)
class Decision:
    """The gate's answer for one call: dispatch the kernel, or fall back with the reason."""

    name: str
    dispatch: bool
    reason: str | None = None

    @classmethod
    def check(cls, name: str, backend: str, problems: list[str | None]) -> Decision:
        """Dispatch unless the escape hatch, the backend or one of `problems` says no."""
        reason = disabled(name)
        if reason is None and backend not in BACKENDS:
            reason = f"needs {' or '.join(BACKENDS)}; this host runs MLX on {backend}"
        reason = reason or next((p for p in problems if p), None)
        return cls(name, reason is None, reason)


def dtype_problem(*arrays: mx.array) -> str | None:
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1:
        return f"mixed dtypes {', '.join(sorted(dtype_name(d) for d in dtypes))}"
    (dtype,) = dtypes
    if dtype not in DTYPES:
        allowed = ", ".join(dtype_name(d) for d in DTYPES)
        return f"dtype {dtype_name(dtype)} is not one of {allowed}"
    return None


@dataclass
class Counters:
    """Dispatches and fallbacks per fast path since the last `reset` (one cell's worth)."""

    dispatched: Counter[str] = field(default_factory=Counter)
    fallbacks: dict[str, Counter[str]] = field(default_factory=dict)

    def reset(self) -> None:
        self.dispatched.clear()
        self.fallbacks.clear()

    def record(self, decision: Decision) -> None:
        if decision.dispatch:
            self.dispatched[decision.name] += 1
        else:
            reasons = self.fallbacks.setdefault(decision.name, Counter())
            reasons[decision.reason or "no reason given"] += 1

    def fallback_reason(self, name: str) -> str | None:
        """The most frequent fallback reason of `name` with its count, or None if it never fell
        back (`dtype int32 is not ... (64 of 64 calls)`)."""
        reasons = self.fallbacks.get(name)
        if not reasons:
            return None
        reason, count = reasons.most_common(1)[0]
        total = sum(reasons.values()) + self.dispatched[name]
        more = f"; {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else ""
        return f"{reason} ({count} of {total} calls{more})"


COUNTERS = Counters()
