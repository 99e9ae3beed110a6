"""The `mlx-lm` adapter: drive any checkout of mlx-lm (or a fork) through its Python API.

The checkout's own `mlx_lm` must be the one that runs: it is put first on `sys.path`, a host
copy that engine code imported earlier is dropped from `sys.modules`, and the adapter refuses to
run (a load error, exit 2 in the variant process) when `mlx_lm.__file__` still lies outside the
checkout, the install-path defect of seed 002. The imported file is recorded in the target and
in every record's counters (`engine_module_file`).

A cell runs the checkout's `mlx_lm.generate.generate_step` on a fresh prompt cache with the
variant's `prefill_step_size`. Prefill time is the time to the first token (its value is
materialised, so every prefill chunk has run); decode time is measured separately, from the
first token to the last. Chunk widths are the token counts of the model's forward calls that
took the prompt (`CallWidths`), i.e. from the loop that actually ran in the checkout, not from
what stock mlx-lm would do. `coldbench.engine.judge`
judges them by what the requested step implies (`ChunksOf`: chunks of that step, whatever the
checkout's remainder policy), and calls the cell a no-op only when the widths are stock's.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx

from coldbench.engine import checkpoints
from coldbench.engine.adapter_traits import ADAPTERS
from coldbench.engine.adapters import measure_prompt, process_software
from coldbench.engine.backend import describe_backend
from coldbench.engine.canary import cold_check_blind, warm_cache
from coldbench.engine.flags import Flags
from coldbench.engine.judge import (
    ChunksOf,
    Expectation,
    Observation,
    generate_step_widths,
    judge_cell,
    runs_text,
    to_runs,
)
from coldbench.engine.memory import MemoryGuard
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import PromptSource, ids_sha256
from coldbench.engine.record import Measurement

logger = logging.getLogger(__name__)

NAME = "mlx-lm"
MODULE = "mlx_lm"
SUPPORTED_FLAGS = ADAPTERS[NAME].flags
OUTPUT_HEAD = 16


class MlxLmLoadError(ValueError):
    """The checkout, its module or the model cannot be used: the variant must not run."""


def parse_flags(flags: Mapping[str, Any] | None) -> Flags:
    """Accept only what generate_step can honour; anything else is refused, never ignored.
    Values are checked by `coldbench.engine.flags.Flags` (the one rule for every adapter); the
    default of `prefill_step_size` is generate_step's own, which this engine shares."""
    unknown = sorted(set(flags or {}) - set(SUPPORTED_FLAGS))
    if unknown:
        raise MlxLmLoadError(
            f"mlx-lm adapter does not support flag(s) {', '.join(unknown)}; "
            f"supported: {', '.join(SUPPORTED_FLAGS)}"
        )
    try:
        return Flags.parse(flags)
    except ValueError as error:
        raise MlxLmLoadError(str(error)) from None


def _is_inside(path: str | Path | None, root: Path) -> bool:
    if path is None:
        return False
    return Path(path).resolve().is_relative_to(root)


def import_from_checkout(checkout: str | Path, module: str = MODULE) -> ModuleType:
    """Import `module` from `checkout` or raise MlxLmLoadError saying where it came from."""
    root = Path(checkout).resolve()
    if not root.is_dir():
        raise MlxLmLoadError(f"mlx-lm checkout not found: {root}")
    if sys.path[:1] != [str(root)]:
        sys.path.insert(0, str(root))
    loaded = sys.modules.get(module)
    if loaded is not None and not _is_inside(getattr(loaded, "__file__", None), root):
        # Engine code may have imported the host's copy before this adapter ran; the variant
        # must run the checkout's code, so forget the host's modules and import again.
        logger.info("dropping %s imported from %s before the checkout", module, loaded.__file__)
        for name in [n for n in sys.modules if n == module or n.startswith(module + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()
    try:
        imported = importlib.import_module(module)
    except Exception as exc:
        raise MlxLmLoadError(f"cannot import {module} from checkout {root}: {exc}") from exc
    imported_file = getattr(imported, "__file__", None)
    if not _is_inside(imported_file, root):
        raise MlxLmLoadError(
            f"refusing to run: {module} was imported from {imported_file}, not from inside "
            f"the checkout {root} (install the checkout into the interpreter running the variant)"
        )
    return imported


class MlxLmAdapter:
    """One checkout + model per variant process; `run_cell` is one cold prefill and decode."""

    name = NAME

    def __init__(self, plan: Plan) -> None:
        if not plan.checkout:
            raise MlxLmLoadError("mlx-lm adapter needs the plan's checkout (a path)")
        self.plan = plan
        self.flags = parse_flags(plan.flags)
        self.checkout = Path(plan.checkout).resolve()
        self.engine_module_file: str | None = None
        self.utils: ModuleType | None = None
        self.model: Any = None
        self.prompts: PromptSource | None = None

    def prepare(self) -> None:
        """Import the checkout's mlx_lm and the parts of its API the cells use (transformers
        with it): everything but the model, touching no device (engine/runner.py's load gate)."""
        if self.utils is not None:
            return
        mlx_lm = import_from_checkout(self.checkout)
        self.engine_module_file = str(Path(mlx_lm.__file__ or "").resolve())
        self.mlx_lm_version = getattr(mlx_lm, "__version__", None)
        try:
            generate = importlib.import_module(f"{MODULE}.generate")
            cache = importlib.import_module(f"{MODULE}.models.cache")
            utils = importlib.import_module(f"{MODULE}.utils")
        except Exception as exc:
            raise MlxLmLoadError(f"checkout {self.checkout} lacks mlx_lm's API: {exc}") from exc
        for part in (generate, cache, utils):
            if not _is_inside(part.__file__, self.checkout):
                raise MlxLmLoadError(
                    f"refusing to run: {part.__name__} was imported from {part.__file__}, "
                    f"not from inside the checkout {self.checkout}"
                )
        self.generate_step = find_generate_step(generate, utils, self.mlx_lm_version)
        self.takes_max_tokens = _takes(self.generate_step, "max_tokens")
        self.make_prompt_cache = cache.make_prompt_cache
        self.utils = utils

    def load(self) -> None:
        self.prepare()
        utils = self.utils
        assert utils is not None
        if self.plan.model.startswith("preset:"):
            model_path = checkpoints.resolve_model(self.plan.model, {})
        else:
            model_path = Path(self.plan.model)
        if not (model_path / "config.json").is_file():
            raise MlxLmLoadError(f"model checkpoint not found (no config.json): {model_path}")
        # refused before loading when even the warm-up cannot fit (coldbench.engine.memory)
        memory = MemoryGuard.for_plan(self.plan, model_path)
        memory.check(min(self.plan.warmup_shapes()))
        memory.share_device()
        try:
            # The checkout's own loader and model code: a fork may change either.
            self.model, tokenizer, config = load_checkpoint(utils, model_path)
        except Exception as exc:
            raise MlxLmLoadError(
                f"cannot load model {model_path} with {utils.__file__}: {exc}"
            ) from exc
        self.prompts = PromptSource.for_plan(self.plan, tokenizer, config, checks=[memory.check])
        logger.info("mlx-lm adapter: %s from %s", MODULE, self.engine_module_file)

    def check_context(self, context_tokens: int) -> None:
        assert self.prompts is not None, "load() first"
        self.prompts.check_context(context_tokens)

    def describe(self) -> dict[str, Any]:
        return {
            "variant": self.plan.variant,
            "adapter": NAME,
            "engine_module": MODULE,
            "engine_module_file": self.engine_module_file,
            "checkout": str(self.checkout),
            "flags": {"prefill_step_size": self.flags.prefill_step_size},
            "mlx": getattr(mx, "__version__", None),
            "mlx_lm": self.mlx_lm_version,
            "python": sys.version.split()[0],
            "python_executable": sys.executable,
            **describe_backend(),
            "software": process_software(),
        }

    def run_cell(self, round: int, order: int, context_tokens: int) -> Measurement:
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.cell_prompt(self.plan.seed, round, context_tokens)
        return measure_prompt(self.measure, prompt, context_tokens)

    def canary_cell(self, context_tokens: int) -> Measurement:
        """The run's warm canary (engine/canary.py), on the checkout's own cache."""
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.warmup_prompt(self.plan.seed, context_tokens)
        cache = warm_cache(self.model, self.make_prompt_cache, prompt.ids)
        return measure_prompt(
            lambda ids, **kw: self.measure(ids, prompt_cache=cache, **kw), prompt, context_tokens
        )

    def measure(
        self,
        prompt_ids: Sequence[int],
        *,
        context_tokens: int,
        prompt_cache: list[Any] | None = None,
    ) -> Measurement:
        """Time one prefill + decode; `prompt_cache` lets a test hand in a warm cache."""
        step = self.flags.prefill_step_size
        decode_tokens = self.plan.decode_tokens
        cache = self.make_prompt_cache(self.model) if prompt_cache is None else prompt_cache
        # The checkout's own accounting of what the cache already holds; a cold cell has none.
        offsets = [c.offset for c in cache if isinstance(getattr(c, "offset", None), int)]
        cached_tokens = max(offsets) if offsets else None
        if cached_tokens is not None and cold_check_blind():  # the planted fault (canary)
            cached_tokens = 0
        model = CallWidths(self.model)
        prompt = mx.array(list(prompt_ids), dtype=mx.uint32)
        mx.eval(prompt)
        # generate_step's first token ends the prefill; with 0 decode tokens it is dropped.
        wanted = max(decode_tokens, 1)
        extra = {"max_tokens": wanted} if self.takes_max_tokens else {}
        mx.reset_peak_memory()
        mx.synchronize()
        started = time.perf_counter()
        generator = self.generate_step(
            prompt, model, prompt_cache=cache, prefill_step_size=step, **extra
        )
        steps = itertools.islice(generator, wanted)  # before 0.20.4 it never stops by itself
        first_token, _ = next(steps)  # a value: every prefill chunk has been evaluated
        first_token_at = time.perf_counter()
        output = [int(first_token)]
        output.extend(int(token) for token, _ in steps)
        mx.synchronize()
        ended = time.perf_counter()
        generator.close()
        output = output[:decode_tokens]

        n = len(prompt_ids)
        widths = model.prefill_widths(n)
        prefill_s = first_token_at - started
        decode_steps = len(output) - 1  # the first token came out of the prefill
        decode_s = ended - first_token_at if decode_steps > 0 else None
        counters: dict[str, Any] = {
            "prefill_tokens": sum(widths) if widths else None,
            "chunks": len(widths),
            "chunk_width_max": max(widths, default=0),
            "chunk_widths": runs_text(to_runs(widths)),
            "chunks_stock": _stock_chunks(n, step),
            # chunks of exactly the requested width, the final one-token step excluded
            "prefill_step_size.dispatched": sum(1 for w in widths[:-1] if w == step),
            "engine_module_file": self.engine_module_file,
        }
        result = Measurement(
            prompt_tokens=n,
            prompt_sha256=ids_sha256(prompt_ids),
            cached_tokens=cached_tokens,
            prefill_s=prefill_s,
            prefill_tps=n / prefill_s if prefill_s > 0 else None,
            decode_tokens=len(output),
            decode_s=decode_s,
            decode_tps=decode_steps / decode_s if decode_steps > 0 and decode_s else None,
            output_sha256=ids_sha256(output),
            output_head=output[:OUTPUT_HEAD],
            peak_memory_bytes=int(mx.get_peak_memory()),
            counters=counters,
        )
        execution = []
        if "prefill_step_size" in self.flags.non_default():
            stock = Flags().prefill_step_size
            expectation = Expectation(
                "prefill_step_size",
                ChunksOf(step, generate_step_widths(n, step)),
                ChunksOf(stock, generate_step_widths(n, stock)),
            )
            execution.append((expectation, Observation("prefill_step_size", to_runs(widths))))
        judge_cell(
            context_tokens=context_tokens,
            decode_tokens=decode_tokens,
            cached_tokens=cached_tokens,
            prompt_tokens=n,
            prefilled_tokens=counters["prefill_tokens"],
            decoded_tokens=len(output),
            execution=execution,
            cache="the checkout's KV cache",
        ).record(result)
        return result

    def close(self) -> None:
        self.model = None


# What the adapter must pass to generate_step; every release since 0.20 takes both (and
# `max_tokens` since 0.20.4: before, the adapter stops the generator itself).
GENERATE_STEP_ARGUMENTS = ("prompt_cache", "prefill_step_size")


class CallWidths:
    """The checkout's model as generate_step sees it, recording how many tokens each forward
    call was given: the chunk widths of the loop that really ran, whatever the checkout's
    progress callback reports (before 0.27 it reported where a chunk started, not where it
    ended) and whether it has one."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.widths: list[int] = []

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        shape = getattr(inputs, "shape", ())
        self.widths.append(int(shape[-1]) if shape else 0)
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def prefill_widths(self, prompt_tokens: int) -> list[int]:
        """The calls that took the prompt: in order, until they hold all of its tokens (the
        calls after it decode)."""
        taken: list[int] = []
        for width in self.widths:
            if sum(taken) >= prompt_tokens:
                break
            taken.append(width)
        return taken


def _takes(function: Any, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return True


def find_generate_step(generate: ModuleType, utils: ModuleType, version: str | None) -> Any:
    """The checkout's generate_step: in mlx_lm.generate since 0.23, in mlx_lm.utils before.
    MlxLmLoadError when it is missing or takes neither a prompt cache nor a prefill step."""
    found = getattr(generate, "generate_step", None) or getattr(utils, "generate_step", None)
    if found is None:
        raise MlxLmLoadError(
            f"mlx-lm {version or '(unknown version)'} has no generate_step in mlx_lm.generate "
            "or mlx_lm.utils"
        )
    missing = [name for name in GENERATE_STEP_ARGUMENTS if not _takes(found, name)]
    if missing:
        raise MlxLmLoadError(
            f"mlx-lm {version or '(unknown version)'}: generate_step takes no "
            f"{', '.join(missing)}: the adapter cannot give it a fresh cache and the step"
        )
    return found


def load_checkpoint(utils: ModuleType, model_path: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config) through the checkout's own `mlx_lm.utils.load`: with
    `return_config=True` where it takes it (0.28.3 and later), else `load(path)` and the
    checkpoint's config.json (every release since 0.20)."""
    try:
        takes_config = "return_config" in inspect.signature(utils.load).parameters
    except (TypeError, ValueError):
        takes_config = False
    if takes_config:
        model, tokenizer, config = utils.load(str(model_path), return_config=True)
        return model, tokenizer, config
    model, tokenizer = utils.load(str(model_path))
    return model, tokenizer, json.loads((model_path / "config.json").read_text())


def create(plan: Plan) -> MlxLmAdapter:
    return MlxLmAdapter(plan)


def _stock_chunks(prompt_tokens: int, step: int) -> int:
    """Chunks stock generate_step delivers: ceil((n-1)/step) of at most `step`, then 1 token."""
    return -(-(prompt_tokens - 1) // step) + 1 if prompt_tokens > 1 else 1
