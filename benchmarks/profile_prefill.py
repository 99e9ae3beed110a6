"""Where one decoder layer's prefill time goes, component by component (not a test).

For each preset and context it builds ONE decoder layer of the preset's architecture with random
weights in memory (mlx-lm's own block class: llama's `TransformerBlock`, qwen3_moe's
`Qwen3MoeDecoderLayer`; never the whole model) and times, on whatever backend MLX has here:

- each component of the layer on evaluated inputs of one chunk (`--chunk`, the engine's 2,048
  by default): input and post-attention RMSNorm, the q/k/v projections, RoPE, qwen3's q/k norms,
  attention (`mx.fast.scaled_dot_product_attention`, causal) against the keys of every earlier
  chunk, the output projection, the residual adds, and the MLP: gate/up projections, SwiGLU
  (mlx-lm's compiled `swiglu`), down projection; or for a MoE layer the router (gate matmul,
  softmax, top-k, renormalization), the gather that sorts tokens by expert, the experts
  (`SwitchGLU`: gathered matmuls and SwiGLU, the gather included) with their SwiGLU shown on its
  own, and the weighted combine;
- the whole layer (the block's `__call__` with a KV cache), chunk after chunk, as the engine
  prefills N tokens.

Per-chunk components are scaled by the number of chunks; attention is timed at every chunk's
key length and summed. Each figure is the median of `--repeats` timed calls after one warm-up,
each call `mx.eval` + `mx.synchronize`. The share is of the whole layer as measured; parts run
separately do not sum to it exactly (separate calls cannot overlap, and kernel launches count
once per call).

Then the fast paths of kernels/ against their references at the layer's shapes, side by side
in one process (median of alternating calls): `fused_swiglu` on the MLP's (chunk, intermediate)
(and the experts' shape for a MoE layer), `fused_add_rms_norm` on (chunk, hidden). Where a gate
refuses (a CPU host), the reason is printed instead of a ratio.

    PYTHONPATH=. python benchmarks/profile_prefill.py                      # both 8B and 30B-A3B
    PYTHONPATH=. python benchmarks/profile_prefill.py --preset llama-8b-shape \
        --contexts 4096,16384,32768 --json profile.json
    PYTHONPATH=. python benchmarks/profile_prefill.py --preset tiny --contexts 128 --chunk 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx

# (preset, contexts) run when no --preset is given: the shapes of the fast paths' keep/drop runs.
DEFAULT_PLAN = (
    ("llama-8b-shape", (4096, 16384, 32768)),
    ("qwen3-30b-a3b-shape", (4096, 16384)),
)


@dataclass
class Component:
    name: str
    kind: str  # matmul, attention, norm, rope, elementwise, moe
    ms: float  # for the whole prefill of the context through this one layer
    calls: int  # how many chunk-sized calls that is
    share: float | None = None  # of the measured layer
    part_of: str | None = None  # a component already counted inside another


@dataclass
class FastPath:
    name: str
    shape: list[int]
    reference_ms: float
    fused_ms: float | None
    speedup: float | None  # reference / fused (> 1: the kernel is faster)
    fallback: str | None = None


@dataclass
class Profile:
    preset: str
    model_type: str
    dtype: str
    backend: str
    context_tokens: int
    chunk: int
    layer_ms: float
    components: list[Component] = field(default_factory=list)
    fast_paths: list[FastPath] = field(default_factory=list)


def time_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of `fn()` evaluated and synchronized, after one warm-up call."""
    mx.eval(fn())
    mx.synchronize()
    times = []
    for _ in range(repeats):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def side_by_side(
    first: Callable[[], Any], second: Callable[[], Any], repeats: int
) -> tuple[float, float]:
    """Medians of two functions timed alternately (drift hits both alike)."""
    for fn in (first, second):
        mx.eval(fn())
    mx.synchronize()
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(2 * repeats):
        which = index % 2 if (index // 2) % 2 == 0 else 1 - index % 2  # ABBA
        fn = (first, second)[which]
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        times[which].append((time.perf_counter() - start) * 1000)
    return statistics.median(times[0]), statistics.median(times[1])


def build_layer(preset_name: str, dtype: str, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """One decoder layer of the preset (mlx-lm's class for it), random weights in `dtype`."""
    from mlx_lm.models import llama, qwen3, qwen3_moe

    from coldbench.engine.presets import get_preset

    preset = get_preset(preset_name)
    config = dict(preset.config)
    config.setdefault("vocab_size", preset.tokenizer_vocab)
    model_type = config["model_type"]
    mx.random.seed(seed)
    layer: Any
    if model_type == "llama":
        args: Any = llama.ModelArgs.from_dict(config)
        layer = llama.TransformerBlock(args)
    elif model_type == "qwen3":
        args = qwen3.ModelArgs.from_dict(config)
        layer = qwen3.TransformerBlock(args)
    elif model_type == "qwen3_moe":
        args = qwen3_moe.ModelArgs.from_dict(config)
        layer = qwen3_moe.Qwen3MoeDecoderLayer(args, 0)
    else:
        raise SystemExit(f"preset {preset_name}: model type {model_type} is not profiled")
    layer.set_dtype(getattr(mx, dtype))
    mx.eval(layer.parameters())
    return layer, args, config


def profile(
    preset: str, context: int, *, chunk: int, dtype: str, repeats: int, seed: int
) -> Profile:
    from mlx_lm.models.activations import swiglu
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.cache import KVCache
    from mlx_lm.models.switch_layers import _gather_sort

    from coldbench.kernels import add_rms_norm, detect_backend
    from coldbench.kernels import swiglu as fused_swiglu

    layer, args, config = build_layer(preset, dtype, seed)
    model_type = config["model_type"]
    dt = getattr(mx, dtype)
    width = min(chunk, context)
    chunks = -(-context // width)
    dim = config["hidden_size"]
    attn = layer.self_attn
    heads, kv_heads = attn.n_heads, attn.n_kv_heads
    head_dim = config.get("head_dim") or dim // heads

    def normal(*shape: int) -> mx.array:
        return mx.random.normal(shape).astype(dt)

    x, r = normal(1, width, dim), normal(1, width, dim)
    y = layer.post_attention_layernorm(x)
    q = normal(1, heads, width, head_dim)
    k = normal(1, kv_heads, width, head_dim)
    attn_out = normal(1, width, heads * head_dim)
    mx.eval(x, r, y, q, k, attn_out)

    per_chunk: list[tuple[str, str, Callable[[], Any], str | None]] = [
        ("input_norm", "norm", lambda: layer.input_layernorm(x), None),
        ("qkv_proj", "matmul", lambda: (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)), None),
        ("rope", "rope", lambda: (attn.rope(q, offset=context - width), attn.rope(k)), None),
    ]
    if hasattr(attn, "q_norm"):
        qh, kh = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        per_chunk.append(("qk_norm", "norm", lambda: (attn.q_norm(qh), attn.k_norm(kh)), None))
    per_chunk += [
        ("o_proj", "matmul", lambda: attn.o_proj(attn_out), None),
        ("residual_adds", "elementwise", lambda: (x + r, r + x), None),
        ("post_norm", "norm", lambda: layer.post_attention_layernorm(x), None),
    ]
    mlp = layer.mlp
    if hasattr(mlp, "switch_mlp"):
        experts, top_k = config["num_experts"], config["num_experts_per_tok"]

        def route() -> tuple[mx.array, mx.array]:
            gates = mx.softmax(mlp.gate(y), axis=-1, precise=True)
            inds = mx.argpartition(gates, kth=-top_k, axis=-1)[..., -top_k:]
            scores = mx.take_along_axis(gates, inds, axis=-1)
            return inds, scores / mx.sum(scores, axis=-1, keepdims=True)

        inds, scores = route()
        expert_out = normal(1, width, top_k, dim)
        inter = config["moe_intermediate_size"]
        eg, eu = normal(width * top_k, 1, 1, inter), normal(width * top_k, 1, 1, inter)
        mx.eval(inds, scores, expert_out, eg, eu)
        per_chunk += [
            ("moe_router", "moe", route, None),
            ("moe_gather_sort", "moe", lambda: _gather_sort(y[:, :, None, None], inds), "experts"),
            ("experts", "moe", lambda: mlp.switch_mlp(y, inds), None),
            ("experts_swiglu", "elementwise", lambda: swiglu(eg, eu), "experts"),
            ("moe_combine", "moe", lambda: (expert_out * scores[..., None]).sum(axis=-2), None),
        ]
        swiglu_shapes: list[tuple[int, ...]] = [(width * top_k, 1, 1, inter)]
        del experts
    else:
        inter = config["intermediate_size"]
        g, u = normal(1, width, inter), normal(1, width, inter)
        act = normal(1, width, inter)
        mx.eval(g, u, act)
        per_chunk += [
            ("gate_up_proj", "matmul", lambda: (mlp.gate_proj(y), mlp.up_proj(y)), None),
            ("swiglu", "elementwise", lambda: swiglu(g, u), None),
            ("down_proj", "matmul", lambda: mlp.down_proj(act), None),
        ]
        swiglu_shapes = [(1, width, inter)]

    components = [
        Component(name, kind, time_ms(fn, repeats) * chunks, chunks, part_of=part)
        for name, kind, fn, part in per_chunk
    ]
    # attention: this chunk's queries against every key so far, at each chunk of the prefill
    attention_ms = 0.0
    for index in range(chunks):
        keys = (index + 1) * width
        kk, vv = normal(1, kv_heads, keys, head_dim), normal(1, kv_heads, keys, head_dim)
        mx.eval(kk, vv)
        attention_ms += time_ms(
            lambda kk=kk, vv=vv: mx.fast.scaled_dot_product_attention(
                q, kk, vv, scale=attn.scale, mask="causal"
            ),
            repeats,
        )
    components.insert(3, Component("attention_sdpa", "attention", attention_ms, chunks))

    # the whole layer, as the engine runs it: chunk after chunk into one KV cache
    def whole_layer() -> float:
        cache = KVCache()
        total = 0.0
        for _ in range(chunks):
            h = normal(1, width, dim)
            mx.eval(h)
            mask = create_attention_mask(h, cache)
            mx.synchronize()
            start = time.perf_counter()
            out = layer(h, mask, cache)
            mx.eval(out, cache.state)
            mx.synchronize()
            total += (time.perf_counter() - start) * 1000
        return total

    whole_layer()  # warm-up: kernels compile per shape
    layer_ms = statistics.median(whole_layer() for _ in range(max(1, min(repeats, 3))))
    for component in components:
        component.share = component.ms / layer_ms if layer_ms > 0 else None

    backend = detect_backend()
    fast_paths: list[FastPath] = []
    for shape in swiglu_shapes:
        g, u = normal(*shape), normal(*shape)
        mx.eval(g, u)
        decision = fused_swiglu.decide(g, u)
        if decision.dispatch:
            ref, fused = side_by_side(
                lambda g=g, u=u: swiglu(g, u),
                lambda g=g, u=u: fused_swiglu.fused(g, u, backend),
                repeats,
            )
            fast_paths.append(FastPath("fused_swiglu", list(shape), ref, fused, ref / fused))
        else:
            ref = time_ms(lambda g=g, u=u: swiglu(g, u), repeats)
            fast_paths.append(
                FastPath("fused_swiglu", list(shape), ref, None, None, decision.reason)
            )
    w = layer.post_attention_layernorm.weight
    eps = layer.post_attention_layernorm.eps
    decision = add_rms_norm.decide(x, r, w)
    if decision.dispatch:
        ref, fused = side_by_side(
            lambda: add_rms_norm.reference(x, r, w, eps),
            lambda: add_rms_norm.fused(x, r, w, eps, backend),
            repeats,
        )
        fast_paths.append(FastPath("fused_add_rms_norm", [1, width, dim], ref, fused, ref / fused))
    else:
        ref = time_ms(lambda: add_rms_norm.reference(x, r, w, eps), repeats)
        fast_paths.append(
            FastPath("fused_add_rms_norm", [1, width, dim], ref, None, None, decision.reason)
        )
    return Profile(
        preset, model_type, dtype, backend, context, width, layer_ms, components, fast_paths
    )


def render(result: Profile) -> str:
    lines = [
        f"{result.preset} ({result.model_type}, {result.dtype}, {result.backend}): one layer, "
        f"{result.context_tokens} tokens in chunks of {result.chunk}: {result.layer_ms:.2f} ms",
        f"  {'component':<18} {'kind':<12} {'ms':>10} {'share':>7}",
    ]
    for c in sorted(result.components, key=lambda c: -c.ms):
        share = f"{c.share:.1%}" if c.share is not None else "-"
        inside = f"  (inside {c.part_of})" if c.part_of else ""
        lines.append(f"  {c.name:<18} {c.kind:<12} {c.ms:>10.3f} {share:>7}{inside}")
    lines.append(f"  {'fast path':<20} {'shape':<22} {'reference ms':>12} {'fused ms':>9} ratio")
    for f in result.fast_paths:
        shape = "x".join(map(str, f.shape))
        if f.fused_ms is None:
            lines.append(
                f"  {f.name:<20} {shape:<22} {f.reference_ms:>12.4f}  fell back: {f.fallback}"
            )
        else:
            lines.append(
                f"  {f.name:<20} {shape:<22} {f.reference_ms:>12.4f} {f.fused_ms:>9.4f} "
                f"{f.speedup:.3f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", help="one preset (engine/presets.py); default: the plan above")
    parser.add_argument("--contexts", help="comma-separated token counts (with --preset)")
    parser.add_argument("--chunk", type=int, default=2048, help="prefill chunk width")
    parser.add_argument("--dtype", help="float16, bfloat16 or float32 (default: the preset's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the profiles here as JSON")
    args = parser.parse_args(argv)
    from coldbench.engine.presets import DTYPES, get_preset

    if args.contexts and not args.preset:
        parser.error("--contexts needs --preset")
    try:
        plan = (
            [
                (
                    args.preset,
                    tuple(int(c) for c in args.contexts.split(",")) if args.contexts else (),
                )
            ]
            if args.preset
            else list(DEFAULT_PLAN)
        )
        for name, contexts in plan:
            get_preset(name)
            if not contexts or any(c < 1 for c in contexts):
                raise ValueError(f"--contexts: give positive token counts for {name}")
    except ValueError as error:
        parser.error(str(error))
    if args.dtype and args.dtype not in DTYPES:
        parser.error(f"--dtype {args.dtype}: choose one of {', '.join(DTYPES)}")
    if args.chunk < 1 or args.repeats < 1:
        parser.error("--chunk and --repeats must be positive")
    results = []
    for name, contexts in plan:
        dtype = args.dtype or get_preset(name).default_dtype
        for context in contexts:
            result = profile(
                name, context, chunk=args.chunk, dtype=dtype, repeats=args.repeats, seed=args.seed
            )
            print(render(result), flush=True)
            results.append(result)
            mx.clear_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "mlx": mx.__version__,
                    "device": str(mx.default_device()),
                    "profiles": [asdict(r) for r in results],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
