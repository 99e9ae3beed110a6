"""The fast-path flags in the cell: counters, the execution rule's verdicts, and the layer step
(engine/fastpaths.py) against the model's own forward.

On a CPU the kernels cannot run: a requested fast path is `not exercised` (and its fallback is
counted). The layer step itself is checked on the CPU by letting the gates say `cuda` and
swapping each kernel for its reference: the step must then give the stock greedy ids exactly,
with one dispatch counted per call it routed.
"""

from __future__ import annotations

from typing import Any

import pytest

from coldbench.engine import checkpoints
from coldbench.engine.cell import run_cell
from coldbench.engine.flags import Flags
from coldbench.engine.prompts import PromptSource
from coldbench.engine.record import Measurement
from coldbench.kernels import DISABLE_ENV, add_rms_norm, swiglu

CONTEXT = 96
DECODE = 4
STEP = 32


def _cell(model: Any, prompt: list[int], **flags: Any) -> Measurement:
    return run_cell(
        model,
        prompt,
        context_tokens=len(prompt),
        flags=Flags.parse({"prefill_step_size": STEP, **flags}),
        decode_tokens=DECODE,
    )


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[int]]:
    path = checkpoints.create_checkpoint("tiny-moe", tmp_path_factory.mktemp("m") / "tiny-moe")
    model, tokenizer, config = checkpoints.load_model(path)
    source = PromptSource.from_tokenizer(tokenizer, max_tokens=config["max_position_embeddings"])
    return model, source.prompt(0, 0, CONTEXT).ids


@pytest.fixture()
def prompt(tiny_prompts: PromptSource) -> list[int]:
    return tiny_prompts.prompt(0, 0, CONTEXT).ids


@pytest.fixture()
def gpu_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gates answer as on a CUDA host, and each kernel is its reference path."""
    monkeypatch.setattr(swiglu, "detect_backend", lambda: "cuda")
    monkeypatch.setattr(add_rms_norm, "detect_backend", lambda: "cuda")
    monkeypatch.setattr(swiglu, "fused", lambda gate, up, backend: swiglu.reference(gate, up))
    monkeypatch.setattr(
        add_rms_norm, "fused", lambda x, r, w, eps, backend: add_rms_norm.reference(x, r, w, eps)
    )
    from coldbench.engine import backend

    monkeypatch.setattr(backend, "detect_backend", lambda: "cuda")


@pytest.mark.parametrize("flag", ["fused_swiglu", "fused_add_rms_norm"])
def test_fast_path_requested_on_cpu_is_not_exercised(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int], flag: str
) -> None:
    result = _cell(tiny_model[0], prompt, **{flag: True})
    why = "needs metal or cuda; this host runs MLX on cpu"
    assert result.status == "invalid"
    assert result.reason == f"not exercised: {flag} ({why})"
    counters = result.counters
    assert counters[f"{flag}.not_exercised"] == why
    assert counters[f"{flag}.dispatched"] == 0
    assert counters[f"{flag}.fallback"].startswith(why + " (")


def test_flags_off_count_no_fast_path(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int]
) -> None:
    counters = _cell(tiny_model[0], prompt).counters
    assert counters["fused_swiglu.dispatched"] == counters["fused_add_rms_norm.dispatched"] == 0
    assert not any(key.endswith(".fallback") for key in counters)


def test_compile_and_fast_paths_are_refused_together() -> None:
    with pytest.raises(ValueError, match="flag compile cannot be combined with fused_swiglu"):
        Flags.parse({"compile": "true", "fused_swiglu": "true"})
    assert Flags.parse({"fused_add_rms_norm": "on"}).fast_paths() == ["fused_add_rms_norm"]


@pytest.mark.usefixtures("gpu_gates")
@pytest.mark.parametrize(
    "flags",
    [
        {"fused_swiglu": True},
        {"fused_add_rms_norm": True},
        {"fused_swiglu": True, "fused_add_rms_norm": True},
    ],
)
def test_layer_step_gives_stock_ids_and_counts_dispatches_llama(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int], flags: dict[str, bool]
) -> None:
    model = tiny_model[0]
    stock = _cell(model, prompt)
    result = _cell(model, prompt, **flags)
    assert result.status == "ok", result.reason
    assert result.output_head == stock.output_head
    layers = len(model.model.layers)
    # forward passes: CONTEXT / STEP prefill chunks, then DECODE - 1 decode steps
    passes = CONTEXT // STEP + DECODE - 1
    counters = result.counters
    if flags.get("fused_swiglu"):
        assert counters["fused_swiglu.dispatched"] == layers * passes
    if flags.get("fused_add_rms_norm"):
        assert counters["fused_add_rms_norm.dispatched"] == 2 * layers * passes
    assert not any(key.endswith(".fallback") for key in counters)


@pytest.mark.usefixtures("gpu_gates")
def test_layer_step_gives_stock_ids_on_qwen3_moe(tiny_moe: tuple[Any, list[int]]) -> None:
    model, ids = tiny_moe
    stock = _cell(model, ids)
    result = _cell(model, ids, fused_swiglu=True, fused_add_rms_norm=True)
    assert result.status == "ok", result.reason
    assert result.output_head == stock.output_head
    passes = CONTEXT // STEP + DECODE - 1
    layers = len(model.model.layers)
    # the experts' activation runs once per MoE layer and pass (SwitchGLU's one call)
    assert result.counters["fused_swiglu.dispatched"] == layers * passes
    assert result.counters["fused_add_rms_norm.dispatched"] == 2 * layers * passes
    # the model is left as loaded: the activation is swapped only while the step runs
    from mlx_lm.models.switch_layers import SwiGLU

    assert all(isinstance(layer.mlp.switch_mlp.activation, SwiGLU) for layer in model.layers)


@pytest.mark.usefixtures("gpu_gates")
def test_disabled_fast_path_falls_back_and_is_never_the_fast_paths_time(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_ENV, "fused_swiglu")
    result = _cell(tiny_model[0], prompt, fused_swiglu=True, fused_add_rms_norm=True)
    assert result.status == "invalid"
    calls = len(tiny_model[0].model.layers) * (CONTEXT // STEP + DECODE - 1)
    assert result.reason == (
        f"fell back: fused_swiglu (disabled by {DISABLE_ENV}=fused_swiglu "
        f"({calls} of {calls} calls))"
    )
    assert result.counters["fused_add_rms_norm.dispatched"] == 2 * calls


@pytest.mark.usefixtures("gpu_gates")
def test_a_model_the_step_cannot_drive_falls_back_with_the_reason(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from coldbench.engine import cell

    model = tiny_model[0]
    forward = cell.KernelForward(model, Flags(fused_add_rms_norm=True))
    assert forward.reason is None
    import mlx.nn as nn

    layer = model.model.layers[1]
    norm = layer.post_attention_layernorm
    monkeypatch.setattr(cell, "_FORWARDS", {})
    layer.post_attention_layernorm = nn.LayerNorm(256)
    try:
        result = _cell(model, prompt, fused_add_rms_norm=True)
    finally:
        layer.post_attention_layernorm = norm
    assert result.status == "invalid"
    assert result.reason == (
        "fell back: fused_add_rms_norm (post_attention_layernorm of llama is LayerNorm, "
        "not RMSNorm)"
    )
    assert result.counters["fused_add_rms_norm.dispatched"] == 0
