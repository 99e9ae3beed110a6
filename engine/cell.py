"""The cold-prefill cell (DESIGN.md's protocol): one timed prefill of exactly N tokens on a
fresh KV cache, then `decode_tokens` greedy tokens timed separately.

The hot loop stays plain: chunks go through the model and only the KV cache state is
evaluated between chunks, so MLX never computes the lm_head of intermediate chunks (their
logits are never asked for); the last chunk asks for the logits of its last position only.
There is no host sync inside the loop beyond that `mx.eval`.

`run_cell` returns the measured part of a record (`coldbench.engine.record.Measurement`); the
variant process adds `run_id`, `variant`, `round` and `order`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache

from coldbench import kernels
from coldbench.engine.backend import not_exercised
from coldbench.engine.canary import cold_check_blind
from coldbench.engine.fastpaths import KernelSteps
from coldbench.engine.flags import Flags
from coldbench.engine.judge import (
    AtLeast,
    ChunksOf,
    Expectation,
    Observation,
    chunk_count,
    judge_cell,
    runs_text,
    split_runs,
    to_runs,
)
from coldbench.engine.prompts import ids_sha256
from coldbench.engine.record import Measurement, now_iso

log = logging.getLogger(__name__)

OUTPUT_HEAD = 16
# Architectures whose model is `model.model` (embed_tokens, layers, norm) and an lm_head (or
# tied embeddings) with nothing in between: the head can run on the last position alone, and
# pre-norm blocks (input_layernorm, self_attn, post_attention_layernorm, mlp) can be split.
_BACKBONE_TYPES = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"}


def cache_offset(prompt_cache: list[Any]) -> int | None:
    """Tokens the cache already holds, by the cache's own accounting (None: no accounting)."""
    offsets = [c.offset for c in prompt_cache if isinstance(getattr(c, "offset", None), int)]
    return max(offsets) if offsets else None


class Forward:
    """The model's forward pass as the cell drives it; subclasses are the flags' paths."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inner: Any = getattr(model, "model", None)
        model_type = getattr(getattr(model, "args", None), "model_type", None)
        self.has_backbone = model_type in _BACKBONE_TYPES and all(
            hasattr(self.inner, a) for a in ("embed_tokens", "layers", "norm")
        )
        self.dispatched = 0

    def backbone(self, tokens: mx.array, prompt_cache: list[Any]) -> mx.array:
        return self.inner(tokens, cache=prompt_cache)

    def head(self, hidden: mx.array) -> mx.array:
        if hasattr(self.model, "lm_head"):
            return self.model.lm_head(hidden)
        return self.inner.embed_tokens.as_linear(hidden)

    def chunk(self, tokens: mx.array, prompt_cache: list[Any]) -> None:
        """An intermediate chunk: fills the cache; its output is never evaluated."""
        if self.has_backbone:
            self.backbone(tokens, prompt_cache)
        else:
            self.model(tokens, cache=prompt_cache)

    def last_logits(self, tokens: mx.array, prompt_cache: list[Any]) -> mx.array:
        """Logits of the last position, shape (vocab,)."""
        if self.has_backbone:
            hidden = self.backbone(tokens, prompt_cache)
            return self.head(hidden[:, -1:, :])[0, -1]
        return self.model(tokens, cache=prompt_cache)[0, -1]


class CompiledForward(Forward):
    """`compile=true`: each layer's MLP half (post-attention norm, MLP, residual add) runs as
    an `mx.compile`d function; attention stays eager because its KV-cache writes depend on
    Python-side offsets. One compiled function per layer, kept for the model's lifetime so a
    shape is traced once per process."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.reason: str | None = None
        layers = list(getattr(self.inner, "layers", []) or [])
        if not self.has_backbone:
            self.reason = f"compile: architecture {_model_type(model)} has no split layer step"
        elif any(getattr(layer, "use_sliding", False) for layer in layers) or not all(
            all(hasattr(layer, a) for a in ("input_layernorm", "self_attn", "mlp"))
            and hasattr(layer, "post_attention_layernorm")
            for layer in layers
        ):
            self.reason = f"compile: layers of {_model_type(model)} are not plain pre-norm blocks"
        self.steps = [] if self.reason else [mx.compile(_mlp_half(layer)) for layer in layers]

    def backbone(self, tokens: mx.array, prompt_cache: list[Any]) -> mx.array:
        if self.reason:
            return super().backbone(tokens, prompt_cache)
        h = self.inner.embed_tokens(tokens)
        mask = create_attention_mask(h, prompt_cache[0])
        for layer, layer_cache, step in zip(
            self.inner.layers, prompt_cache, self.steps, strict=True
        ):
            h = h + layer.self_attn(layer.input_layernorm(h), mask, layer_cache)
            h = step(h)
            self.dispatched += 1
        return self.inner.norm(h)


def _mlp_half(layer: Any) -> Any:
    def step(h: mx.array) -> mx.array:
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return step


def _model_type(model: Any) -> str:
    return str(getattr(getattr(model, "args", None), "model_type", type(model).__name__))


class KernelForward(Forward):
    """The fast-path flags (`fused_swiglu`, `fused_add_rms_norm`): the backbone runs through
    `coldbench.engine.fastpaths.KernelSteps`, whose kernel calls count their own dispatches and
    fallbacks (`coldbench.kernels.COUNTERS`). A model the step cannot drive runs its own forward and
    `reason` says why (recorded as each requested fast path's fallback)."""

    def __init__(self, model: Any, flags: Flags) -> None:
        super().__init__(model)
        self.steps: KernelSteps | None = None
        if not self.has_backbone:
            self.reason: str | None = f"architecture {_model_type(model)} has no split layer step"
        else:
            self.steps = KernelSteps(
                self.inner,
                _model_type(model),
                fused_swiglu=flags.fused_swiglu,
                fused_norm=flags.fused_add_rms_norm,
            )
            self.reason = self.steps.reason

    def backbone(self, tokens: mx.array, prompt_cache: list[Any]) -> mx.array:
        if self.steps is None or self.reason:
            return super().backbone(tokens, prompt_cache)
        return self.steps.backbone(tokens, prompt_cache)


_FORWARDS: dict[tuple[int, tuple[str, ...]], tuple[Any, Forward]] = {}


def forward_for(model: Any, flags: Flags) -> Forward:
    """The forward of `flags` for `model`, built once per (model, flags) for its lifetime."""
    if flags.compile:
        key: tuple[str, ...] = ("compile",)
        build: Any = CompiledForward
    elif flags.fast_paths():
        key = tuple(flags.fast_paths())
        build = lambda model: KernelForward(model, flags)  # noqa: E731 - one-line factory
    else:
        return Forward(model)
    kept = _FORWARDS.get((id(model), key))
    if kept is None or kept[0] is not model:
        kept = (model, build(model))
        _FORWARDS[(id(model), key)] = kept
    forward = kept[1]
    forward.dispatched = 0
    return forward


def _top2_margin(logits: mx.array) -> mx.array:
    top2 = mx.topk(logits.astype(mx.float32), 2)
    return mx.max(top2) - mx.min(top2)


def run_cell(
    model: Any,
    prompt_ids: list[int],
    *,
    context_tokens: int,
    flags: Flags,
    decode_tokens: int,
    prompt_cache: list[Any] | None = None,
) -> Measurement:
    """Run one cell; never raises for a failure inside it (status `error` with the reason).

    `prompt_cache` exists to prove the guard: a cell handed a cache that already holds tokens
    is measured but marked invalid with the count (the run's warm canary, engine/canary.py).
    """
    counters: dict[str, Any] = {
        "prefill_tokens": None,
        "chunks": 0,
        "chunk_width_max": 0,
        "prefill_step_size.dispatched": 0,
        "clear_cache.dispatched": 0,
        "cache_clears": 0,
        "compile.dispatched": 0,
        **{f"{name}.dispatched": 0 for name in kernels.FAST_PATHS},
    }
    result = Measurement(
        prompt_tokens=len(prompt_ids),
        prompt_sha256=ids_sha256(prompt_ids),
        counters=counters,
        started_at=now_iso(),
    )
    try:
        # A requested feature this backend cannot run is recorded as such, never as run.
        skipped = not_exercised(flags.judged())
        for name, why in skipped.items():
            counters[f"{name}.not_exercised"] = why
        forward = forward_for(model, flags)
        if isinstance(forward, CompiledForward) and forward.reason:
            counters["compile.fallback"] = forward.reason
        cache = make_prompt_cache(model) if prompt_cache is None else prompt_cache
        held = cache_offset(cache)
        # The planted fault (engine/canary.py): a cold check blind to what the cache holds.
        cached = 0 if held is not None and cold_check_blind() else held
        result.cached_tokens = cached
        kernels.COUNTERS.reset()
        widths = _measure(forward, cache, prompt_ids, flags, decode_tokens, result, held)
        counters["compile.dispatched"] = forward.dispatched if flags.compile else 0
        fast_path_counters(forward, flags, counters)
        judge_cell(
            context_tokens=context_tokens,
            decode_tokens=decode_tokens,
            cached_tokens=cached,
            prompt_tokens=result.prompt_tokens,
            prefilled_tokens=counters["prefill_tokens"],
            decoded_tokens=result.decode_tokens,
            execution=execution(flags, len(prompt_ids), widths, counters),
        ).record(result)
    except Exception as error:  # noqa: BLE001 - a failed cell is a record, not a crash
        log.exception("cell failed")
        result.fail(error)
    result.ended_at = now_iso()
    return result


def _measure(
    forward: Forward,
    cache: list[Any],
    prompt_ids: list[int],
    flags: Flags,
    decode_tokens: int,
    result: Measurement,
    held: int | None,
) -> list[int]:
    """Time the prefill and decode into `result`; returns the prefill's chunk widths. `held`
    is what the cache held before the prefill, by its own accounting."""
    counters = result.counters
    tokens = mx.array(prompt_ids, dtype=mx.int32)[None]
    total = len(prompt_ids)
    step = flags.prefill_step_size
    mx.reset_peak_memory()
    mx.synchronize()
    start = time.perf_counter()
    position = 0
    widths: list[int] = []
    while position + step < total:
        forward.chunk(tokens[:, position : position + step], cache)
        mx.eval([c.state for c in cache])
        if flags.clear_cache:
            mx.clear_cache()
            counters["cache_clears"] += 1
        else:
            counters["clear_cache.dispatched"] += 1
        counters["chunks"] += 1
        widths.append(step)
        position += step

    logits = forward.last_logits(tokens[:, position:], cache)
    token = mx.argmax(logits)
    margin = _top2_margin(logits)
    mx.eval(token, margin)
    mx.synchronize()
    prefill_s = time.perf_counter() - start
    after = cache_offset(cache)
    counters["prefill_tokens"] = None if after is None or held is None else after - held
    counters["chunks"] += 1
    widths.append(total - position)
    counters["chunk_widths"] = runs_text(to_runs(widths))
    # rows the lm_head ran on in the prefill: 1 where the backbone is split from the head
    counters["lm_head_rows"] = 1 if forward.has_backbone else total - position
    counters["chunk_width_max"] = min(step, total)
    counters["prefill_step_size.dispatched"] = total // step

    outputs = [token]
    margins = [margin]
    decode_start = time.perf_counter()
    for _ in range(max(decode_tokens - 1, 0)):
        logits = forward.last_logits(token.reshape(1, 1), cache)
        token = mx.argmax(logits)
        margin = _top2_margin(logits)
        mx.async_eval(token, margin)
        outputs.append(token)
        margins.append(margin)
    mx.eval(outputs, margins)
    mx.synchronize()
    decode_s = time.perf_counter() - decode_start

    output_ids: list[int] = [int(i) for i in cast(list[int], mx.stack(outputs).tolist())][
        :decode_tokens
    ]
    result.prefill_s = prefill_s
    result.prefill_tps = total / prefill_s if prefill_s > 0 else None
    result.decode_tokens = len(output_ids)
    # The first output id comes from the prefill's logits; decode time covers the others.
    steps = len(output_ids) - 1
    result.decode_s = decode_s if steps > 0 else None
    result.decode_tps = steps / decode_s if steps > 0 and decode_s > 0 else None
    result.output_sha256 = ids_sha256(output_ids)
    result.output_head = output_ids[:OUTPUT_HEAD]
    margin_values: list[float] = [float(m) for m in cast(list[float], mx.stack(margins).tolist())]
    result.output_margins = margin_values[: len(output_ids)]
    result.peak_memory_bytes = int(mx.get_peak_memory())
    return widths


def fast_path_counters(forward: Forward, flags: Flags, counters: dict[str, Any]) -> None:
    """`<flag>.dispatched` (kernel launches in the cell's prefill and decode) and
    `<flag>.fallback` (the first reason a requested fast path ran its reference, with how many
    of its calls did) for every fast path of kernels/."""
    for name in kernels.FAST_PATHS:
        counters[f"{name}.dispatched"] = kernels.COUNTERS.dispatched[name]
        if name in flags.fast_paths():
            why = forward.reason if isinstance(forward, KernelForward) else None
            reason = f"{name}: {why}" if why else kernels.COUNTERS.fallback_reason(name)
            if reason is not None:
                counters[f"{name}.fallback"] = reason


def execution(
    flags: Flags, prompt_tokens: int, widths: list[int], counters: dict[str, Any]
) -> list[tuple[Expectation, Observation]]:
    """What each non-default flag and each fast path that is on implies for this prompt, and
    what the cell observed.

    The loop above cuts N tokens into chunks of the step with the remainder last (the last
    chunk carries the logits), so the widths a step implies are `split_runs(N, step)`.
    """
    stock = Flags().prefill_step_size
    planned = split_runs(prompt_tokens, flags.prefill_step_size)
    pairs: list[tuple[Expectation, Observation]] = []
    for name in flags.judged():
        skipped = counters.get(f"{name}.not_exercised")
        if name == "prefill_step_size":
            expectation = Expectation(
                name,
                ChunksOf(flags.prefill_step_size, planned),
                ChunksOf(stock, split_runs(prompt_tokens, stock)),
            )
            observed: Any = to_runs(widths)
        elif name == "clear_cache":
            # Stock empties the buffer cache after every chunk but the last.
            expectation = Expectation(name, 0, chunk_count(planned) - 1)
            observed = counters["cache_clears"]
        elif name == "compile":
            expectation = Expectation(name, AtLeast(1), 0)
            observed = counters["compile.dispatched"]
        else:  # a fast path (kernels/): its path must dispatch at least once
            expectation = Expectation(name, AtLeast(1), 0)
            observed = counters.get(f"{name}.dispatched", 0)
        fallback = counters.get(f"{name}.fallback")
        pairs.append((expectation, Observation(name, observed, fallback, skipped)))
    return pairs
