"""The one cell rule (coldbench.engine.judge), checked on its own: every branch of the verdict."""

from __future__ import annotations

from typing import Any

import pytest

from coldbench.engine.judge import (
    AtLeast,
    ChunksOf,
    Expectation,
    Judgement,
    Observation,
    generate_step_widths,
    join_runs,
    judge_cell,
    runs_text,
    split_runs,
    to_runs,
)
from coldbench.engine.record import Measurement

N = 128


def _judge(**changes: Any) -> Judgement:
    values: dict[str, Any] = {
        "context_tokens": N,
        "decode_tokens": 4,
        "cached_tokens": 0,
        "prompt_tokens": N,
        "prefilled_tokens": N,
        "decoded_tokens": 4,
    }
    return judge_cell(**(values | changes))


def _steps(step: int, n: int = N) -> Expectation:
    return Expectation(
        "prefill_step_size",
        ChunksOf(step, split_runs(n, step)),
        ChunksOf(2048, split_runs(n, 2048)),
    )


def _step(step: int, observed_step: int, n: int = N) -> tuple[Expectation, Observation]:
    return _steps(step, n), Observation("prefill_step_size", split_runs(n, observed_step))


def _widths(step: int, widths: str, n: int = N) -> Judgement:
    runs = to_runs(int(w) for w in widths.split(","))
    return _judge(execution=[(_steps(step, n), Observation("prefill_step_size", runs))])


def test_cold_length_prefill_and_decode_come_first() -> None:
    assert _judge() == Judgement("ok", None, ())
    assert _judge(cached_tokens=None).reason == (
        "the engine's KV cache does not report cached tokens (cached_tokens unknown)"
    )
    assert _judge(cached_tokens=3).reason == "cached_tokens=3: the KV cache was not fresh"
    assert _judge(prompt_tokens=N - 1).reason == f"prompt has {N - 1} tokens, the cell asks for {N}"
    assert _judge(prefilled_tokens=N - 2).reason == f"the engine prefilled {N - 2} tokens of {N}"
    assert _judge(prefilled_tokens=None, prefill_observed=False).status == "ok"
    assert _judge(decoded_tokens=2).reason == "decoded 2 tokens of 4"
    # a warm cache is reported even when a flag is also a no-op
    assert _judge(cached_tokens=5, execution=[_step(64, 2048)]).reason.startswith("cached_tokens=5")


def test_execution_ok_inert_and_silent_no_op() -> None:
    assert _judge(execution=[_step(64, 64)]) == Judgement("ok", None, ())
    # the request implies stock's widths here: ok, listed as inert, whatever was observed
    assert _judge(execution=[_step(4096, 4096)]) == Judgement("ok", None, ("prefill_step_size",))
    assert _judge(execution=[_step(64, 2048)]).reason == "silent no-op: prefill_step_size"
    # 32-wide chunks when 64 are asked: neither the request nor stock, never a no-op
    assert _judge(execution=[_step(64, 32)]).reason == (
        "not as requested: prefill_step_size (the request implies chunks of 64, stock chunks "
        "of 2048; observed 32x4)"
    )
    # 4096 at 4096 tokens against stock 2048: not inert, and an honest build delivers one chunk
    assert _judge(
        context_tokens=4096,
        prompt_tokens=4096,
        prefilled_tokens=4096,
        execution=[_step(8192, 8192, 4096)],
    ) == Judgement("ok", None, ())
    clear = Expectation("clear_cache", 0, 0)  # one chunk: stock clears nothing either
    assert _judge(execution=[(clear, Observation("clear_cache", 0))]).inert == ("clear_cache",)
    clear = Expectation("clear_cache", 0, 3)
    assert _judge(execution=[(clear, Observation("clear_cache", 0))]).inert == ()
    assert _judge(execution=[(clear, Observation("clear_cache", 3))]).reason == (
        "silent no-op: clear_cache"
    )
    assert _judge(execution=[(clear, Observation("clear_cache", 1))]).reason == (
        "not as requested: clear_cache (the request implies 0, stock 3; observed 1)"
    )


def test_a_step_is_judged_by_what_it_implies_whatever_the_remainder_policy() -> None:
    # 128 tokens at 64: the remainder last, alone, with the first token, or first: all obey 64
    for widths in ("64,64", "64,63,1", "63,64,1"):
        assert _widths(64, widths) == Judgement("ok", None, ()), widths
    # stock's cuts of 128 tokens (one chunk, or 127 then the last token): a no-op
    for widths in ("128", "127,1"):
        assert _widths(64, widths).reason == "silent no-op: prefill_step_size", widths
    # neither: chunks wider than asked but not stock's, or narrower than asked
    for widths in ("100,28", "32,32,32,32", "64,32,32", "1,64,63"):
        reason = _widths(64, widths).reason
        assert reason.startswith("not as requested: prefill_step_size ("), widths
    # the tokens must add up: 64+32 is not a cut of 128 tokens by anyone
    assert _widths(64, "64,32").reason.startswith("not as requested: prefill_step_size")
    # one-token chunks obey step 1 in any layout; stock never cuts so
    assert _widths(1, ",".join(["1"] * N)).status == "ok"
    assert _widths(1, "127,1").reason == "silent no-op: prefill_step_size"


def test_a_server_option_judged_by_a_proof_line() -> None:
    proof = Expectation("step", AtLeast(1), 0, same_as_stock=False)
    assert _judge(execution=[(proof, Observation("step", 1))]).status == "ok"
    assert _judge(execution=[(proof, Observation("step", 0))]).reason == "silent no-op: step"
    inert = Expectation("step", AtLeast(1), 0, same_as_stock=True)
    assert _judge(execution=[(inert, Observation("step", 0))]).inert == ("step",)
    why = "its proof line at 4097 tokens is one the stock server prints too"
    unprovable = Observation("step", 1, unprovable=why)
    assert _judge(execution=[(proof, unprovable)]).reason == f"not provable: step ({why})"


def test_fast_paths_not_exercised_and_fallbacks() -> None:
    fast = Expectation("fast", AtLeast(1), 0)
    assert _judge(execution=[(fast, Observation("fast", 12))]).status == "ok"
    assert _judge(execution=[(fast, Observation("fast", 0))]).reason == "silent no-op: fast"
    fell = Observation("fast", 3, fallback="fast: bf16 only")
    assert _judge(execution=[(fast, fell)]).reason == "fell back: fast (bf16 only)"
    skipped = Observation("fast", 0, not_exercised="needs metal; this host runs MLX on cpu")
    assert _judge(execution=[(fast, skipped)]).reason == (
        "not exercised: fast (needs metal; this host runs MLX on cpu)"
    )
    with pytest.raises(ValueError, match="paired with"):
        _judge(execution=[(fast, Observation("other", 1))])


def test_judgement_records_inert_flags_in_counters() -> None:
    result = Measurement(counters={"chunks": 1})
    Judgement("ok", None, ("prefill_step_size", "clear_cache")).record(result)
    assert result.status == "ok" and result.reason is None
    assert result.counters == {"chunks": 1, "inert": "prefill_step_size,clear_cache"}
    result = Measurement()
    Judgement("invalid", "silent no-op: x").record(result)
    assert (result.status, result.reason, result.counters) == ("invalid", "silent no-op: x", {})


def test_chunk_width_runs() -> None:
    assert split_runs(256, 64) == ((64, 4),)
    assert split_runs(256, 100) == ((100, 2), (56, 1))
    assert split_runs(100, 4096) == ((100, 1),)
    assert to_runs([64, 64, 63, 1]) == ((64, 2), (63, 1), (1, 1))
    assert join_runs(((1, 63),), ((1, 1),)) == ((1, 64),)
    assert runs_text(((64, 2), (63, 1), (1, 1))) == "64x2+63+1"
    # generate_step: N-1 tokens in chunks, then the last alone
    assert generate_step_widths(128, 64) == ((64, 1), (63, 1), (1, 1))
    assert generate_step_widths(64, 1) == ((1, 64),)
    assert generate_step_widths(128, 4096) == generate_step_widths(128, 2048)
    assert generate_step_widths(4096, 8192) != generate_step_widths(4096, 2048)
