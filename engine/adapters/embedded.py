"""The `embedded` adapter: this project's engine (`coldbench.engine.cell`) in the variant process.

With the plan's `checkout` (a worktree of a repository declared `adapter = "embedded"`), the
variant must run that worktree's `engine/` and `kernels/`: the files this process imported for
both must lie inside it, or the adapter refuses to run (a load error, exit 2), as the mlx-lm
adapter does for its checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from coldbench import engine
from coldbench.engine import checkpoints, lean
from coldbench.engine.adapters import process_software
from coldbench.engine.backend import describe_backend, not_exercised
from coldbench.engine.canary import warm_cache
from coldbench.engine.cell import run_cell
from coldbench.engine.flags import Flags
from coldbench.engine.memory import MemoryGuard
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import PromptSource
from coldbench.engine.record import Measurement


class EmbeddedLoadError(ValueError):
    """The engine this process imported is not the checkout's: the variant must not run."""


def check_imported_from(checkout: str | Path) -> None:
    """Raise EmbeddedLoadError unless `engine` and `kernels` came from inside `checkout`."""
    from coldbench import kernels

    root = Path(checkout).resolve()
    for module in (engine, kernels):
        imported = Path(module.__file__ or "").resolve()
        if not imported.is_relative_to(root):
            raise EmbeddedLoadError(
                f"refusing to run: {module.__name__} was imported from {imported}, not from "
                f"inside the checkout {root} (the checkout must come first on the import path)"
            )


class EmbeddedAdapter:
    name = "embedded"

    def __init__(self, plan: Plan) -> None:
        if plan.checkout:
            check_imported_from(plan.checkout)
        self.plan = plan
        self.flags = Flags.parse(plan.flags)
        self.model: Any = None
        self.prompts: PromptSource | None = None
        self.model_info: dict[str, Any] = {}

    def load(self) -> None:
        if self.plan.model.startswith("preset:"):
            path = checkpoints.resolve_model(self.plan.model, {})
        else:
            path = Path(self.plan.model)
        # refused before loading when even the warm-up cannot fit (coldbench.engine.memory)
        memory = MemoryGuard.for_plan(self.plan, path)
        memory.check(min(self.plan.warmup_shapes()))
        memory.share_device()
        if lean.is_installed():
            self.model, tokenizer, config = lean.load(path)
        else:
            self.model, tokenizer, config = checkpoints.load_model(path)
        self.prompts = PromptSource.for_plan(self.plan, tokenizer, config, checks=[memory.check])
        info = checkpoints.inspect_checkpoint(path)
        info.pop("files", None)
        self.model_info = info

    def check_context(self, context_tokens: int) -> None:
        assert self.prompts is not None, "load() first"
        self.prompts.check_context(context_tokens)

    def run_cell(self, round: int, order: int, context_tokens: int) -> Measurement:
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.cell_prompt(self.plan.seed, round, context_tokens)
        result = run_cell(
            self.model,
            prompt.ids,
            context_tokens=context_tokens,
            flags=self.flags,
            decode_tokens=self.plan.decode_tokens,
        )
        result.prompt_corpus_sha256 = prompt.corpus_sha256
        return result

    def canary_cell(self, context_tokens: int) -> Measurement:
        """The run's warm canary (engine/canary.py): the warm-up prompt of `context_tokens`
        on a cache that already holds its first half; the cold check must refuse it."""
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.warmup_prompt(self.plan.seed, context_tokens)
        result = run_cell(
            self.model,
            prompt.ids,
            context_tokens=context_tokens,
            flags=self.flags,
            decode_tokens=self.plan.decode_tokens,
            prompt_cache=warm_cache(self.model, make_prompt_cache, prompt.ids),
        )
        result.prompt_corpus_sha256 = prompt.corpus_sha256
        return result

    def describe(self) -> dict[str, Any]:
        import mlx.core as mx
        import mlx_lm

        return {
            "variant": self.plan.variant,
            "adapter": self.name,
            "engine_module_file": str(Path(engine.__file__).resolve()),
            "checkout": str(Path(self.plan.checkout).resolve()) if self.plan.checkout else None,
            "mlx_lm_module_file": str(Path(mlx_lm.__file__).resolve()),
            "flags": self.flags.as_dict(),
            "mlx": getattr(mx, "__version__", None),
            "mlx_lm": getattr(mlx_lm, "__version__", None),
            "python": sys.version.split()[0],
            "python_executable": sys.executable,
            **describe_backend(),
            "not_exercised": not_exercised(list(self.flags.non_default())),
            "model": self.model_info,
            "software": process_software(),
        }

    def close(self) -> None:
        self.model = None


def create(plan: Plan) -> EmbeddedAdapter:
    return EmbeddedAdapter(plan)
