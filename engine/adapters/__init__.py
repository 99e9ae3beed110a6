"""Adapters: how the variant process drives a target.

An adapter module `engine/adapters/<module>.py` exposes `create(plan: Plan) -> Adapter`; the
table of coldbench.engine.adapter_traits maps the adapter names of a plan (DESIGN.md:
`embedded`, `mlx-lm`, `openai-server`) to those modules and imports only the one a plan asks for.

Contract of `Adapter.run_cell(round, order, context_tokens)`: return the measured part of a
record (`coldbench.engine.record.Measurement`, judged by `coldbench.engine.judge`);
`round == -1` means the discarded warm-up, which must use a prompt no measured cell uses
(`PromptSource.warmup_prompt`). The runner adds `schema`, `run_id`, `variant`, `round`,
`order`, `context_tokens`, `adapter`, `flags`, and turns an exception into an error record.
An adapter may also define `check_context(context_tokens)` raising ValueError for a context
it cannot serve: in batch mode the runner calls it for every context before the first cell.
`describe()` is the ready event's `target`: at least `adapter`, `engine_module_file` (the file
the engine module was really imported from), `flags`, `mlx`, `mlx_lm`, `backend`, and
`software` (`process_software()`): the versions and files imported inside the process that ran
the cells, which provenance keeps per variant. Its shape, shared with the openai-server adapter
(which reports what the server's interpreter imports): `python`, `python_executable`, `mlx`,
`mlx_lm`, `coldbench` (versions, None when unknown) and `files` (name -> absolute path of the
file the module was imported from: `engine` and `kernels` (`coldbench.engine`,
`coldbench.kernels`), `mlx`, `mlx_lm`; a tree from before the move reports its top-level
`fastpaths` in place of `kernels`, and one from before that package's rename `kernels`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

from coldbench.engine.adapter_traits import ADAPTERS
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import Prompt
from coldbench.engine.record import Measurement, now_iso


class Adapter(Protocol):
    def load(self) -> None: ...

    def run_cell(self, round: int, order: int, context_tokens: int) -> Measurement: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def create_adapter(plan: Plan) -> Adapter:
    traits = ADAPTERS.get(plan.adapter)
    if traits is None:
        raise ValueError(f"unknown adapter {plan.adapter!r}; known: {', '.join(sorted(ADAPTERS))}")
    module_name = traits.module
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise ValueError(f"adapter {plan.adapter!r} is not available in this checkout") from None
    return module.create(plan)


def measure_prompt(
    measure: Callable[..., Measurement], prompt: Prompt, context_tokens: int
) -> Measurement:
    """Run an out-of-process adapter's `measure(ids, context_tokens=...)` on one cell's prompt,
    stamping the wall-clock start and end and the corpus digest the prompt was cut from."""
    started_at = now_iso()
    result = measure(prompt.ids, context_tokens=context_tokens)
    result.prompt_corpus_sha256 = prompt.corpus_sha256
    result.started_at, result.ended_at = started_at, now_iso()
    return result


def _distribution(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


# Variables that change how MLX, CUDA or the C library run a variant process (MLX's kernel cache
# folder, the visible devices, glibc's malloc tunables: `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`
# backs MLX's per-tensor load buffers with huge pages); the evidence keeps what each process saw.
RUNTIME_ENV_PREFIXES = ("MLX_", "CUDA_", "GLIBC_TUNABLES", "MALLOC_")


def runtime_environment() -> dict[str, str]:
    """This process's variables named by `RUNTIME_ENV_PREFIXES`, sorted."""
    return {
        name: os.environ[name]
        for name in sorted(os.environ)
        if name.startswith(RUNTIME_ENV_PREFIXES)
    }


def process_software(**modules: Any) -> dict[str, Any]:
    """Versions and imported files in this process (`describe()["software"]`).

    `modules` adds named modules to the files (e.g. the checkout's `mlx_lm`); `engine`,
    `kernels` and `mlx` (mlx.core's extension) are always listed, `mlx_lm` when imported.
    """
    import mlx.core as mx

    from coldbench import engine, kernels

    found: dict[str, Any] = {"engine": engine, "kernels": kernels, "mlx": mx}
    if "mlx_lm" in sys.modules:
        found["mlx_lm"] = sys.modules["mlx_lm"]
    found.update(modules)
    files = {
        name: str(Path(module.__file__).resolve())
        for name, module in found.items()
        if getattr(module, "__file__", None)
    }
    mlx_lm = found.get("mlx_lm")
    from coldbench.engine.mlx_build import mlx_build

    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "mlx": getattr(mx, "__version__", None) or _distribution("mlx"),
        "mlx_lm": getattr(mlx_lm, "__version__", None) or _distribution("mlx-lm"),
        "coldbench": _distribution("coldbench"),
        "files": files,
        "mlx_build": mlx_build(),
        "environment": runtime_environment(),
    }
