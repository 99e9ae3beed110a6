"""Hypothesis on the parsers of what hosts and submitters send: records, manifests, job specs,
bundles. Each either parses or fails with its documented error; nothing else escapes.

Bounded: a few hundred examples each, derandomized (the same examples on every run)."""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coldbench.evidence.bundles.bundle import BundleError, read_zip, verify_files
from coldbench.evidence.contract.records import parse_records
from coldbench.evidence.contract.schemas import JobSpec, Manifest, Record
from coldbench.evidence.contract.variant import expand_variants
from tests.evidence.builders import record

BOUNDED = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _mutated(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid document with some fields replaced by arbitrary JSON, some dropped."""
    return st.builds(
        lambda replace, drop: {
            **{k: v for k, v in base.items() if k not in drop},
            **replace,
        },
        st.dictionaries(st.sampled_from(sorted(base) + ["extra"]), JSON, max_size=3),
        st.sets(st.sampled_from(sorted(base)), max_size=2),
    )


VALID_RECORD = json.loads(record().model_dump_json(by_alias=True))
VALID_SPEC: dict[str, Any] = {
    "schema": "coldbench.job/1",
    "mode": "ablation",
    "variants": [{"name": "base", "flags": {"prefill_step_size": 256}}, {"name": "other"}],
    "features": ["compile", "prefill_step_size=4096"],
    "contexts": [64, 128],
    "rounds": 2,
    "model": "preset:tiny",
}
VALID_MANIFEST: dict[str, Any] = {
    "format": "coldbench.evidence/1",
    "files": {"records.jsonl": {"sha256": "0" * 64, "bytes": 1}},
    "provenance": {},
}


@BOUNDED
@given(_mutated(VALID_RECORD) | JSON)
def test_record_validation_raises_only_validation_errors(value: Any) -> None:
    with contextlib.suppress(ValidationError):
        Record.model_validate(value)


@BOUNDED
@given(st.lists(_mutated(VALID_RECORD) | JSON, max_size=4), st.binary(max_size=40))
def test_records_jsonl_parsing_reports_problems_never_raises(
    values: list[Any], junk: bytes
) -> None:
    lines = [json.dumps(v).encode() for v in values] + [junk]
    records, problems = parse_records(b"\n".join(lines))
    assert len(records) + len(problems) <= len(lines) + junk.count(b"\n") + 1
    assert all(isinstance(p, str) and "\n" not in p for p in problems)


@BOUNDED
@given(_mutated(VALID_MANIFEST) | JSON)
def test_manifest_validation_raises_only_validation_errors(value: Any) -> None:
    with contextlib.suppress(ValidationError):
        Manifest.model_validate(value)


@BOUNDED
@given(_mutated(VALID_SPEC) | JSON)
def test_job_spec_parsing_raises_only_documented_errors(value: Any) -> None:
    """JobSpec validation raises ValidationError; the ablation expansion a ValueError."""
    try:
        spec = JobSpec.model_validate(value)
    except ValidationError:
        return
    with contextlib.suppress(ValueError):
        expand_variants(spec)


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return out.getvalue()


@BOUNDED
@given(
    st.dictionaries(
        st.sampled_from(["manifest.json", "records.jsonl", "provenance.json", "x/y", "../z"]),
        st.binary(max_size=60),
        max_size=4,
    ),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=6),
)
def test_damaged_zips_raise_only_bundle_errors(files: dict[str, bytes], flips: list) -> None:
    data = bytearray(_zip(files))
    for position, value in flips:
        data[position % len(data)] = value
    try:
        read = read_zip(bytes(data))
    except BundleError:
        return
    verify_files(read)  # whatever was readable: problems listed, nothing raised
