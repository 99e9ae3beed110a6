"""`fused_swiglu`: `silu(gate) * up` in one elementwise kernel.

mlx-lm's llama, qwen3 and qwen3_moe MLPs call `mlx_lm.models.activations.swiglu`, an
`mx.compile`d `nn.silu(gate) * x`: MLX fuses it into one kernel on the GPU, but each op of the
graph rounds to the input dtype (sigmoid, then the product with the gate, then with `up`). The
fused kernel reads both inputs once, computes in float32, and rounds once; each thread handles
`VECTOR` consecutive elements, so the gate asks for a total size that is a multiple of it.

Tolerance against a float32 reference (tests/kernels): float32 inputs within 1e-5 relative;
float16/bfloat16 within one unit in the last place of the output dtype, where the unfused
reference is allowed the three roundings it does (measured, not assumed, by the GPU test).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from coldbench.kernels.gate import COUNTERS, Decision, detect_backend, dtype_problem

NAME = "fused_swiglu"
VECTOR = 4  # elements per thread
THREADS = 256

# The body of the kernel; the signature (gate, up, out, gate_shape, gate_ndim) is generated
# by MLX. Shapes are read at run time so one compiled kernel serves every chunk width.
METAL_SOURCE = """
    uint n = 1;
    for (int d = 0; d < gate_ndim; ++d) {
        n *= uint(gate_shape[d]);
    }
    uint base = thread_position_in_grid.x * VECTOR;
    if (base >= n) {
        return;
    }
    for (uint k = 0; k < VECTOR; ++k) {
        float g = float(gate[base + k]);
        float u = float(up[base + k]);
        out[base + k] = T(g / (1.0f + metal::precise::exp(-g)) * u);
    }
"""

CUDA_SOURCE = """
    size_t n = 1;
    for (int d = 0; d < gate_ndim; ++d) {
        n *= static_cast<size_t>(gate_shape[d]);
    }
    size_t base = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VECTOR;
    if (base >= n) {
        return;
    }
    #pragma unroll
    for (int k = 0; k < VECTOR; ++k) {
        float g = static_cast<float>(gate[base + k]);
        float u = static_cast<float>(up[base + k]);
        out[base + k] = static_cast<T>(g / (1.0f + expf(-g)) * u);
    }
"""

_KERNELS: dict[str, Any] = {}


def _kernel(backend: str) -> Any:
    """The compiled-on-first-use kernel object of `backend` (constructing one needs it)."""
    kernel = _KERNELS.get(backend)
    if kernel is None:
        make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
        kernel = make(
            name="coldbench_fused_swiglu",
            input_names=["gate", "up"],
            output_names=["out"],
            source=METAL_SOURCE if backend == "metal" else CUDA_SOURCE,
            ensure_row_contiguous=True,
        )
        _KERNELS[backend] = kernel
    return kernel


def decide(gate: mx.array, up: mx.array, backend: str | None = None) -> Decision:
    """Whether the kernel may run on these inputs here (the reason when it may not)."""
    backend = backend or detect_backend()
    shape = None
    if gate.shape != up.shape:
        shape = f"gate shape {gate.shape} differs from up shape {up.shape}"
    elif gate.size == 0 or gate.size % VECTOR:
        shape = f"size {gate.size} is not a positive multiple of {VECTOR}"
    elif gate.size >= 2**31:
        shape = f"size {gate.size} needs 64-bit grid indices"
    return Decision.check(NAME, backend, [dtype_problem(gate, up), shape])


def reference(gate: mx.array, up: mx.array) -> mx.array:
    """What the model computes without the flag (mlx-lm's swiglu)."""
    return nn.silu(gate) * up


def fused(gate: mx.array, up: mx.array, backend: str) -> mx.array:
    """The kernel itself, without the gate (callers go through `swiglu`)."""
    threads = gate.size // VECTOR
    (out,) = _kernel(backend)(
        inputs=[gate, up],
        template=[("T", gate.dtype), ("VECTOR", VECTOR)],
        grid=(threads, 1, 1),
        threadgroup=(min(THREADS, threads), 1, 1),
        output_shapes=[gate.shape],
        output_dtypes=[gate.dtype],
    )
    return out


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """`silu(gate) * up`: the kernel where the gate allows it, else the reference; counted."""
    decision = decide(gate, up)
    COUNTERS.record(decision)
    if decision.dispatch:
        return fused(gate, up, detect_backend())
    return reference(gate, up)
