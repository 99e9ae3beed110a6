"""kernels: fast paths with reference fallbacks, their gates and their dispatch counters.

Each fast path is a module with a Metal source (`mx.fast.metal_kernel`), a CUDA source
(`mx.fast.cuda_kernel`), a reference path in plain MLX ops, and a gate (`decide`) on backend,
dtype and shape. Calling a fast path runs the gate every time: it dispatches the kernel or runs
the reference, and records which in `coldbench.kernels.gate.COUNTERS` (dispatches, and each fallback
with its reason), so a cell proves what ran. The fast paths:

- `fused_swiglu` (`coldbench.kernels.swiglu`): `silu(gate) * up` in one elementwise pass, computed
  in float32 and rounded once.
- `fused_add_rms_norm` (`coldbench.kernels.add_rms_norm`): `h = x + r; y = rms_norm(h) * w` in one
  pass per row, returning both `h` and `y`.

`COLDBENCH_DISABLE_KERNELS` (`name,name` or `all`) sends the named fast paths to their
reference with the reason recorded. docs/KERNELS.md says what each one guarantees.

May import: mlx, numpy and the standard library (engine/ imports this package, never the
reverse).
"""

from __future__ import annotations

from coldbench.kernels.gate import (
    BACKENDS,
    COUNTERS,
    DISABLE_ENV,
    FAST_PATHS,
    Decision,
    detect_backend,
)

__all__ = ["BACKENDS", "COUNTERS", "DISABLE_ENV", "FAST_PATHS", "Decision", "detect_backend"]
