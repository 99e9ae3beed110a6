"""The gates' decisions and reasons, the escape hatch, the counters, and the reference paths
against float32 formulas written out in numpy (all on any backend)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from coldbench.kernels import COUNTERS, DISABLE_ENV, detect_backend, swiglu
from coldbench.kernels import add_rms_norm as norm


def _normal(shape: tuple[int, ...], dtype: mx.Dtype = mx.float32, seed: int = 0) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_gates_dispatch_on_gpu_backends_for_supported_inputs(backend: str) -> None:
    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        gate, up = _normal((2, 7, 64), dtype), _normal((2, 7, 64), dtype, 1)
        assert swiglu.decide(gate, up, backend).dispatch
        x, r, w = _normal((3, 4096), dtype), _normal((3, 4096), dtype, 1), _normal((4096,), dtype)
        decision = norm.decide(x, r, w, backend)
        assert decision.dispatch and decision.reason is None


def test_gates_refuse_the_cpu_backend_with_the_reason() -> None:
    gate = _normal((4, 64))
    decision = swiglu.decide(gate, gate, "cpu")
    assert not decision.dispatch
    assert decision.reason == "needs metal or cuda; this host runs MLX on cpu"
    w = _normal((64,))
    assert norm.decide(gate, gate, w, "cpu").reason == decision.reason


@pytest.mark.parametrize(
    ("gate", "up", "reason"),
    [
        ((4, 64), (4, 32), "gate shape (4, 64) differs from up shape (4, 32)"),
        ((3, 5), (3, 5), "size 15 is not a positive multiple of 4"),
        ((0, 8), (0, 8), "size 0 is not a positive multiple of 4"),
    ],
)
def test_swiglu_gate_shape_reasons(gate: tuple[int, ...], up: tuple[int, ...], reason: str) -> None:
    decision = swiglu.decide(_normal(gate), _normal(up), "cuda")
    assert (decision.dispatch, decision.reason) == (False, reason)


def test_swiglu_gate_dtype_reasons() -> None:
    ints = mx.zeros((4, 8), dtype=mx.int32)
    assert swiglu.decide(ints, ints, "metal").reason == (
        "dtype int32 is not one of float16, bfloat16, float32"
    )
    mixed = swiglu.decide(_normal((4, 8)), _normal((4, 8), mx.bfloat16), "metal")
    assert mixed.reason == "mixed dtypes bfloat16, float32"


@pytest.mark.parametrize(
    ("x", "w", "reason"),
    [
        ((2, 100), (100,), "last dimension 100 is not a multiple of 32 up to 65536"),
        ((2, 64), (32,), "weight shape (32,) does not match the last dimension 64"),
        ((2, 64), (2, 64), "weight shape (2, 64) does not match the last dimension 64"),
        ((1, 131072), (131072,), "last dimension 131072 is not a multiple of 32 up to 65536"),
    ],
)
def test_norm_gate_shape_reasons(x: tuple[int, ...], w: tuple[int, ...], reason: str) -> None:
    decision = norm.decide(_normal(x), _normal(x), _normal(w), "cuda")
    assert (decision.dispatch, decision.reason) == (False, reason)
    other = norm.decide(_normal(x), _normal((1, *x)), _normal(w), "cuda")
    assert other.reason == f"x shape {x} differs from residual shape {(1, *x)}"


def test_escape_hatch_names_one_fast_path_or_all(monkeypatch: pytest.MonkeyPatch) -> None:
    gate, w = _normal((4, 64)), _normal((64,))
    monkeypatch.setenv(DISABLE_ENV, "fused_swiglu")
    assert swiglu.decide(gate, gate, "cuda").reason == f"disabled by {DISABLE_ENV}=fused_swiglu"
    assert norm.decide(gate, gate, w, "cuda").dispatch
    monkeypatch.setenv(DISABLE_ENV, " all ")
    assert norm.decide(gate, gate, w, "metal").reason == f"disabled by {DISABLE_ENV}= all "
    monkeypatch.setenv(DISABLE_ENV, "")
    assert swiglu.decide(gate, gate, "metal").dispatch


def test_calls_on_this_backend_count_dispatches_or_fallbacks() -> None:
    gate, up = _normal((4, 64)), _normal((4, 64), seed=1)
    swiglu.swiglu(gate, up)
    swiglu.swiglu(gate[:, :3], up[:, :3])
    if detect_backend() == "cpu":
        assert COUNTERS.dispatched["fused_swiglu"] == 0
        assert COUNTERS.fallback_reason("fused_swiglu") == (
            "needs metal or cuda; this host runs MLX on cpu (2 of 2 calls)"
        )
    else:
        assert COUNTERS.dispatched["fused_swiglu"] == 1
        assert COUNTERS.fallback_reason("fused_swiglu") == (
            "size 12 is not a positive multiple of 4 (1 of 2 calls)"
        )
    assert COUNTERS.fallback_reason("fused_add_rms_norm") is None
    COUNTERS.reset()
    assert COUNTERS.fallback_reason("fused_swiglu") is None


def _np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def test_swiglu_reference_matches_float32_formula() -> None:
    gate, up = _normal((3, 5, 96)) * 4, _normal((3, 5, 96), seed=1)
    g, u = _np(gate).astype(np.float64), _np(up).astype(np.float64)
    expected = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(_np(swiglu.reference(gate, up)), expected, rtol=1e-5, atol=1e-6)
    # the call the model makes without the flag: mlx-lm's compiled swiglu, the same values
    from mlx_lm.models.activations import swiglu as stock

    np.testing.assert_allclose(_np(stock(gate, up)), _np(swiglu.reference(gate, up)), rtol=1e-6)


def test_add_rms_norm_reference_matches_float32_formula() -> None:
    x, r, w = _normal((2, 3, 256)), _normal((2, 3, 256), seed=1), _normal((256,), seed=2)
    h, y = norm.reference(x, r, w, 1e-5)
    h64 = _np(x).astype(np.float64) + _np(r).astype(np.float64)
    expected = _np(w) * h64 / np.sqrt(np.mean(h64**2, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(_np(h), h64, rtol=1e-6)
    np.testing.assert_allclose(_np(y), expected, rtol=1e-5, atol=1e-6)
