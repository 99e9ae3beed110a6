"""Which MLX backend runs here (`metal`, `cuda`, `cpu`) and which features it can exercise.

A feature that needs another backend (a Metal or CUDA kernel on a CPU host) is recorded as not
exercised with the reason, never as run.
"""

from __future__ import annotations

import contextlib
from typing import Any

import mlx.core as mx

from coldbench import kernels

# feature -> backends on which its fast path can dispatch (every fast path of kernels/)
FEATURE_BACKENDS: dict[str, tuple[str, ...]] = {
    name: kernels.BACKENDS for name in kernels.FAST_PATHS
}


def detect_backend() -> str:
    """`metal`, `cuda` or `cpu` (kernels/ decides the same way, so gates and cells agree)."""
    return kernels.detect_backend()


def describe_backend() -> dict[str, Any]:
    backend = detect_backend()
    info: dict[str, Any] = {"backend": backend, "default_device": str(mx.default_device())}
    device_info = getattr(mx, "device_info", None)
    if backend != "cpu" and device_info is not None:
        with contextlib.suppress(RuntimeError):
            info["device"] = {k: v for k, v in device_info().items() if isinstance(v, int | str)}
    return info


def not_exercised(features: list[str], backend: str | None = None) -> dict[str, str]:
    """feature -> reason, for each requested feature this backend cannot run."""
    backend = backend or detect_backend()
    reasons = {}
    for feature in features:
        needs = FEATURE_BACKENDS.get(feature)
        if needs and backend not in needs:
            reasons[feature] = f"needs {' or '.join(needs)}; this host runs MLX on {backend}"
    return reasons
