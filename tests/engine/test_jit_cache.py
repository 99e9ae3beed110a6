"""engine/jit_cache.py: where MLX's CUDA backend keeps the kernels it compiles, and their count."""

from __future__ import annotations

from pathlib import Path

from coldbench.engine.jit_cache import (
    KERNEL_CACHE_ENV,
    kernel_cache_dir,
    kernel_modules,
    mlx_version,
    modules_compiled,
)


def test_the_cache_folder_is_mlxs_own_choice(tmp_path: Path) -> None:
    # mlx/backend/cuda/jit_module.cpp: MLX_PTX_CACHE_DIR, else <temp dir>/mlx/<version>/ptx
    assert kernel_cache_dir({KERNEL_CACHE_ENV: str(tmp_path)}, "0.32.4") == tmp_path
    assert kernel_cache_dir({"TMPDIR": "/scratch"}, "0.32.4") == Path("/scratch/mlx/0.32.4/ptx")
    assert kernel_cache_dir({"TEMP": "/t"}, "0.32.4") == Path("/t/mlx/0.32.4/ptx")
    assert kernel_cache_dir({}, "0.32.4") == Path("/tmp/mlx/0.32.4/ptx")
    # the version is the loaded MLX's own (what its C++ `version()` names the folder by)
    import mlx.core as mx

    assert mlx_version() == mx.__version__
    assert kernel_cache_dir({}) == Path(f"/tmp/mlx/{mx.__version__}/ptx")
    # an empty variable is unset for C++'s getenv checks too
    assert kernel_cache_dir({KERNEL_CACHE_ENV: "", "TMPDIR": ""}, "1.0") == Path("/tmp/mlx/1.0/ptx")


def test_modules_are_counted_by_their_compiled_file(tmp_path: Path) -> None:
    assert kernel_modules(tmp_path / "absent") is None
    assert kernel_modules(tmp_path) == 0
    # one module writes its binary (.ptx), its kernel names (.txt) and its source (.cu)
    for name in ("binary_add", "gather_mm"):
        for suffix in (".ptx", ".txt", ".cu"):
            (tmp_path / f"{name}{suffix}").write_text("x")
    assert kernel_modules(tmp_path) == 2
    assert modules_compiled(None, 2) == 2  # the folder appeared: everything in it is new
    assert modules_compiled(2, 2) == 0
    assert modules_compiled(None, None) is None  # no cache at all (Metal, the CPU)
    assert modules_compiled(3, 2) == 0  # emptied meanwhile: nothing compiled that we can tell
