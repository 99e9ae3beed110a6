"""Where a cold prefill's peak memory goes, against engine/memory.py's estimate (not a test).

engine/memory.py estimates a cell's peak before a variant process loads, so that a context
which cannot fit is refused instead of crashing the process. On the H200 the estimate was 75-80%
of the measured peak (docs/PERFORMANCE.md, "Long contexts"). This script measures the terms one
by one on whatever backend MLX has here, in one process, on the preset's architecture with
random weights (or a checkpoint):

- `weights`: active memory once the model is evaluated;
- per context and chunk width, a stock prefill (mlx-lm's KV cache, the buffer cache emptied after
  every chunk, as `generate_step` and the cell with stock flags do), chunk after chunk:
  - `peak`: MLX's peak over the whole prefill, above the weights;
  - `kv`: the KV cache's bytes at the end (what its arrays hold, the growth steps included);
  - `transient`: the largest peak of one chunk above what was active before that chunk (the
    chunk's activations, attention's working memory, the cache's growth copies);
- the estimate's terms for the same (context, chunk): KV cache (with its one layer's copy),
  activations, total.

    python -m benchmarks.memory_probe --preset tiny --contexts 256,512 --chunks 64,128
    python -m benchmarks.memory_probe --preset llama-8b-shape-long \\
        --contexts 4096,16384,65536 --chunks 2048,4096 --json memory.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from benchmarks.engine_prefill import build_in_memory, load_model, run_header
from coldbench.engine import memory

GIB = 1 << 30


def cache_bytes(cache: Sequence[Any]) -> int:
    return sum(int(a.nbytes) for c in cache for a in (c.keys, c.values) if a is not None)


def probe(model: Any, *, context: int, chunk: int, vocab: int) -> dict[str, int]:
    """One stock prefill of `context` random ids in `chunk`-wide chunks: peak, KV, transient."""
    inner = model.model
    tokens = mx.random.randint(0, vocab, (1, context), dtype=mx.int32)
    mx.eval(tokens)
    mx.clear_cache()
    mx.synchronize()
    base = int(mx.get_active_memory())
    mx.reset_peak_memory()
    whole_peak = 0
    transient = 0
    cache = make_prompt_cache(model)
    position = 0
    while position < context:
        width = min(chunk, context - position)
        before = int(mx.get_active_memory())
        mx.reset_peak_memory()
        hidden = inner(tokens[:, position : position + width], cache=cache)
        if position + width >= context:  # the last chunk: the first token, as the cell does
            last = hidden[:, -1:, :]
            logits = model.lm_head(last) if hasattr(model, "lm_head") else None
            if logits is None:
                logits = inner.embed_tokens.as_linear(last)
            mx.eval(mx.argmax(logits[0, -1]), [c.state for c in cache])
        else:
            mx.eval([c.state for c in cache])
        mx.synchronize()
        peak = int(mx.get_peak_memory())
        transient = max(transient, peak - before)
        whole_peak = max(whole_peak, peak)
        del hidden
        mx.clear_cache()  # stock: the buffer cache is emptied after every chunk
        position += width
    kv = cache_bytes(cache)
    del cache
    mx.clear_cache()
    mx.synchronize()
    return {"peak": whole_peak - base, "kv": kv, "transient": transient}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="checkpoint directory (Hugging Face layout)")
    source.add_argument("--preset", help="engine preset, built in memory with random weights")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="256")
    parser.add_argument("--chunks", default="2048")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]

    started = time.perf_counter()
    if args.preset:
        model, config = build_in_memory(args.preset, args.dtype, args.seed)
    else:
        model, _, config = load_model(args.model)
    mx.synchronize()
    weights = int(mx.get_active_memory())
    parameters = sum(int(v.nbytes) for _, v in tree_flatten(model.parameters()))
    print(
        f"model ready in {time.perf_counter() - started:.1f} s on {mx.default_device()}: "
        f"active {weights / GIB:.2f} GiB, parameters {parameters / GIB:.2f} GiB",
        flush=True,
    )
    config = {**config, "torch_dtype": args.dtype}
    c = memory._text_config(config)
    heads = int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    materialized = memory.attention_materializes_scores(args.dtype, heads, kv_heads, head_dim)
    vocab = int(c.get("vocab_size") or 256)
    from coldbench.engine.backend import detect_backend

    gpu = detect_backend() in memory.GPU_BACKENDS

    rows: list[dict[str, Any]] = []
    header = (
        f"{'context':>8} {'chunk':>6} | {'peak':>10} {'estimate':>10} {'ratio':>6} | "
        f"{'kv':>10} {'kv est.':>10} | {'transient':>10} {'act. est.':>10} | {'s':>6}"
    )
    print(header)
    for chunk in chunks:
        for context in contexts:
            clock = time.perf_counter()
            measured = probe(model, context=context, chunk=chunk, vocab=vocab)
            seconds = time.perf_counter() - clock
            estimate = memory.estimate(
                config,
                context_tokens=context,
                chunk_tokens=chunk,
                weights_bytes=parameters,
                attention_materialized=materialized,
                gpu=gpu,
            )
            above_weights = estimate.kv_cache_bytes + estimate.activations_bytes
            row = {
                "context_tokens": context,
                "chunk_tokens": chunk,
                "measured_peak_above_weights_bytes": measured["peak"],
                "measured_kv_bytes": measured["kv"],
                "measured_largest_chunk_transient_bytes": measured["transient"],
                "estimated_above_weights_bytes": above_weights,
                "estimated_kv_bytes": estimate.kv_cache_bytes,
                "estimated_activations_bytes": estimate.activations_bytes,
                "seconds": round(seconds, 3),
            }
            rows.append(row)
            g = memory.gib
            print(
                f"{context:>8,} {chunk:>6,} | {g(measured['peak']):>10} {g(above_weights):>10} "
                f"{measured['peak'] / max(above_weights, 1):>6.2f} | {g(measured['kv']):>10} "
                f"{g(estimate.kv_cache_bytes):>10} | {g(measured['transient']):>10} "
                f"{g(estimate.activations_bytes):>10} | {seconds:>6.1f}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    **run_header(),
                    "weights_active_bytes": weights,
                    "parameters_bytes": parameters,
                    "attention_materialized": materialized,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
