"""The engine's typed record (engine/record.py) and the evidence contract that reads it."""

from __future__ import annotations

from dataclasses import fields

from coldbench.engine.record import REASON_MAX_CHARS, CellRecord, Measurement, clip, one_line
from coldbench.evidence.contract.schemas import Record

IDENTITY = {"run_id": "r", "variant": "base", "round": 0, "order": 1, "context_tokens": 64}


def test_the_record_has_exactly_the_contracts_fields() -> None:
    contract = {field.alias or name for name, field in Record.model_fields.items()}
    assert {field.name for field in fields(CellRecord)} == contract


def test_a_failed_cell_is_a_valid_error_record_with_every_value_unknown() -> None:
    record = CellRecord.of(Measurement.failed("boom"), **IDENTITY, adapter="embedded", flags={})
    written = record.as_json()
    assert list(written)[:6] == ["schema", "run_id", "variant", "round", "order", "context_tokens"]
    # optional fields appear only when known
    assert not {"output_margins", "prompt_corpus_sha256", "process"} & set(written)
    parsed = Record.model_validate(written)
    assert (parsed.status, parsed.reason) == ("error", "boom")
    assert parsed.prefill_s is None and parsed.cached_tokens is None and parsed.counters == {}
    with_process = CellRecord.of(Measurement.failed("gone"), **IDENTITY, process=3).as_json()
    assert Record.model_validate(with_process).process == 3


def test_a_long_reason_keeps_its_start_and_its_end() -> None:
    tail = "error: unrecognized arguments: --bogus-flag"
    text = "server exited with code 2 before ready: " + "usage: line | " * 200 + tail
    kept = clip(text)
    assert len(kept) == REASON_MAX_CHARS
    assert kept.startswith("server exited with code 2 before ready")
    assert kept.endswith(tail)
    assert Measurement.failed(text).reason == kept
    assert clip("short") == "short"


def test_one_line_keeps_a_value_errors_words_and_names_other_types() -> None:
    assert one_line(ValueError("bad\n  input")) == "bad input"
    assert one_line(RuntimeError("it\nbroke")) == "RuntimeError: it broke"
    failed = Measurement()
    failed.fail(KeyError("x"))
    assert failed.status == "error" and failed.reason == "KeyError: 'x'"
