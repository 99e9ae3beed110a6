"""The kernels against float32 references, on the GPU (`pytest -m gpu tests/kernels`).

Tolerances, and why (kernels/swiglu.py and kernels/add_rms_norm.py say the same):
- `fused_swiglu` computes in float32 and rounds once: within one unit in the last place (ulp)
  of the output dtype of the float32 formula, and never further from it than the unfused
  reference (which rounds after each of its three ops).
- `fused_add_rms_norm`: `h` bit-exact against `x + r`; `y` within two ulps of MLX's
  `rms_norm(h) * w` and of the float32 formula on the rounded `h`. Only the order of the float32
  sum of squares differs from MLX, but that can flip the rounding of the normalized value, and
  the product with `w` (here up to about 4) carries that one ulp of it into up to two of `y`:
  on the H200 (2026-12-01) float16 at (1, 2048, 4096) differed from MLX by 0.0039 at 3.06, two
  ulps, with every other case within one.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from coldbench.kernels import COUNTERS, detect_backend, swiglu
from coldbench.kernels import add_rms_norm as norm

pytestmark = pytest.mark.gpu

# Relative spacing of each dtype (one ulp of a value v is at most |v| * this).
ULP = {mx.float32: 2.0**-23, mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}
DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# Absolute floor for values near zero (float16 subnormals, cancellations in float32).
ATOL = {mx.float32: 1e-6, mx.float16: 1e-6, mx.bfloat16: 1e-6}


def _normal(shape: tuple[int, ...], dtype: mx.Dtype, seed: int, scale: float = 1.0) -> mx.array:
    return (mx.random.normal(shape, key=mx.random.key(seed)) * scale).astype(dtype)


def _f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def _within(actual: mx.array, expected: np.ndarray, dtype: mx.Dtype, ulps: float) -> None:
    error = np.abs(_f64(actual) - expected)
    bound = ulps * ULP[dtype] * np.abs(expected) + ATOL[dtype]
    worst = int(np.argmax(error - bound))
    assert np.all(error <= bound), (
        f"{dtype}: error {error.flat[worst]:.3g} > bound {bound.flat[worst]:.3g} "
        f"at {worst} (expected {expected.flat[worst]:.6g})"
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2048, 14336), (3, 37, 768), (8, 1, 1, 768), (1, 1, 4)])
def test_fused_swiglu_parity(dtype: mx.Dtype, shape: tuple[int, ...]) -> None:
    gate, up = _normal(shape, dtype, 0, 4.0), _normal(shape, dtype, 1)
    out = swiglu.swiglu(gate, up)
    mx.eval(out)
    assert COUNTERS.dispatched["fused_swiglu"] == 1, COUNTERS.fallback_reason("fused_swiglu")
    g, u = _f64(gate), _f64(up)
    expected = g / (1 + np.exp(-g)) * u
    assert out.dtype == dtype and out.shape == shape
    _within(out, expected, dtype, 1.0 if dtype != mx.float32 else 8.0)
    unfused = np.abs(_f64(swiglu.reference(gate, up)) - expected).max()
    assert np.abs(_f64(out) - expected).max() <= unfused + ATOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2048, 4096), (2, 33, 2048), (1, 1, 4096), (5, 32)])
def test_fused_add_rms_norm_parity(dtype: mx.Dtype, shape: tuple[int, ...]) -> None:
    dim = shape[-1]
    x, r = _normal(shape, dtype, 0, 2.0), _normal(shape, dtype, 1)
    w = _normal((dim,), dtype, 2) + 1
    h, y = norm.add_rms_norm(x, r, w, 1e-5)
    mx.eval(h, y)
    assert COUNTERS.dispatched["fused_add_rms_norm"] == 1, COUNTERS.fallback_reason(
        "fused_add_rms_norm"
    )
    ref_h, ref_y = norm.reference(x, r, w, 1e-5)
    assert h.dtype == y.dtype == dtype
    assert mx.array_equal(h, ref_h).item(), "h must be bit-exact against x + r"
    h64 = _f64(ref_h)
    expected = _f64(w) * (h64 / np.sqrt(np.mean(h64**2, axis=-1, keepdims=True) + 1e-5))
    _within(y, _f64(ref_y), dtype, 2.0 if dtype != mx.float32 else 8.0)
    _within(y, expected, dtype, 2.0 if dtype != mx.float32 else 16.0)


def test_backend_is_a_gpu_one() -> None:
    assert detect_backend() in ("metal", "cuda")
