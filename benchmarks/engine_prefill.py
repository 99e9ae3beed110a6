"""Prefill throughput of the coldbench cell against stock mlx-lm and a bare loop (not a test).

In one process, on one model and the same prompts, it times the cold prefill (to the first
token) of:

- `stock`: mlx-lm's own `mlx_lm.generate.generate_step`, time to its first token;
- `bare`: a bare loop doing the cell's work with nothing around it (same chunking, the same
  buffer-cache policy), once per cell configuration measured (`bare` for flags off,
  `bare:step=N,clear_cache=false` for the candidates of the best flags; compile is not
  repeated there, so for a compiled candidate that ratio shows what compile adds);
- `cell`: the coldbench cell (`coldbench.engine.cell`) with flags off (stock-like: clear_cache=true,
  compile=false, 2,048-token chunks);
- `cell:<flags>`: the cell with each candidate of the best flags; the fastest median is `best`.
  `--try-fastpaths` adds each candidate with the fast paths of kernels/ on (`,fused`); a fast path
  that falls back or is not exercised makes the cell invalid (engine/judge.py), so such a
  candidate gets no figure rather than the reference path's.

Measurements interleave: every round runs every method once per context in an order rotated
by the round (and per context), on a prompt of fresh ids chosen by (seed, round, context), so
drift and cache effects hit all methods alike; MLX's buffer cache is emptied before every
timed call, so no method inherits another's buffers. Each method gets one untimed warm-up.
Medians of the rounds are printed with the ratios the issue sets targets for: cell/bare (the
harness adds nothing: within 2%) and best/stock (>= 1.3x at 4K on the H200).

    python -m benchmarks.engine_prefill --model DIR --contexts 256 --rounds 3
    python -m benchmarks.engine_prefill --preset llama-8b-shape --in-memory \
        --contexts 4096,16384,32768 --rounds 5 --json out.json
    python -m benchmarks.engine_prefill --preset llama-8b-shape-long --in-memory --stock-only \
        --contexts 4096,16384,65536,131072,262144 --rounds 3 --json long.json

Prompts are coldbench's own windows (engine/prompts.py, the preset's tokenizer or the
checkpoint's), so any context up to the model's max_position_embeddings works (the `*-long`
presets reach 262,144). Peak memory per method and context is printed beside engine/memory.py's
estimate for the stock chunk width.

`--in-memory` builds the preset's architecture from its config with random weights in the
process (nothing written to disk); the cell code that runs is the same.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import make_prompt_cache

PrefillTimer = Callable[[nn.Module, list[int]], float]
INVALID: dict[tuple[int, str], str] = {}


def run_header() -> dict[str, Any]:
    """When, how and where a benchmark ran: the head of every JSON these scripts write."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "device": str(mx.default_device()),
        "machine": platform.platform(),
        "mlx": mx.__version__,
    }


# -- model and prompts ---------------------------------------------------------------------


def build_in_memory(preset_name: str, dtype: str, seed: int) -> tuple[nn.Module, dict[str, Any]]:
    """The preset's architecture with random weights, built here instead of read from disk."""
    from mlx_lm.utils import _get_classes

    from coldbench.engine.presets import get_preset

    preset = get_preset(preset_name)
    config = dict(preset.config)
    config.setdefault("vocab_size", preset.tokenizer_vocab)
    model_class, args_class = _get_classes(config=config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model, config


def load_model(path: str) -> tuple[nn.Module, Any, dict[str, Any]]:
    from mlx_lm.utils import load

    model, tokenizer, config = load(path, return_config=True)
    return model, tokenizer, config


class Prompts:
    """The windows coldbench's cells use (coldbench.engine.prompts): the same ids for every method
    of a round, fresh per (seed, round, context), no shared prefix, any length up to the model's."""

    def __init__(self, tokenizer: Any, config: dict[str, Any], seed: int) -> None:
        from coldbench.engine.prompts import PromptSource

        self.source = PromptSource.from_tokenizer(
            tokenizer, max_tokens=config.get("max_position_embeddings")
        )
        self.seed = seed

    def ids(self, round_index: int, context: int) -> list[int]:
        if round_index < 0:  # the untimed warm-up: a window no round uses
            return self.source.warmup_prompt(self.seed, context).ids
        return self.source.prompt(self.seed, round_index, context).ids


# -- the timed methods ----------------------------------------------------------------------


def stock_prefill_s(model: nn.Module, ids: list[int], *, step: int) -> float:
    """mlx-lm's generate_step, started to its first token (as any mlx-lm user measures TTFT)."""
    prompt = mx.array(ids, dtype=mx.uint32)
    cache = make_prompt_cache(model)
    mx.eval(prompt)
    mx.synchronize(generation_stream)
    mx.synchronize()
    started = time.perf_counter()
    steps = generate_step(prompt, model, max_tokens=2, prompt_cache=cache, prefill_step_size=step)
    next(steps)
    elapsed = time.perf_counter() - started
    steps.close()
    # generate_step works on its own stream and has already queued the second token there:
    # wait for it, so it cannot leak into the next method's timing.
    mx.synchronize(generation_stream)
    mx.synchronize()
    return elapsed


def bare_prefill_s(model: nn.Module, ids: list[int], *, step: int, clear_cache: bool) -> float:
    """The cell's prefill work with nothing around it, written out by hand.

    Same chunking as `coldbench.engine.cell` (full `step`-wide chunks, the remainder last), the
    backbone alone on intermediate chunks with only the KV cache evaluated, the lm_head on the last
    position of the last chunk, the greedy token; no counters, no margin, no record.
    """
    inner = model.model
    tokens = mx.array(ids, dtype=mx.int32)[None]
    cache = make_prompt_cache(model)
    mx.eval(tokens)
    mx.synchronize()
    started = time.perf_counter()
    position, n = 0, len(ids)
    while position + step < n:
        inner(tokens[:, position : position + step], cache=cache)
        mx.eval([c.state for c in cache])
        if clear_cache:
            mx.clear_cache()
        position += step
    hidden = inner(tokens[:, position:], cache=cache)[:, -1:, :]
    if hasattr(model, "lm_head"):
        logits = model.lm_head(hidden)
    else:
        logits = inner.embed_tokens.as_linear(hidden)
    token = mx.argmax(logits[0, -1])
    mx.eval(token)
    mx.synchronize()
    return time.perf_counter() - started


def cell_prefill_s(model: nn.Module, ids: list[int], *, flags: dict[str, Any]) -> float:
    """The coldbench cell's own prefill_s for this prompt (one output token, no decode)."""
    from coldbench.engine.cell import run_cell
    from coldbench.engine.flags import Flags

    record = run_cell(
        model, ids, context_tokens=len(ids), flags=Flags.parse(flags), decode_tokens=1
    )
    if record.status != "ok":
        # A cell the engine's own rule (engine/judge.py) calls invalid gets no figure here
        # either for that candidate at that context.
        INVALID.setdefault((len(ids), str(flags)), f"{record['status']}: {record['reason']}")
        return math.nan
    return float(record.prefill_s)


# -- the interleaved schedule ---------------------------------------------------------------


def rotated(names: Sequence[str], shift: int) -> list[str]:
    shift %= len(names)
    return [*names[shift:], *names[:shift]]


def measure(
    model: nn.Module,
    methods: dict[str, PrefillTimer],
    *,
    contexts: Sequence[int],
    rounds: int,
    prompts: Prompts,
    warmup_context: int,
    log: Callable[[str], None],
) -> tuple[dict[int, dict[str, list[float]]], dict[int, dict[str, int]]]:
    """(seconds per round, largest peak memory in bytes) per context and method."""
    names = list(methods)
    for name in names:  # compile kernels and graphs once per method, untimed
        methods[name](model, prompts.ids(-1, warmup_context))
    results: dict[int, dict[str, list[float]]] = {c: {n: [] for n in names} for c in contexts}
    peaks: dict[int, dict[str, int]] = {c: {n: 0 for n in names} for c in contexts}
    for round_index in range(rounds):
        for position, context in enumerate(contexts):
            ids = prompts.ids(round_index, context)
            for name in rotated(names, round_index + position):
                # Every method starts from an empty buffer cache: otherwise what the previous
                # method left there decides how fast the first chunks allocate.
                mx.clear_cache()
                mx.synchronize()
                mx.reset_peak_memory()
                results[context][name].append(methods[name](model, ids))
                peaks[context][name] = max(peaks[context][name], int(mx.get_peak_memory()))
            log(f"round {round_index + 1}/{rounds}: {context:,} done")
    return results, peaks


def paired_ratio(results: dict[str, list[float]], numerator: str, denominator: str) -> float | None:
    """Median over rounds of the per-round tok/s ratio (same prompt): time(den) / time(num)."""
    pairs = zip(results[numerator], results[denominator], strict=True)
    ratios = [den / num for num, den in pairs if not (math.isnan(num) or math.isnan(den))]
    return statistics.median(ratios) if ratios else None


def median_tps(context: int, times: list[float]) -> float | None:
    valid = [t for t in times if not math.isnan(t)]
    return context / statistics.median(valid) if valid else None


def summarize(
    results: dict[int, dict[str, list[float]]], cell_methods: dict[str, str]
) -> dict[int, dict[str, Any]]:
    """Median tok/s per method, and per-round paired ratios (medians) for the targets."""
    summary: dict[int, dict[str, Any]] = {}
    for context, by_method in results.items():
        tps = {name: median_tps(context, times) for name, times in by_method.items()}
        candidates = [name for name in tps if name.startswith("cell:") and tps[name]]
        best = max(candidates, key=lambda name: tps[name] or 0.0) if candidates else None
        ratios: dict[str, float | None] = {}
        if "cell" in tps:
            ratios["cell/bare"] = paired_ratio(by_method, "cell", "bare")
            ratios["cell/stock"] = paired_ratio(by_method, "cell", "stock")
        if best is not None:
            ratios["best/stock"] = paired_ratio(by_method, best, "stock")
            ratios["best/bare-best"] = paired_ratio(by_method, best, cell_methods[best])
        if "bare" in tps:
            ratios["bare/stock"] = paired_ratio(by_method, "bare", "stock")
        summary[context] = {"tps": tps, "best": best, "ratios": ratios}
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="checkpoint directory (Hugging Face layout)")
    source.add_argument("--preset", help="engine preset name; needs --in-memory")
    parser.add_argument("--in-memory", action="store_true", help="random weights, no disk")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, default=2048, help="stock prefill_step_size")
    parser.add_argument(
        "--best-steps", default="2048,4096", help="prefill_step_size candidates for best flags"
    )
    parser.add_argument("--try-compile", action="store_true", help="compile=true candidates")
    parser.add_argument(
        "--try-fastpaths",
        action="store_true",
        help="candidates with the fast paths of kernels/ on (fused_swiglu, fused_add_rms_norm)",
    )
    parser.add_argument("--no-cell", action="store_true", help="stock and bare loop only")
    parser.add_argument(
        "--stock-only", action="store_true", help="stock generate_step alone (long sweeps)"
    )
    parser.add_argument(
        "--warmup-context",
        type=int,
        help="tokens of each method's untimed warm-up (default: the largest context)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the device's dense peak for the dtype (H200 bf16: 989), for throughput-to-peak",
    )
    parser.add_argument("--json", help="write raw timings and the summary here")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be >= 3 (medians of fewer establish nothing)")
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.stock_only and (args.try_compile or args.try_fastpaths):
        parser.error("--stock-only measures no cell: drop --try-compile and --try-fastpaths")

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    loaded_at = time.perf_counter()
    if args.preset:
        if not args.in_memory:
            parser.error("--preset needs --in-memory (or write it with `coldbench model create`)")
        model, config = build_in_memory(args.preset, args.dtype, args.seed)
        from coldbench.engine.checkpoints import train_tokenizer
        from coldbench.engine.presets import get_preset

        # the preset's own tokenizer, as `coldbench model create` writes it
        tokenizer = train_tokenizer(get_preset(args.preset).tokenizer_vocab)
    else:
        model, tokenizer, config = load_model(args.model)
    log(f"model ready in {time.perf_counter() - loaded_at:.1f} s on {mx.default_device()}")
    prompts = Prompts(tokenizer, config, args.seed)
    for context in contexts:  # refuse a context past the model's positions before any timing
        try:
            prompts.source.check_context(context)
        except ValueError as error:
            parser.error(str(error))

    step = args.step
    methods: dict[str, PrefillTimer] = {
        "stock": lambda m, ids: stock_prefill_s(m, ids, step=step),
    }
    cell_methods: dict[str, str] = {}
    if not args.stock_only:
        methods["bare"] = lambda m, ids: bare_prefill_s(m, ids, step=step, clear_cache=True)
    if not args.no_cell and not args.stock_only:
        off = {"prefill_step_size": step, "clear_cache": True, "compile": False}
        methods["cell"] = lambda m, ids: cell_prefill_s(m, ids, flags=off)
        for best_step in (int(s) for s in args.best_steps.split(",")):
            # clear_cache=true with wider chunks too: where one chunk holds the whole prompt
            # there is no buffer cache to keep, and clear_cache=false is inert (stock's run).
            for keep_cache in (True, False):
                bare_name = f"bare:step={best_step},clear_cache={str(not keep_cache).lower()}"
                if best_step == step and not keep_cache:
                    bare_name = "bare"
                else:
                    methods[bare_name] = lambda m, ids, s=best_step, c=not keep_cache: (
                        bare_prefill_s(m, ids, step=s, clear_cache=c)
                    )
                for compiled in (False, True) if args.try_compile and keep_cache else (False,):
                    if best_step == step and not keep_cache and not compiled:
                        continue  # that is `cell`, flags off
                    flags = {
                        "prefill_step_size": best_step,
                        "clear_cache": not keep_cache,
                        "compile": compiled,
                    }
                    name = f"cell:step={best_step},clear_cache={str(not keep_cache).lower()}"
                    name += ",compile" if compiled else ""
                    methods[name] = lambda m, ids, f=flags: cell_prefill_s(m, ids, flags=f)
                    cell_methods[name] = bare_name
                    if args.try_fastpaths and not compiled:
                        # the fast paths cannot be combined with compile (coldbench.engine.flags)
                        fused = {**flags, "fused_swiglu": True, "fused_add_rms_norm": True}
                        methods[name + ",fused"] = lambda m, ids, f=fused: cell_prefill_s(
                            m, ids, flags=f
                        )
                        cell_methods[name + ",fused"] = bare_name

    results, peaks = measure(
        model,
        methods,
        contexts=contexts,
        rounds=args.rounds,
        prompts=prompts,
        warmup_context=args.warmup_context or max(contexts),
        log=log,
    )
    summary = summarize(results, cell_methods)
    print_table(summary, contexts)
    if not args.stock_only:
        print_flops(summary, config, contexts, args.peak_tflops)
    estimates = memory_estimates(model, config, args.dtype, contexts, step)
    print_memory(peaks, estimates, contexts)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    **run_header(),
                    "model_config": config,
                    "timings_s": {str(c): r for c, r in results.items()},
                    "summary": {str(c): s for c, s in summary.items()},
                    "invalid": {f"{c} {f}": r for (c, f), r in INVALID.items()},
                    "peak_memory_bytes": {str(c): p for c, p in peaks.items()},
                    "memory_estimate_bytes": {str(c): e for c, e in estimates.items()},
                    "prompt_corpus_sha256": prompts.source.corpus_sha256,
                },
                indent=1,
            )
        )
    return 0


def memory_estimates(
    model: nn.Module, config: dict[str, Any], dtype: str, contexts: Sequence[int], step: int
) -> dict[int, int]:
    """coldbench.engine.memory's estimate of one cold prefill in `step`-token chunks, per context,
    with this model's weights as loaded: the figure a variant process refuses a context by."""
    from mlx.utils import tree_flatten

    from coldbench.engine import memory

    weights = sum(int(a.nbytes) for _, a in tree_flatten(model.parameters()))
    shaped = {**config, "torch_dtype": config.get("torch_dtype") or dtype}
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    probe = {4: "float32", 2: "bfloat16"}[memory.itemsize(shaped)]
    materialized = memory.attention_materializes_scores(probe, heads, kv_heads, head_dim)
    from coldbench.engine.backend import detect_backend

    gpu = detect_backend() in memory.GPU_BACKENDS
    return {
        c: memory.estimate(
            shaped,
            context_tokens=c,
            chunk_tokens=step,
            weights_bytes=weights,
            attention_materialized=materialized,
            gpu=gpu,
        ).total_bytes
        for c in contexts
    }


def prefill_flops(config: dict[str, Any], tokens: int) -> float:
    """Floating-point operations of one prefill of `tokens`: the backbone's matrix multiplies
    (2 per weight per token: q/k/v/o projections and the MLP, the routed experts' for a MoE
    layer), causal attention (QK^T and PV over the keys at or before each query: 2 x 2 x heads x
    head_dim x N(N+1)/2 per layer) and the lm_head on the last position. Norms, RoPE and
    elementwise work are left out, as throughput-to-peak figures usually do."""
    c = {**config, **(config.get("text_config") or {})}
    hidden = int(c["hidden_size"])
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    if c.get("num_experts_per_tok") and c.get("moe_intermediate_size"):
        mlp = int(c["num_experts_per_tok"]) * 3 * hidden * int(c["moe_intermediate_size"])
        mlp += hidden * int(c.get("num_experts") or 0)  # the router
    else:
        mlp = 3 * hidden * int(c.get("intermediate_size") or 4 * hidden)
    projections = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    matmul = 2.0 * tokens * layers * (projections + mlp)
    attention = layers * 4.0 * heads * head_dim * tokens * (tokens + 1) / 2
    return matmul + attention + 2.0 * hidden * int(c.get("vocab_size") or 0)


def print_flops(
    summary: dict[int, dict[str, Any]],
    config: dict[str, Any],
    contexts: Sequence[int],
    peak_tflops: float | None,
) -> None:
    """Effective TFLOP/s of stock and the best candidate per context (prefill_flops over the
    median time), and their fraction of `peak_tflops` when given."""
    for context in contexts:
        flops = prefill_flops(config, context)
        for name in ("stock", summary[context]["best"]):
            tps = summary[context]["tps"].get(name) if name else None
            if not tps:
                continue
            tflops = flops * tps / context / 1e12
            share = f" = {tflops / peak_tflops:.1%} of {peak_tflops:,.0f}" if peak_tflops else ""
            print(f"effective at {context:,}: {name}: {tflops:,.1f} TFLOP/s{share}")
            summary[context].setdefault("tflops", {})[name] = round(tflops, 2)


def print_memory(
    peaks: dict[int, dict[str, int]], estimates: dict[int, int], contexts: Sequence[int]
) -> None:
    gib = 1 << 30
    names = list(peaks[contexts[0]])
    width = max(len(n) for n in [*names, "estimate (stock chunks)"]) + 2
    print(f"{'peak memory GiB (max)':<{width}}" + "".join(f"{c:>12,}" for c in contexts))
    for name in names:
        print(f"{name:<{width}}" + "".join(f"{peaks[c][name] / gib:>12.2f}" for c in contexts))
    row = "".join(f"{estimates[c] / gib:>12.2f}" for c in contexts)
    print(f"{'estimate (stock chunks)':<{width}}{row}")


def print_table(summary: dict[int, dict[str, Any]], contexts: Sequence[int]) -> None:
    names = list(summary[contexts[0]]["tps"])
    width = max(len(n) for n in names) + 2
    print(f"{'prefill tok/s (median)':<{width}}" + "".join(f"{c:>12,}" for c in contexts))
    for name in names:
        values = [summary[c]["tps"][name] for c in contexts]
        cells = "".join(f"{v:>12,.0f}" if v is not None else f"{'-':>12}" for v in values)
        print(f"{name:<{width}}{cells}")
    ratio_names = sorted({r for c in contexts for r in summary[c]["ratios"]})
    for ratio in ratio_names:
        values = [summary[c]["ratios"].get(ratio) for c in contexts]
        cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
        print(f"{ratio:<{width}}{cells}")
    for context in contexts:
        if summary[context]["best"]:
            print(f"best at {context:,}: {summary[context]['best']}")
    for (context, flags), reason in sorted(INVALID.items()):
        print(f"not valid at {context:,}: {flags}: {reason}")


if __name__ == "__main__":
    raise SystemExit(main())
