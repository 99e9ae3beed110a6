from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coldbench.engine import checkpoints
from coldbench.engine.cell import run_cell
from coldbench.engine.flags import Flags
from coldbench.engine.prompts import PromptSource, ids_sha256
from coldbench.engine.record import CellRecord, Measurement
from coldbench.evidence.contract.schemas import Record

CONTEXT = 256
DECODE = 6
LAYERS = 4


@pytest.fixture(scope="module")
def prompt(tiny_prompts: PromptSource) -> list[int]:
    return tiny_prompts.prompt(0, 0, CONTEXT).ids


@pytest.fixture(scope="module")
def reference(tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int]) -> Measurement:
    return run_cell(
        tiny_model[0], prompt, context_tokens=CONTEXT, flags=Flags(), decode_tokens=DECODE
    )


def _cell(model: Any, prompt: list[int], **flags: Any) -> Measurement:
    return run_cell(
        model, prompt, context_tokens=CONTEXT, flags=Flags.parse(flags), decode_tokens=DECODE
    )


def _record(measured: Measurement) -> dict[str, Any]:
    identity = {"run_id": "r", "variant": "base", "round": 0, "order": 0}
    return CellRecord.of(measured, **identity, context_tokens=CONTEXT).as_json()


def test_reference_cell_is_a_valid_cold_record(reference: Measurement, prompt: list[int]):
    assert reference.status == "ok", reference.reason
    assert reference.cached_tokens == 0
    assert reference.prompt_tokens == CONTEXT
    assert reference.prompt_sha256 == ids_sha256(prompt)
    assert reference.decode_tokens == DECODE == len(reference.output_head)
    assert reference.output_sha256 == ids_sha256(reference.output_head)
    assert len(reference.output_margins) == DECODE
    assert all(m >= 0 for m in reference.output_margins)
    assert reference.prefill_s > 0 and reference.decode_s > 0
    assert reference.prefill_tps == pytest.approx(CONTEXT / reference.prefill_s)
    assert reference.peak_memory_bytes > 0
    counters = reference.counters
    assert counters["chunks"] == 1 and counters["chunk_width_max"] == CONTEXT
    assert counters["prefill_tokens"] == CONTEXT
    assert counters["lm_head_rows"] == 1  # llama: the head ran on the last position only
    assert counters["prefill_step_size.dispatched"] == 0  # default 2048: no chunk that wide
    # the record the runner writes from it satisfies the evidence contract
    Record.model_validate(_record(reference))


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"prefill_step_size": 64},
            {"chunks": 4, "chunk_width_max": 64, "prefill_step_size.dispatched": 4},
        ),
        (
            {"prefill_step_size": 100},
            {"chunks": 3, "chunk_width_max": 100, "prefill_step_size.dispatched": 2},
        ),
        (
            {"prefill_step_size": 64, "clear_cache": False},
            {"clear_cache.dispatched": 3, "cache_clears": 0},
        ),
        ({"prefill_step_size": 64}, {"clear_cache.dispatched": 0, "cache_clears": 3}),
        # every layer's compiled MLP half, for the one prefill chunk and each decode step
        ({"compile": True}, {"compile.dispatched": LAYERS * DECODE, "chunks": 1}),
        (
            {"compile": True, "prefill_step_size": 64, "clear_cache": False},
            {"compile.dispatched": LAYERS * (4 + DECODE - 1), "clear_cache.dispatched": 3},
        ),
    ],
)
def test_flag_changes_counters_and_keeps_greedy_output(
    tiny_model: tuple[Any, Any, dict[str, Any]],
    prompt: list[int],
    reference: Measurement,
    flags: dict[str, Any],
    expected: dict[str, int],
) -> None:
    result = _cell(tiny_model[0], prompt, **flags)
    assert result.status == "ok", result.reason
    for name, value in expected.items():
        assert result.counters[name] == value, name
    assert reference.counters["compile.dispatched"] == 0
    assert result.output_head == reference.output_head
    assert result.output_sha256 == reference.output_sha256


@pytest.mark.parametrize(
    ("flags", "inert"),
    [
        # one chunk: nothing to keep between chunks, exactly as stock
        ({"clear_cache": False}, "clear_cache"),
        # wider than the prompt, which stock 2048 also takes in one chunk
        ({"prefill_step_size": 4096}, "prefill_step_size"),
        ({"prefill_step_size": 4096, "clear_cache": False}, "prefill_step_size,clear_cache"),
    ],
)
def test_a_request_that_implies_stock_here_is_ok_and_inert(
    tiny_model: tuple[Any, Any, dict[str, Any]],
    prompt: list[int],
    reference: Measurement,
    flags: dict[str, Any],
    inert: str,
) -> None:
    result = _cell(tiny_model[0], prompt, **flags)
    assert result.status == "ok", result.reason
    assert result.counters["inert"] == inert
    assert result.counters["chunk_widths"] == str(CONTEXT)
    assert result.output_sha256 == reference.output_sha256
    assert "inert" not in reference.counters


def test_a_step_wider_than_the_prompt_is_honest_where_stock_chunks(
    micro_model: tuple[Any, Any, dict[str, Any]], micro_prompts: PromptSource
) -> None:
    # At 2100 tokens stock 2048 cuts 2048 + 52; 4096 takes one chunk (the H200's 8192 at 4K).
    # micro: the chunk widths are the subject; tiny's 2100-token prefill is a minute of CPU.
    ids = micro_prompts.prompt(0, 0, 2100).ids
    result = run_cell(
        micro_model[0],
        ids,
        context_tokens=2100,
        flags=Flags(prefill_step_size=4096),
        decode_tokens=1,
    )
    assert result.status == "ok", result.reason
    assert result.counters["chunk_widths"] == "2100"
    assert "inert" not in result.counters


@pytest.mark.parametrize("step", [1, 64])
def test_a_planted_no_op_step_is_invalid(
    tiny_model: tuple[Any, Any, dict[str, Any]],
    prompt: list[int],
    monkeypatch: pytest.MonkeyPatch,
    step: int,
) -> None:
    from coldbench.engine import cell

    measure = cell._measure

    def ignoring_the_step(forward: Any, cache: Any, ids: Any, flags: Flags, *rest: Any) -> Any:
        return measure(
            forward, cache, ids, dataclasses.replace(flags, prefill_step_size=2048), *rest
        )

    monkeypatch.setattr(cell, "_measure", ignoring_the_step)
    result = _cell(tiny_model[0], prompt, prefill_step_size=step)
    assert result.status == "invalid"
    assert result.reason == "silent no-op: prefill_step_size"
    assert result.counters["chunk_widths"] == str(CONTEXT)


def test_clear_cache_kept_where_stock_would_clear_is_judged_by_the_clears(
    tiny_model: tuple[Any, Any, dict[str, Any]],
    prompt: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coldbench.engine import cell

    honest = _cell(tiny_model[0], prompt, prefill_step_size=64, clear_cache=False)
    assert honest.status == "ok" and "inert" not in honest.counters
    # a build whose loop clears whatever the flag says
    measure = cell._measure

    def clearing(forward: Any, cache: Any, ids: Any, flags: Flags, *rest: Any) -> Any:
        return measure(forward, cache, ids, dataclasses.replace(flags, clear_cache=True), *rest)

    monkeypatch.setattr(cell, "_measure", clearing)
    planted = _cell(tiny_model[0], prompt, prefill_step_size=64, clear_cache=False)
    assert planted.counters["cache_clears"] == 3
    assert (planted.status, planted.reason) == ("invalid", "silent no-op: clear_cache")


def test_reused_cache_is_detected_invalid_with_its_count(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int]
) -> None:
    model = tiny_model[0]
    cache = make_prompt_cache(model)
    first = run_cell(
        model, prompt, context_tokens=CONTEXT, flags=Flags(), decode_tokens=2, prompt_cache=cache
    )
    assert first.status == "ok" and first.cached_tokens == 0
    second = run_cell(
        model, prompt, context_tokens=CONTEXT, flags=Flags(), decode_tokens=2, prompt_cache=cache
    )
    assert second.status == "invalid"
    assert second.cached_tokens == CONTEXT + 1  # the prompt and one decode step
    assert second.reason == f"cached_tokens={CONTEXT + 1}: the KV cache was not fresh"


def test_prompt_length_mismatch_is_invalid(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int]
) -> None:
    result = run_cell(
        tiny_model[0], prompt[:-1], context_tokens=CONTEXT, flags=Flags(), decode_tokens=1
    )
    assert result.status == "invalid"
    assert result.reason == f"prompt has {CONTEXT - 1} tokens, the cell asks for {CONTEXT}"
    assert result.decode_s is None and result.decode_tps is None  # one token: no steps


def test_failure_inside_the_cell_is_an_error_record(tmp_path: Path, prompt: list[int]) -> None:
    path = checkpoints.create_checkpoint("tiny", tmp_path / "broken")
    model, _, _ = checkpoints.load_model(path)
    attention = model.model.layers[1].self_attn
    attention.o_proj.weight = mx.zeros((7, 3))  # a real shape error in the forward pass
    result = run_cell(model, prompt, context_tokens=CONTEXT, flags=Flags(), decode_tokens=2)
    assert result.status == "error"
    assert "ValueError" in result.reason and "\n" not in result.reason
    assert result.prefill_s is None and result.output_sha256 is None
    Record.model_validate(_record(result))


def test_moe_compile_keeps_output(tmp_path: Path) -> None:
    path = checkpoints.create_checkpoint("tiny-moe", tmp_path / "moe")
    model, tokenizer, _ = checkpoints.load_model(path)
    ids = PromptSource.from_tokenizer(tokenizer).prompt(0, 0, 128).ids
    plain = run_cell(model, ids, context_tokens=128, flags=Flags(), decode_tokens=4)
    compiled = run_cell(model, ids, context_tokens=128, flags=Flags(compile=True), decode_tokens=4)
    assert plain.status == compiled.status == "ok"
    assert compiled.counters["compile.dispatched"] == 2 * 4
    assert compiled.output_head == plain.output_head


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"fast": True},
            "unknown engine flag 'fast'; known: clear_cache, compile, fused_add_rms_norm, "
            "fused_swiglu, prefill_step_size",
        ),
        ({"prefill_step_size": "big"}, "flag prefill_step_size='big': expected an integer"),
        ({"prefill_step_size": 0}, "flag prefill_step_size=0: expected an integer"),
        ({"prefill_step_size": True}, "expected a positive integer"),
        ({"compile": "maybe"}, "flag compile='maybe': expected true or false"),
    ],
)
def test_bad_flags_are_one_line_errors(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        Flags.parse(flags)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_flags_parse_strings_and_report_non_defaults() -> None:
    flags = Flags.parse({"prefill_step_size": "512", "clear_cache": "false", "compile": "true"})
    assert flags == Flags(prefill_step_size=512, clear_cache=False, compile=True)
    assert Flags().non_default() == {}
    assert Flags(compile=True).non_default() == {"compile": True}


def test_feature_needing_another_backend_is_recorded_not_exercised(
    tiny_model: tuple[Any, Any, dict[str, Any]],
    prompt: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coldbench.engine import backend

    assert backend.detect_backend() == "cpu"
    monkeypatch.setitem(backend.FEATURE_BACKENDS, "compile", ("metal",))
    result = _cell(tiny_model[0], prompt, compile=True)
    why = "needs metal; this host runs MLX on cpu"
    assert result.counters["compile.not_exercised"] == why
    assert result.status == "invalid"
    assert result.reason == f"not exercised: compile ({why})"
    assert backend.not_exercised(["compile"], backend="metal") == {}


def test_zero_decode_tokens_is_a_prefill_only_cell(
    tiny_model: tuple[Any, Any, dict[str, Any]], prompt: list[int]
) -> None:
    result = run_cell(tiny_model[0], prompt, context_tokens=CONTEXT, flags=Flags(), decode_tokens=0)
    assert result.status == "ok", result.reason
    assert result.output_head == [] and result.output_margins == []
    assert result.output_sha256 == ids_sha256([])
    assert result.decode_tokens == 0 and result.decode_s is None
    assert result.prefill_tps > 0
