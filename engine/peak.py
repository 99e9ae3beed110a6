"""The CPU's peak FLOP rate, measured: `python -m coldbench.engine.peak` prints one JSON line.

No table can say what a host's CPU reaches through MLX (cores, vector units, the BLAS it
links, what else the host runs), so the worker measures it before a CPU run's provenance is
written: square matmuls of `SIZE` on MLX's CPU device in float32 and bfloat16, the best of
`REPEATS` each after one untimed call, as TFLOP/s (2 N^3 per matmul). A prefill on the CPU can
reach at most about this rate; the evidence holds each cell against it (evidence/analysis/peak.py).
"""

from __future__ import annotations

import json
import time

import mlx.core as mx

SIZE = 256
REPEATS = 3


def measure(size: int = SIZE, repeats: int = REPEATS) -> dict[str, object]:
    best: dict[str, float] = {}
    with mx.stream(mx.cpu):
        for dtype in (mx.float32, mx.bfloat16):
            a = mx.random.normal((size, size)).astype(dtype)
            b = mx.random.normal((size, size)).astype(dtype)
            mx.eval(a @ b)
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                mx.eval(a @ b)
                seconds.append(time.perf_counter() - start)
            best[str(dtype).removeprefix("mlx.core.")] = 2 * size**3 / min(seconds) / 1e12
    fastest, tflops = max(best.items(), key=lambda item: item[1])
    return {
        "tflops": tflops,
        "dtype": fastest,
        "by_dtype": best,
        "method": f"best of {repeats} {size}x{size} matmuls per dtype on MLX's CPU device",
    }


if __name__ == "__main__":
    print(json.dumps(measure()))
