"""The boundary types (evidence/contract/boundary.py): whatever a host or a submitter sends, a
message or a file either is refused with a ValidationError (or a JSONDecodeError), or what validated
is storable: canonical JSON, no NUL or other control character outside multi-line text,
finite floats, integers within 64 bits.

Hypothesis draws from tests/evidence/strategies.py; bounded and derandomized.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from coldbench.evidence.contract.boundary import MAX_EXTRA_FIELDS, strict_json_loads, value_problem
from coldbench.evidence.contract.canonical import canonical_json
from coldbench.evidence.contract.protocol import (
    CompleteRequest,
    HeartbeatRequest,
    InvalidCell,
    LeaseRequest,
    RegisterRequest,
)
from coldbench.evidence.contract.schemas import HostInfo, JobSpec, Manifest, Provenance, Record
from tests.evidence.strategies import (
    HOSTILE_JSON,
    VALID_MESSAGES,
    VALID_PROVENANCE,
    VALID_RECORD,
    hostile,
)

BOUNDED = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MESSAGES: dict[str, type[BaseModel]] = {
    "RegisterRequest": RegisterRequest,
    "LeaseRequest": LeaseRequest,
    "HeartbeatRequest": HeartbeatRequest,
    "CompleteRequest": CompleteRequest,
}


def _assert_storable(model: BaseModel) -> None:
    dumped = model.model_dump(mode="json", by_alias=True)
    assert value_problem(dumped, multiline=True) is None
    text = canonical_json(dumped)  # refuses NaN and infinity
    assert b"\\u0000" not in text
    assert strict_json_loads(text) == json.loads(text)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_valid_examples_are_valid(name: str) -> None:
    _assert_storable(MESSAGES[name].model_validate(VALID_MESSAGES[name]))


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_a_worker_message_is_refused_or_storable(name: str) -> None:
    model = MESSAGES[name]

    @BOUNDED
    @given(hostile(VALID_MESSAGES[name], depth=3))
    def check(value: Any) -> None:
        try:
            parsed = model.model_validate(value)
        except ValidationError:
            return
        _assert_storable(parsed)

    check()


@BOUNDED
@given(hostile(VALID_RECORD))
def test_a_record_is_refused_or_storable(value: Any) -> None:
    try:
        parsed = Record.model_validate(value)
    except ValidationError:
        return
    _assert_storable(parsed)
    for column in ("round", "order", "context_tokens", "prompt_tokens", "cached_tokens"):
        number = getattr(parsed, column)
        assert number is None or -(2**31) <= number < 2**31  # 32-bit INTEGER columns


@BOUNDED
@given(hostile(VALID_PROVENANCE, depth=3))
def test_a_provenance_is_refused_or_storable(value: Any) -> None:
    try:
        parsed = Provenance.model_validate(value)
    except ValidationError:
        return
    _assert_storable(parsed)
    for name, text in parsed.host.model_dump(exclude_none=True).items():
        if isinstance(text, str):  # one line of a summary: no control character at all
            assert not any(unicodedata.category(char) == "Cc" for char in text), name


@BOUNDED
@given(HOSTILE_JSON)
def test_strict_json_reads_only_what_json_can_hold(value: Any) -> None:
    text = json.dumps(value)  # Python writes NaN and Infinity, which are no JSON
    non_finite = any(
        isinstance(number, float) and not math.isfinite(number) for number in _numbers(value)
    )
    try:
        parsed = strict_json_loads(text)
    except json.JSONDecodeError:
        assert non_finite
        return
    assert not non_finite and parsed == value


@BOUNDED
@given(st.binary(max_size=60) | st.text(max_size=60).map(str.encode))
def test_strict_json_raises_only_decode_errors(raw: bytes) -> None:
    try:
        parsed = strict_json_loads(raw)
    except json.JSONDecodeError as error:
        assert "\n" not in error.msg
        return
    assert not any(
        isinstance(number, float) and not math.isfinite(number) for number in _numbers(parsed)
    )


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    return [value] if isinstance(value, int | float) else []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1e999", "too large for a 64-bit float"),
        ("[-1e400]", "too large for a 64-bit float"),
        ("NaN", "non-finite number NaN"),
        ('{"a": Infinity}', "non-finite number Infinity"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("1" * 5000, "Exceeds the limit"),
        (b"\xff\xfe{", "codec can't decode"),
    ],
)
def test_strict_json_says_why(text: str | bytes, why: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=why):
        strict_json_loads(text)


@pytest.mark.parametrize(
    ("fingerprint", "why"),
    [
        ({"\u0000": "x"}, "is not a plain identifier"),
        ({"hostname": "a\u0000b"}, "control character U+0000"),
        ({"chip": "M3\n# heading"}, "control character U+000A"),
        ({"os": "Linux\u2028x"}, "control character U+2028"),
        ({"cores": 2**63}, "less than or equal to 2147483647"),
        ({"vendor_count": 2**63}, "outside the 64-bit range"),
        ({"vendor": {"deep": [1.5, float("inf")]}}, "inf is not a finite number"),
        ({f"k{i}": i for i in range(MAX_EXTRA_FIELDS + 1)}, "at most 32"),
    ],
)
def test_a_fingerprint_says_what_it_cannot_hold(fingerprint: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(why)):
        HostInfo.model_validate(fingerprint)


def test_multi_line_text_is_kept_where_a_field_is_a_paragraph() -> None:
    reason = "server streamed no token; server log: line 1\n\tline 2"
    cell = Record.model_validate({**VALID_RECORD, "status": "error", "reason": reason})
    assert cell.reason == reason
    with pytest.raises(ValidationError, match=re.escape("U+0000")):
        Record.model_validate({**VALID_RECORD, "status": "error", "reason": "oom\u0000"})
    with pytest.raises(ValidationError, match="run_id"):
        Record.model_validate({**VALID_RECORD, "run_id": "r\n1"})


def test_job_spec_numbers_fit_their_columns_and_json() -> None:
    base = {"variants": [{"name": "a"}], "contexts": [64], "rounds": 3}
    with pytest.raises(ValidationError, match="contexts"):
        JobSpec.model_validate({**base, "contexts": [2**31]})
    # A field's own lower bound holds beside its column's range.
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        JobSpec.model_validate({**base, "rounds": 0})
    # round -2 is a run's warm canary (evidence.contract.schemas.CANARY_ROUND), -1 a warm-up
    with pytest.raises(ValidationError, match="greater than or equal to -2"):
        Record.model_validate({**VALID_RECORD, "round": -3})
    with pytest.raises(ValidationError, match="greater than or equal to -2147483648"):
        InvalidCell.model_validate({"round": -(2**31) - 1})
    with pytest.raises(ValidationError, match="variants.0.flags"):
        JobSpec.model_validate({**base, "variants": [{"name": "a", "flags": {"x": math.nan}}]})
    with pytest.raises(ValidationError, match="seed"):
        JobSpec.model_validate({**base, "seed": 2**64})
    manifest = {"files": {"a\u0000": {"sha256": "0" * 64, "bytes": 1}}}
    with pytest.raises(ValidationError, match="U\\+0000"):
        Manifest.model_validate(manifest)
