from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from coldbench.engine import memory
from coldbench.engine.cell import run_cell
from coldbench.engine.flags import Flags
from coldbench.engine.memory import DEVICE_MEMORY_ENV, ContextTooLarge, MemoryGuard
from coldbench.engine.presets import get_preset
from coldbench.engine.prompts import PromptSource

REPO = Path(__file__).resolve().parents[2]


def test_kv_cache_of_the_8b_shape_at_256k() -> None:
    # Llama-3.1-8B keeps 2 x 8 kv heads x 128 x 2 bytes x 32 layers = 128 KiB per position
    config = {**get_preset("llama-8b-shape-long").config, "torch_dtype": "bfloat16"}
    estimate = memory.estimate(
        config,
        context_tokens=262_144,
        chunk_tokens=4096,
        weights_bytes=16 << 30,
        attention_materialized=False,
    )
    per_layer = 2 * 8 * 128 * 2 * 262_144
    assert estimate.kv_cache_bytes == 33 * per_layer  # 32 layers + one growing copy
    assert 32 << 30 < estimate.kv_cache_bytes < 34 << 30
    materialized = memory.estimate(
        config,
        context_tokens=262_144,
        chunk_tokens=4096,
        weights_bytes=16 << 30,
        attention_materialized=True,
    )
    # scores and softmax of 32 heads x 4,096 x 262,144 in bf16: 128 GiB more
    assert materialized.activations_bytes - estimate.activations_bytes >= 128 << 30
    assert "KV cache 33.0 GiB" in estimate.describe()


# Peak memory of one cold prefill on the H200 (2026-12-01, llama-8b-shape-long bf16, weights
# 14.96 GiB), GiB by context: stock's cells (2,048-token chunks) and the warm-ups of
# `prefill_step_size=4096, clear_cache=false` (docs/PERFORMANCE.md, "Long contexts").
H200_PEAKS_GIB = {
    2048: {4096: 20.9, 16384: 23.5, 65536: 30.9, 131072: 40.2, 262144: 60.3},
    4096: {4096: 23.0, 16384: 25.0, 65536: 32.0, 131072: 41.2, 262144: 58.0},
}


@pytest.mark.parametrize("chunk", sorted(H200_PEAKS_GIB))
def test_the_gpu_estimate_follows_the_peaks_measured_on_the_h200(chunk: int) -> None:
    config = {**get_preset("llama-8b-shape-long").config, "torch_dtype": "bfloat16"}
    for context, measured_gib in H200_PEAKS_GIB[chunk].items():
        measured = measured_gib * (1 << 30)
        kwargs: dict[str, Any] = dict(
            context_tokens=context,
            chunk_tokens=chunk,
            weights_bytes=int(14.96 * (1 << 30)),
            attention_materialized=False,
        )
        gpu = memory.estimate(config, gpu=True, **kwargs).total_bytes
        one_layer = memory.estimate(config, **kwargs).total_bytes
        # the one-layer estimate the guard used before was 70-84% of these peaks
        assert one_layer < 0.85 * measured
        assert 0.97 * measured <= gpu <= 1.16 * measured, (chunk, context, gpu / measured)


def test_cuda_splits_the_device_evenly_between_a_runs_processes() -> None:
    config = {**get_preset("llama-8b-shape-long").config, "torch_dtype": "bfloat16"}
    device = memory.DeviceMemory(143_771 << 20, "cuda total_memory")  # the H200

    def guard(backend: str, peers: int) -> MemoryGuard:
        return MemoryGuard(
            config,
            weights_bytes=int(14.96 * (1 << 30)),
            chunk_tokens=4096,
            device=device,
            attention_materialized=False,
            peers=peers,
            backend=backend,
        )

    two = guard("cuda", 1)
    assert two.share() == (device.bytes - 2 * memory.PEER_OVERHEAD_BYTES) // 2
    two.check(262_144)  # the 256K cell beside one peer: about 66 of 68 GiB
    three = guard("cuda", 2)
    with pytest.raises(ContextTooLarge) as refused:
        three.check(262_144)
    assert "split evenly between the 3 variant processes of this run" in str(refused.value)
    three.check(65_536)
    # Metal and the CPU leave each idle peer its weights and a margin, no more
    assert guard("metal", 2).share() == device.bytes - 2 * (
        int(14.96 * (1 << 30)) + memory.PEER_OVERHEAD_BYTES
    )
    guard("metal", 2).check(262_144)


def test_the_cpu_is_not_probed_because_its_attention_builds_the_scores() -> None:
    """attention_materializes_scores answers True on the CPU without measuring; the
    measurement itself must agree, or the shortcut is wrong for this MLX."""
    if mx.default_device() != mx.cpu:
        pytest.skip("the shortcut is the CPU's; a GPU is probed (test below)")
    assert memory.probe_materializes_scores("float32", 4, 2, 64) is True
    assert memory.attention_materializes_scores("float32", 4, 2, 64) is True


def test_the_estimate_bounds_the_measured_peak(
    tiny_model: tuple[Any, Any, dict[str, Any]], tiny_model_dir: Path
) -> None:
    model, tokenizer, _ = tiny_model
    prompts = PromptSource.from_tokenizer(tokenizer)
    for step, context in ((32, 1024), (256, 2048)):
        guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=step)
        assert guard.attention_materialized == (mx.default_device() == mx.cpu)
        ids = prompts.prompt(0, 0, context).ids
        gc.collect()
        mx.clear_cache()
        # the session holds other arrays too: the cell's own share is its peak over what was
        # active before it; the estimate's is all but the weights (loaded once, before)
        before = mx.get_active_memory()
        record = run_cell(
            model, ids, context_tokens=context, flags=Flags(prefill_step_size=step), decode_tokens=2
        )
        needed = guard.estimate(context)
        measured = record.peak_memory_bytes - before
        assert record.status == "ok"
        assert needed.weights_bytes >= sum(
            int(a.nbytes) for _, a in tree_flatten(model.parameters())
        )
        # an upper bound, and not a loose one (measured on this CPU: 1.01x to 1.3x)
        estimated = needed.kv_cache_bytes + needed.activations_bytes
        assert measured <= estimated <= 1.6 * measured, (step, context, measured, estimated)


def test_device_memory_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "123456")
    assert memory.device_memory() == memory.DeviceMemory(123456, DEVICE_MEMORY_ENV)
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="must be a positive number of bytes"):
        memory.device_memory()
    monkeypatch.delenv(DEVICE_MEMORY_ENV)
    found = memory.device_memory()
    assert found.bytes and found.bytes > 1 << 30  # this host's system memory on the CPU


def test_a_context_over_the_estimate_is_refused_with_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32)
    limit = guard.estimate(1024).total_bytes
    monkeypatch.setenv(DEVICE_MEMORY_ENV, str(limit))
    small = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32)
    small.check(1024)
    with pytest.raises(ContextTooLarge) as refused:
        small.check(4096)
    reason = str(refused.value)
    assert reason.startswith("context 4096 tokens does not fit: it needs about ")
    assert "KV cache" in reason and f"({DEVICE_MEMORY_ENV})" in reason
    assert "\n" not in reason


def test_peer_processes_keep_their_weights_out_of_a_cell(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32)
    limit = guard.estimate(1024).total_bytes + memory.PEER_OVERHEAD_BYTES
    monkeypatch.setenv(DEVICE_MEMORY_ENV, str(limit))
    monkeypatch.setenv(memory.PEER_PROCESSES_ENV, "0")
    MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32).check(1024)
    # one other variant process of the run holds its own copy of the weights on the device
    monkeypatch.setenv(memory.PEER_PROCESSES_ENV, "1")
    shared = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32)
    with pytest.raises(ContextTooLarge) as refused:
        shared.check(1024)
    assert "weights and context of 1 other variant process of this run" in str(refused.value)
    monkeypatch.setenv(memory.PEER_PROCESSES_ENV, "some")
    with pytest.raises(ValueError, match="must be a whole number of processes"):
        memory.peer_processes()


def test_with_peers_mlx_reclaims_its_cache_within_the_share(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = mx.get_memory_limit()
    try:
        device = 3 * memory.PEER_OVERHEAD_BYTES
        monkeypatch.setenv(DEVICE_MEMORY_ENV, str(device))
        monkeypatch.setenv(memory.PEER_PROCESSES_ENV, "0")
        assert MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32).share_device() is None
        assert mx.get_memory_limit() == before
        monkeypatch.setenv(memory.PEER_PROCESSES_ENV, "1")
        guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32)
        share = device - memory.PEER_OVERHEAD_BYTES - guard.weights_bytes
        assert guard.share_device() == min(before, share)
        assert mx.get_memory_limit() == min(before, share)
    finally:
        mx.set_memory_limit(before)


def test_a_cell_leaves_no_cached_buffers_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    from coldbench.engine.adapters import create_adapter
    from coldbench.engine.plan import CellRequest, Plan
    from coldbench.engine.runner import VariantProcess

    plan = Plan.load(_plan(tmp_path, tiny_model_dir))
    adapter = create_adapter(plan)
    adapter.load()
    process = VariantProcess(plan, adapter, open(tmp_path / "out.jsonl", "w"))  # noqa: SIM115
    try:
        record = process.run(CellRequest(0, 0, 256))
        assert record["status"] == "ok"
        # an idle process holds its weights only, so its peers' cells have the device
        assert mx.get_cache_memory() == 0
    finally:
        process.close()
        adapter.close()


def _plan(tmp_path: Path, model: Path) -> Path:
    plan = {
        "run_id": "r-1",
        "variant": "base",
        "adapter": "embedded",
        "model": str(model),
        "flags": {"prefill_step_size": 32},
        "decode_tokens": 2,
        "records_path": str(tmp_path / "records.jsonl"),
        "warmup_tokens": 64,
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_the_variant_process_refuses_the_cell_and_keeps_serving(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # a device that holds the model and 1,024 tokens but not 4,096 (set, not mocked)
    limit = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=32).estimate(1024)
    cells = [
        {"round": 0, "order": 0, "context_tokens": 4096},
        {"round": 0, "order": 1, "context_tokens": 256},
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "coldbench.engine.runner",
            "--plan",
            str(_plan(tmp_path, tiny_model_dir)),
        ],
        input="".join(json.dumps(c) + "\n" for c in cells),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**_env(), DEVICE_MEMORY_ENV: str(limit.total_bytes)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["event"] for e in events] == ["ready", "record", "record"]
    refused, served = events[1]["record"], events[2]["record"]
    assert refused["status"] == "error" and refused["prefill_s"] is None
    assert refused["reason"].startswith("context 4096 tokens does not fit: it needs about ")
    assert served["status"] == "ok" and served["peak_memory_bytes"] > 0

    # a device smaller than the weights: refused before the model loads, one line, exit 2
    too_small = subprocess.run(
        [
            sys.executable,
            "-m",
            "coldbench.engine.runner",
            "--plan",
            str(_plan(tmp_path, tiny_model_dir)),
        ],
        input="",
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**_env(), DEVICE_MEMORY_ENV: str(1 << 20)},
        timeout=300,
    )
    assert too_small.returncode == 2
    (event,) = [json.loads(line) for line in too_small.stdout.splitlines()]
    assert event["event"] == "error"
    assert event["reason"].startswith("context 64 tokens does not fit")
    assert "weights 15.3 MiB" in event["reason"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != DEVICE_MEMORY_ENV}


def test_the_memory_probe_measures_each_term_of_the_estimate(tmp_path: Path) -> None:
    """benchmarks/memory_probe.py on the tiny preset: the KV cache it measures is the estimate's
    (without the growth copy), and on this CPU the estimate bounds the measured peak."""
    from benchmarks import memory_probe

    out = tmp_path / "probe.json"
    argv = ["--preset", "tiny", "--dtype", "float32", "--contexts", "128,256"]
    assert memory_probe.main([*argv, "--chunks", "64", "--json", str(out)]) == 0
    probe = json.loads(out.read_text())
    assert probe["device"] and probe["argv"] and probe["attention_materialized"] is not None
    config = get_preset("tiny").config
    layers = int(config["num_hidden_layers"])
    for row in probe["rows"]:
        one_layer_copy = row["estimated_kv_bytes"] // (layers + 1)
        assert row["measured_kv_bytes"] == row["estimated_kv_bytes"] - one_layer_copy
        assert 0 < row["measured_peak_above_weights_bytes"] <= row["estimated_above_weights_bytes"]


def _need(variant: str, weights: int, totals: dict[int, int]) -> memory.VariantNeed:
    def estimate(context: int, total: int) -> memory.MemoryEstimate:
        return memory.MemoryEstimate(context, 2048, weights, total - weights, 0, False)

    return memory.VariantNeed(variant, weights, {c: estimate(c, t) for c, t in totals.items()})


def test_the_plan_puts_variants_side_by_side_only_where_every_context_fits_them_all() -> None:
    gib = 1 << 30
    device = memory.DeviceMemory(80 * gib, "cuda total_memory")
    small = [_need(v, 16 * gib, {4096: 20 * gib, 16384: 30 * gib}) for v in "ab"]
    plan = memory.plan_memory(small, device=device, backend="cuda")
    # an even CUDA split: (80 - 2 x 2) / 2 = 38 GiB each, and 30 fit
    assert plan.residency == memory.SIDE_BY_SIDE and plan.refused == {}
    assert "16,384 tokens (variant a) needs 30.0 GiB" in plan.reason and "38.0 GiB" in plan.reason
    large = [_need(v, 44 * gib, {4096: 50 * gib, 16384: 60 * gib, 262144: 90 * gib}) for v in "ab"]
    plan = memory.plan_memory(large, device=device, backend="cuda")
    assert plan.residency == memory.IN_TURNS
    assert plan.reason.startswith("in turns, one variant resident at a time: 16,384 tokens")
    # a context that does not fit even alone is refused for every variant, as the guard does
    assert plan.refused == {"a": [262144], "b": [262144]}
    assert "do not fit even alone" in plan.reason
    forced = memory.plan_memory(small, device=device, backend="cuda", asked="in-turns")
    assert forced.residency == memory.IN_TURNS and forced.reason.startswith("in-turns as asked")
    # Metal and the CPU: each peer holds its weights and a margin beside this process's need
    cpu = memory.plan_memory(
        [_need(v, 1 * gib, {256: 3 * gib}) for v in "ab"],
        device=memory.DeviceMemory(5 * gib, "cpu"),
        backend="cpu",
    )
    assert cpu.residency == memory.IN_TURNS  # 5 - (1 + 2) = 2 GiB beside a peer, 3 needed
    assert memory.plan_memory(small[:1], device=device, backend="cuda").residency == (
        memory.SIDE_BY_SIDE
    )
    with pytest.raises(ValueError, match="residency 'both'"):
        memory.plan_memory(small, device=device, backend="cuda", asked="both")
    assert memory.MemoryPlan.from_json(plan.as_json()) == plan


def test_the_plan_is_made_in_a_process_of_its_own_from_the_checkpoint(
    tiny_model_dir: Path,
) -> None:
    request = {
        "model": str(tiny_model_dir),
        "variants": {"a": {}, "b": {"prefill_step_size": 64}},
        "contexts": [128, 256],
        "residency": "auto",
    }
    guard = MemoryGuard.for_checkpoint(tiny_model_dir, chunk_tokens=2048)
    need = guard.estimate(256).total_bytes

    def plan_with(device_bytes: int) -> dict:
        """The plan `python -m coldbench.engine.memory` answers on a device of this size."""
        done = subprocess.run(
            [sys.executable, "-m", "coldbench.engine.memory"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env={**os.environ, DEVICE_MEMORY_ENV: str(device_bytes)},
            timeout=120,
            check=True,
        )
        return json.loads(done.stdout)

    plan = memory.MemoryPlan.from_json(plan_with(need + (1 << 30)))
    assert plan.residency == memory.IN_TURNS and plan.refused == {}
    assert plan_with(4 * need + (8 << 30))["residency"] == memory.SIDE_BY_SIDE


# Measured on this CPU (2026-12-06), the estimate over the cell's peak above what was active
# before it at (chunk, context) (32, 512), (128, 1024), (256, 2048), (512, 2048): tiny-moe
# 1.07, 1.40, 1.44, 1.53x; tiny-deepseek-v3 1.19, 1.29, 1.35, 1.36x.
@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-deepseek-v3"])
def test_the_estimate_bounds_the_measured_peak_of_a_mixture_of_experts(
    preset: str, tmp_path: Path
) -> None:
    from coldbench.engine import checkpoints

    path = checkpoints.create_checkpoint(preset, tmp_path / preset)
    model, tokenizer, config = checkpoints.load_model(path)
    assert config["model_type"] in ("qwen3_moe", "deepseek_v3")
    prompts = PromptSource.from_tokenizer(tokenizer)
    for step, context in ((32, 512), (128, 1024)):
        guard = MemoryGuard.for_checkpoint(path, chunk_tokens=step)
        ids = prompts.prompt(0, 0, context).ids
        gc.collect()
        mx.clear_cache()
        before = mx.get_active_memory()
        record = run_cell(
            model, ids, context_tokens=context, flags=Flags(prefill_step_size=step), decode_tokens=1
        )
        assert record.status == "ok", record.reason
        needed = guard.estimate(context)
        measured = record.peak_memory_bytes - before
        estimated = needed.kv_cache_bytes + needed.activations_bytes
        assert measured <= estimated <= 1.6 * measured, (preset, step, context, measured)


def test_the_latent_cache_of_deepseek_v3_is_one_latent_and_rotary_key_per_position() -> None:
    config = {**get_preset("tiny-deepseek-v3").config, "torch_dtype": "float32"}
    estimate = memory.estimate(
        config, context_tokens=1024, chunk_tokens=256, weights_bytes=0, attention_materialized=False
    )
    # (kv_lora_rank 64 + qk_rope_head_dim 16) x 1,024 positions x 4 bytes, 2 layers + 1 growing
    assert estimate.kv_cache_bytes == 3 * 80 * 1024 * 4
