"""MLX's CUDA kernel cache: where the kernels MLX compiles at run time are kept, and how many.

MLX's CUDA backend compiles some kernels when a process first needs them (NVRTC; fused and
shape-specialised kernels) and keeps each compiled module in a folder (mlx/backend/cuda/
jit_module.cpp): `MLX_PTX_CACHE_DIR`, else `<temp dir>/mlx/<version>/ptx`, the temp dir as C++'s
`temp_directory_path` finds it. A process whose kernels are in that folder loads them; one whose
kernels are not compiles them, seconds a module, inside its warm-ups. A host's first run (or its
first after an MLX upgrade, or a temp dir cleared at boot) pays that once; the variant processes
report how many modules they compiled (engine/runner.py's `ready` event) so that a report can
say why a first block's warm-ups were long. Metal and the CPU keep no such folder: no count.

Imports only the standard library, so that a benchmark can count a host's cache without MLX.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from pathlib import Path

KERNEL_CACHE_ENV = "MLX_PTX_CACHE_DIR"
_TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")


def mlx_version() -> str:
    """The version MLX names its kernel cache folder by: the loaded mlx.core's, else the
    installed distribution's (a benchmark, or an adapter that serves through another process,
    imports none)."""
    core = sys.modules.get("mlx.core")
    if core is not None:
        return str(getattr(core, "__version__", "unknown"))
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def kernel_cache_dir(env: Mapping[str, str] | None = None, version: str | None = None) -> Path:
    """The folder MLX's CUDA backend keeps its compiled kernels in, for this environment
    (default: this process's) and MLX version (default: `mlx_version()`)."""
    env = os.environ if env is None else env
    if env.get(KERNEL_CACHE_ENV):
        return Path(env[KERNEL_CACHE_ENV])
    temp = next((env[name] for name in _TEMP_VARIABLES if env.get(name)), "/tmp")
    return Path(temp) / "mlx" / (version or mlx_version()) / "ptx"


def kernel_modules(folder: Path) -> int | None:
    """Compiled modules in the cache (one `.ptx` file each: a cubin where NVRTC targets the
    device's own architecture, as on Hopper); None where the folder does not exist (Metal, the
    CPU, or a CUDA process that has compiled nothing yet)."""
    try:
        return sum(1 for entry in os.scandir(folder) if entry.name.endswith(".ptx"))
    except OSError:
        return None


def modules_compiled(before: int | None, after: int | None) -> int | None:
    """Modules added to the cache between two counts (None where there is no cache at all)."""
    if after is None:
        return None
    return max(after - (before or 0), 0)
