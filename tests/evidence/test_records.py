from __future__ import annotations

import json

import pytest

from coldbench.evidence.contract.records import (
    RecordsError,
    parse_records,
    read_records,
    record_line,
    records_bytes,
)
from tests.evidence.builders import record, simulate_run


def test_records_round_trip_through_a_file(tmp_path) -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.1}, rounds=2)
    path = tmp_path / "records.jsonl"
    path.write_bytes(records_bytes(records))
    assert read_records(path) == records
    assert path.read_bytes().count(b"\n") == len(records)


def test_bad_lines_are_named_by_number_and_field(tmp_path) -> None:
    good = record_line(record()).decode()
    bad_field = json.loads(good)
    bad_field["prefill_tps"] = "fast"
    path = tmp_path / "records.jsonl"
    path.write_text(good + "\n" + json.dumps(bad_field) + "\n{not json\n[1]\n")
    with pytest.raises(RecordsError) as raised:
        read_records(path)
    problems = raised.value.problems
    assert problems[0].startswith("records.jsonl line 3: prefill_tps:")
    assert problems[1].startswith("records.jsonl line 4: not JSON")
    assert problems[2] == "records.jsonl line 5: expected a JSON object"
    assert len(problems) == 3


def test_parse_keeps_the_valid_records_beside_the_problems() -> None:
    good = record_line(record())
    records, problems = parse_records(good + b'{"schema": "coldbench.record/1"}\n')
    assert len(records) == 1
    assert len(problems) == 1 and "line 2" in problems[0] and "run_id" in problems[0]


def test_non_utf8_is_one_clear_problem() -> None:
    _, problems = parse_records(b"\xff\xfe")
    assert problems == ["records.jsonl: not UTF-8 (invalid start byte at byte 0)"]


def test_unreadable_file_is_a_records_error(tmp_path) -> None:
    with pytest.raises(RecordsError, match="cannot read"):
        read_records(tmp_path / "absent.jsonl")
