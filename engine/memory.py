"""What a cell at a context needs in memory, estimated before the variant process loads.

A long context does not fail gracefully: MLX aborts the process when an allocation cannot be
served, mid-run, and every later cell of that process is lost. So before the model loads, the
variant process estimates the peak of one cold prefill from the checkpoint's config.json and
file sizes (nothing is loaded) and refuses a context whose estimate exceeds the device's memory,
with the estimate in the reason: the cell is an error record, the other contexts still run.

peak = weights (the safetensors files' bytes)
     + KV cache: layers x 2 x kv_heads x head_dim x context (rounded up to mlx-lm's 256-token
       growth step) x itemsize, plus the copies made while it grows: one layer's on the CPU, a
       quarter of the cache on a GPU (below); with multi-head latent attention (DeepSeek-V2/V3,
       `kv_lora_rank`) one latent and one rotary key per position and layer instead, and a
       chunk's expansion of the latent to every head's keys and values in its activations
     + activations of one chunk: hidden states, q/k/v, the MLP's gate/up/product (the routed
       experts' for a mixture of experts) and, where this backend's attention materializes the
       scores (probed once: CPU always does), scores and softmax of heads x chunk x context;
       one layer's on the CPU, GPU_LAYERS_IN_FLIGHT layers' on a GPU.

Why a GPU needs more than one layer's activations. A GPU backend frees a buffer when the work
that used it has completed, and MLX queues many layers' work before it waits, so several layers'
intermediates are alive at once: above the weights and the KV cache itself, a GPU prefill needs
about 20 layers' activations plus a quarter of the KV cache (GPU_LAYERS_IN_FLIGHT,
GPU_KV_GROWTH; the H200's peaks behind them are in docs/PERFORMANCE.md, "Where a prefill's
memory goes", and tests/engine/test_memory.py holds them). One layer's would underestimate a GPU
prefill by a fifth or more.
Metal is treated as a GPU too (it also frees a buffer when the command buffer that used it
completes); that is an assumption there, not a measurement: benchmarks/memory_probe.py measures
it on any host.

The device's memory is Metal's recommended working set, CUDA's total memory, or the system's
memory on the CPU; `COLDBENCH_DEVICE_MEMORY_BYTES` overrides it (a host sharing its GPU, or a
test simulating a small device). Peak memory measured per cell stays in the records
(`peak_memory_bytes`), so every report shows the estimate's accuracy against context.

Before any timing the orchestrator makes the run's memory plan (`plan_memory`, through
`python -m coldbench.engine.memory` so that the orchestrator itself never touches the device): where
every context's estimate fits every variant's process beside the others (each within its share,
below), they are resident side by side and interleave cell by cell; where not, they run in
turns, one resident at a time with the whole device (worker/variants.py). A context that does
not fit even one process is refused by that process, as above.

Side by side, the orchestrator tells each process how many peers it has
(`COLDBENCH_PEER_PROCESSES`), and each process gets a share of the device (`MemoryGuard.share`):
the guard checks the estimate against it and `share_device` lowers MLX's memory limit to it,
so a process that keeps its buffer cache (`clear_cache=false`) reclaims it before the share is
spent. The runner also hands MLX's buffer cache back after every cell
(`release_cached_buffers`).
- Metal and CPU: an idle process holds its weights, so the share is the device less each peer's
  weights and a margin (PEER_OVERHEAD_BYTES).
- CUDA: the device is split evenly. A process's buffer cache may grow to its memory limit, and
  an idle CUDA process does not give back what its memory pool reserved when MLX empties its
  cache (MLX frees into CUDA's stream-ordered pool, which keeps the pages until it is trimmed),
  so a share computed as for Metal lets one process's cache grow into memory another holds. An
  even split bounds what every process can hold, whatever its pool keeps.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coldbench.engine.plan import Plan

DEVICE_MEMORY_ENV = "COLDBENCH_DEVICE_MEMORY_BYTES"
PEER_PROCESSES_ENV = "COLDBENCH_PEER_PROCESSES"
KV_STEP = 256  # mlx-lm's KVCache grows in steps of this many positions
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
GIB = 1 << 30
# What an idle peer holds beyond its weights: its CUDA or Metal context, compiled kernels and
# the small buffers MLX keeps (a margin, not a measurement; the guard's reason shows it).
PEER_OVERHEAD_BYTES = 2 * GIB
# A GPU's in-flight intermediates and KV growth copies (module docstring).
GPU_LAYERS_IN_FLIGHT = 20
GPU_KV_GROWTH = 0.25
GPU_BACKENDS = ("cuda", "metal")


class ContextTooLarge(ValueError):
    """A context whose estimated peak memory exceeds the device's memory (one line)."""


def gib(value: float) -> str:
    return f"{value / GIB:,.1f} GiB" if value >= GIB / 10 else f"{value / (1 << 20):,.1f} MiB"


@dataclass(frozen=True)
class MemoryEstimate:
    context_tokens: int
    chunk_tokens: int
    weights_bytes: int
    kv_cache_bytes: int
    activations_bytes: int
    attention_materialized: bool

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activations_bytes

    def describe(self) -> str:
        scores = ", attention scores materialized" if self.attention_materialized else ""
        return (
            f"about {gib(self.total_bytes)} (weights {gib(self.weights_bytes)}, KV cache "
            f"{gib(self.kv_cache_bytes)}, activations {gib(self.activations_bytes)} at "
            f"{self.chunk_tokens:,}-token chunks{scores})"
        )


@dataclass(frozen=True)
class DeviceMemory:
    bytes: int | None  # None: unknown, nothing is refused
    source: str


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, Mapping) else config


def itemsize(config: Mapping[str, Any]) -> int:
    """Bytes per activation and KV element: the checkpoint's dtype (float32 when unstated)."""
    return _ITEMSIZE.get(str(_text_config(config).get("torch_dtype") or "float32"), 4)


def estimate(
    config: Mapping[str, Any],
    *,
    context_tokens: int,
    chunk_tokens: int,
    weights_bytes: int,
    attention_materialized: bool,
    gpu: bool = False,
) -> MemoryEstimate:
    """The peak of one cold prefill of `context_tokens` in chunks of `chunk_tokens` (`gpu`: on a
    GPU backend, whose intermediates of several layers are alive at once)."""
    c = _text_config(config)
    size = itemsize(config)
    hidden = int(c["hidden_size"])
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    positions = -(-context_tokens // KV_STEP) * KV_STEP
    chunk = min(chunk_tokens, context_tokens)
    latent = int(c.get("kv_lora_rank") or 0)
    # Multi-head latent attention (mlx-lm's deepseek_v2/v3): the cache holds one latent and one
    # rotary key per position, and each chunk expands the latent to every head's keys and
    # values over all positions, beside the rotary part's scores (the additive mask it passes)
    mla_layer = 0
    if latent:
        rope = int(c.get("qk_rope_head_dim") or 0)
        nope, value = int(c.get("qk_nope_head_dim") or 0), int(c.get("v_head_dim") or 0)
        layer_kv = (latent + rope) * positions * size
        attention = 2 * (heads * (nope + rope) + latent + rope + heads * value)
        mla_layer = (heads * positions * (nope + value) + heads * chunk * context_tokens) * size
    else:
        layer_kv = 2 * kv_heads * head_dim * positions * size
        attention = 2 * (heads + 2 * kv_heads) * head_dim
    growth = max(layer_kv, int(GPU_KV_GROWTH * layers * layer_kv)) if gpu else layer_kv
    kv_cache = layers * layer_kv + growth
    dense = 3 * int(c.get("intermediate_size") or 4 * hidden)
    if c.get("num_experts_per_tok") and c.get("moe_intermediate_size"):
        moe = int(c["moe_intermediate_size"])
        mlp = int(c["num_experts_per_tok"]) * (3 * moe + hidden)
        mlp += 3 * moe * int(c.get("n_shared_experts") or 0)  # DeepSeek's shared experts
        if c.get("first_k_dense_replace"):  # its first layers are dense
            mlp = max(mlp, dense)
    else:
        mlp = dense
    per_token = 4 * hidden + attention + mlp
    in_flight = min(layers, GPU_LAYERS_IN_FLIGHT) if gpu else 1
    activations = (chunk * per_token * size + mla_layer) * in_flight
    activations += 2 * int(c.get("vocab_size") or 0) * 4  # the last position's logits
    if attention_materialized:
        # scores and their softmax (heads x chunk x keys), and the causal mask (bool)
        activations += 2 * heads * chunk * context_tokens * size + chunk * context_tokens
    return MemoryEstimate(
        context_tokens=context_tokens,
        chunk_tokens=chunk,
        weights_bytes=weights_bytes,
        kv_cache_bytes=kv_cache,
        activations_bytes=activations,
        attention_materialized=attention_materialized,
    )


def device_memory() -> DeviceMemory:
    """The memory one process may use on this host's MLX device."""
    configured = os.environ.get(DEVICE_MEMORY_ENV)
    if configured:
        try:
            value = int(configured)
            if value < 1:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{DEVICE_MEMORY_ENV}={configured!r} must be a positive number of bytes"
            ) from None
        return DeviceMemory(value, DEVICE_MEMORY_ENV)
    import mlx.core as mx

    from coldbench.engine.backend import detect_backend

    backend = detect_backend()
    if backend != "cpu":
        info: dict[str, Any] = getattr(mx, "device_info", dict)()
        for key in ("max_recommended_working_set_size", "total_memory", "memory_size"):
            if isinstance(info.get(key), int) and info[key] > 0:
                return DeviceMemory(int(info[key]), f"{backend} {key}")
        return DeviceMemory(None, f"{backend} reports no memory size")
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return DeviceMemory(int(pages * page_size), "cpu system memory")
    except (ValueError, OSError, AttributeError):
        return DeviceMemory(None, "cpu system memory unknown")


@functools.cache
def attention_materializes_scores(dtype: str, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether this backend's `scaled_dot_product_attention` builds the full score matrix for
    a prefill chunk (MLX's fallback) instead of a fused kernel: measured on a small shape
    (`probe_materializes_scores`), except on the CPU. MLX's CPU backend has no fused kernel
    (tests/engine/test_memory.py probes it), and the probe costs a CPU process about 0.2 s at
    each start: 75 starts in the demo."""
    from coldbench.engine.backend import detect_backend

    if detect_backend() == "cpu":
        return True
    return probe_materializes_scores(dtype, heads, kv_heads, head_dim)


def probe_materializes_scores(dtype: str, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Measured on the default device: does the peak memory of one causal prefill chunk's
    `scaled_dot_product_attention` reach the size of its score matrix?"""
    import mlx.core as mx

    queries, keys = 256, 2048
    dt = getattr(mx, dtype)
    q = mx.zeros((1, heads, queries, head_dim), dtype=dt)
    k = mx.zeros((1, kv_heads, keys, head_dim), dtype=dt)
    mx.eval(q, k)
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    out = mx.fast.scaled_dot_product_attention(q, k, k, scale=1.0, mask="causal")
    mx.eval(out)
    mx.synchronize()
    used = mx.get_peak_memory() - before
    del q, k, out
    mx.clear_cache()
    scores = heads * queries * keys * _ITEMSIZE[dtype]
    return used >= scores


def peer_processes() -> int:
    """Other variant processes of this run resident on the same device (the orchestrator's
    count; 0 when unset, as for a process run by hand)."""
    configured = os.environ.get(PEER_PROCESSES_ENV, "0")
    try:
        value = int(configured)
        if value < 0:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{PEER_PROCESSES_ENV}={configured!r} must be a whole number of processes"
        ) from None
    return value


def release_cached_buffers() -> None:
    """Hand MLX's buffer cache back to the device once the work queued so far is done, so an
    idle variant process holds only its weights while its peers run their cells (and every cell
    starts from the same empty cache)."""
    import mlx.core as mx

    mx.synchronize()
    mx.clear_cache()


def share_of(device: int | None, *, peers: int, backend: str, weights: int) -> int | None:
    """What one process may use of `device` bytes beside `peers` resident processes of the
    same run, each holding `weights` (module docstring); None when the size is unknown."""
    if device is None:
        return None
    if not peers:
        return device
    if backend == "cuda":
        processes = peers + 1
        return (device - processes * PEER_OVERHEAD_BYTES) // processes
    return device - peers * (weights + PEER_OVERHEAD_BYTES)


def chunk_tokens_of(flags: Mapping[str, Any]) -> int:
    """The prefill chunk a variant's flags ask for (the engine's default otherwise)."""
    from coldbench.engine.flags import Flags  # kernels/ and mlx: not for the worker's imports

    step_flag = {k: v for k, v in flags.items() if k == "prefill_step_size"}
    try:
        return Flags.parse(step_flag).prefill_step_size
    except ValueError:  # the adapter refuses the value itself, with its own message
        return Flags().prefill_step_size


def weights_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("model*.safetensors") if p.is_file())


class MemoryGuard:
    """Refuses contexts whose estimate exceeds the device's memory; `check` is a ContextCheck
    of coldbench.engine.prompts (run on every context before its cell)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        weights_bytes: int,
        chunk_tokens: int,
        device: DeviceMemory,
        attention_materialized: bool,
        peers: int = 0,
        backend: str = "cpu",
    ) -> None:
        self.config = dict(config)
        self.peers = peers
        self.backend = backend
        self.weights_bytes = weights_bytes
        self.chunk_tokens = chunk_tokens
        self.device = device
        self.attention_materialized = attention_materialized

    @classmethod
    def for_checkpoint(cls, path: Path | str, *, chunk_tokens: int) -> MemoryGuard:
        """From config.json and the weight files' sizes: nothing is loaded."""
        path = Path(path)
        if not path.is_dir():  # the same words as coldbench.engine.checkpoints' load
            raise ValueError(f"checkpoint {path} does not exist or is not a directory")
        if not (path / "config.json").is_file():
            raise ValueError(f"checkpoint {path} has no config.json")
        try:
            config = json.loads((path / "config.json").read_text())
        except OSError as error:
            raise ValueError(f"cannot read {path / 'config.json'}: {error.strerror}") from None
        except ValueError as error:
            raise ValueError(f"{path / 'config.json'} is not valid JSON: {error}") from None
        c = _text_config(config)
        try:
            heads = int(c["num_attention_heads"])
            head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
            kv_heads = int(c.get("num_key_value_heads") or heads)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path / 'config.json'} lacks the attention shape: {error}") from None
        dtype = {4: "float32", 2: "bfloat16"}[itemsize(config)]
        from coldbench.engine.backend import detect_backend

        return cls(
            config,
            weights_bytes=weights_bytes(path),
            chunk_tokens=chunk_tokens,
            device=device_memory(),
            attention_materialized=attention_materializes_scores(dtype, heads, kv_heads, head_dim),
            peers=peer_processes(),
            backend=detect_backend(),
        )

    @classmethod
    def for_plan(cls, plan: Plan, path: Path | str) -> MemoryGuard:
        return cls.for_checkpoint(path, chunk_tokens=chunk_tokens_of(plan.flags or {}))

    def estimate(self, context_tokens: int) -> MemoryEstimate:
        return estimate(
            self.config,
            context_tokens=context_tokens,
            chunk_tokens=self.chunk_tokens,
            weights_bytes=self.weights_bytes,
            attention_materialized=self.attention_materialized,
            gpu=self.backend in GPU_BACKENDS,
        )

    def share(self) -> int | None:
        """What this process may use of the device beside its peers (module docstring); None
        when the device's size is unknown."""
        return share_of(
            self.device.bytes, peers=self.peers, backend=self.backend, weights=self.weights_bytes
        )

    def share_reason(self) -> str:
        """How the share was set, for the guard's refusal."""
        if self.backend == "cuda":
            return (
                f"split evenly between the {self.peers + 1} variant processes of this run, less "
                f"{gib(PEER_OVERHEAD_BYTES)} each for its context (an idle CUDA process keeps what "
                "its memory pool reserved)"
            )
        others = f"{self.peers} other variant process{'es' if self.peers > 1 else ''} of this run"
        return f"the weights and context of {others} hold the rest"

    def share_device(self) -> int | None:
        """With peers, lower MLX's memory limit to this process's share (never raise it), so its
        buffer cache is reclaimed before the share is spent; returns the limit in force, or None
        when there are no peers or the device's size is unknown."""
        share = self.share()
        if not self.peers or share is None:
            return None
        import mlx.core as mx

        limit = min(int(mx.get_memory_limit()), max(share, self.weights_bytes))
        mx.set_memory_limit(limit)
        return limit

    def check(self, context_tokens: int) -> None:
        share = self.share()
        if share is None or self.device.bytes is None:
            return
        needed = self.estimate(context_tokens)
        if needed.total_bytes > share:
            shared = (
                f" and this process may use {gib(share)} of it: {self.share_reason()}"
                if self.peers
                else ""
            )
            raise ContextTooLarge(
                f"context {context_tokens} tokens does not fit: it needs {needed.describe()}, "
                f"the device has {gib(self.device.bytes)} ({self.device.source}){shared}"
            )


# ---------------------------------------------------------------------------------------------
# the run's memory plan: side by side, or one variant resident at a time

SIDE_BY_SIDE = "side-by-side"
IN_TURNS = "in-turns"
RESIDENCIES = (SIDE_BY_SIDE, IN_TURNS)


@dataclass(frozen=True)
class VariantNeed:
    """One variant's estimated peak at each context of a run, alone on the device."""

    variant: str
    weights_bytes: int
    estimates: dict[int, MemoryEstimate]


@dataclass(frozen=True)
class MemoryPlan:
    """How a run's variant processes share the device, decided before any timing.

    `side-by-side`: every variant's process is resident for the whole block and cells
    interleave (the guard splits the device between them). `in-turns`: one variant's process
    at a time, each variant's cells of a block in a turn of its own (worker/variants.py).
    `refused`: per variant, the contexts that do not fit even alone: its process refuses them
    with the estimate, as the guard always has."""

    residency: str
    reason: str
    refused: dict[str, list[int]]

    def as_json(self) -> dict[str, Any]:
        return {"residency": self.residency, "reason": self.reason, "refused": self.refused}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> MemoryPlan:
        residency = str(value["residency"])
        if residency not in RESIDENCIES:
            raise ValueError(f"unknown residency {residency!r}")
        refused = {str(k): [int(c) for c in v] for k, v in dict(value["refused"]).items()}
        return cls(residency, str(value["reason"]), refused)


def plan_memory(
    needs: list[VariantNeed], *, device: DeviceMemory, backend: str, asked: str = "auto"
) -> MemoryPlan:
    """Side by side where every context fits every variant's process beside the others
    (each process's share as the guard computes it), else in turns; `asked` (auto,
    side-by-side, in-turns) overrides the choice, never the refusals."""
    if asked not in ("auto", *RESIDENCIES):
        raise ValueError(f"residency {asked!r}: give auto, {SIDE_BY_SIDE} or {IN_TURNS}")
    peers = len(needs) - 1
    refused: dict[str, list[int]] = {}
    notes: list[str] = []
    worst: tuple[float, VariantNeed, MemoryEstimate, int] | None = None  # need / share
    for need in needs:
        for context, estimate in sorted(need.estimates.items()):
            if device.bytes is None:
                continue
            if estimate.total_bytes > device.bytes:
                refused.setdefault(need.variant, []).append(context)
                continue
            share = share_of(device.bytes, peers=peers, backend=backend, weights=need.weights_bytes)
            assert share is not None
            ratio = estimate.total_bytes / share if share > 0 else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, need, estimate, share)
    for variant, contexts in sorted(refused.items()):
        estimate = next(n for n in needs if n.variant == variant).estimates[max(contexts)]
        notes.append(
            f"variant {variant}: {_tokens(contexts)} do not fit even alone ({estimate.describe()} "
            f"at {max(contexts):,} tokens; the device has {gib(device.bytes or 0)}): refused"
        )
    if device.bytes is None:
        fits, why = True, f"the device's memory is unknown ({device.source})"
    elif peers < 1:
        fits, why = True, "one variant process"
    elif worst is None:
        fits, why = True, "no context fits even one process"
    else:
        ratio, need, estimate, share = worst
        fits = ratio <= 1
        each = f"{len(needs)} variant processes"
        at = (
            f"{estimate.context_tokens:,} tokens (variant {need.variant}) needs "
            f"{gib(estimate.total_bytes)}"
        )
        if fits:
            why = (
                f"every context fits {each} side by side: the largest need, {at}, within the "
                f"{gib(share)} each may use"
            )
        else:
            why = (
                f"{at} but each of {each} side by side may use "
                f"{gib(share) if share > 0 else 'nothing'} of {gib(device.bytes)} "
                f"({device.source}); alone it may use all of it"
            )
    chosen = (SIDE_BY_SIDE if fits else IN_TURNS) if asked == "auto" else asked
    if asked != "auto":
        why = f"{chosen} as asked ({why})"
    elif chosen == IN_TURNS:
        why = f"in turns, one variant resident at a time: {why}"
    else:
        why = f"side by side: {why}"
    return MemoryPlan(chosen, "; ".join([why, *notes]), refused)


def _tokens(contexts: list[int]) -> str:
    listed = ", ".join(f"{c:,}" for c in contexts)
    return f"context{'s' if len(contexts) > 1 else ''} {listed} tokens"


def variant_needs(
    model: Path | str, flags: Mapping[str, Mapping[str, Any]], contexts: list[int]
) -> tuple[list[VariantNeed], DeviceMemory, str]:
    """Each variant's estimates from config.json and the weight files (nothing is loaded; the
    attention probe of a GPU runs in this process: call it in a process of its own)."""
    needs = []
    device, backend = DeviceMemory(None, "unknown"), "cpu"
    for variant, variant_flags in flags.items():
        guard = MemoryGuard.for_checkpoint(model, chunk_tokens=chunk_tokens_of(variant_flags))
        device, backend = guard.device, guard.backend
        estimates = {context: guard.estimate(context) for context in contexts}
        needs.append(VariantNeed(variant, guard.weights_bytes, estimates))
    return needs, device, backend


def main() -> int:
    """`python -m coldbench.engine.memory`: reads {"model", "variants": {name: flags}, "contexts",
    "residency"} on stdin, prints the run's MemoryPlan as one JSON line. The orchestrator runs
    it in a process of its own so that it never touches the device itself (a CUDA context held
    by the orchestrator would sit beside every variant process of the run)."""
    import sys

    try:
        asked = json.loads(sys.stdin.read())
        needs, device, backend = variant_needs(
            asked["model"], asked["variants"], [int(c) for c in asked["contexts"]]
        )
        plan = plan_memory(needs, device=device, backend=backend, asked=asked["residency"])
    except (KeyError, TypeError, ValueError) as error:
        print(json.dumps({"error": str(error)}))
        return 2
    print(json.dumps(plan.as_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
