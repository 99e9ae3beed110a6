from __future__ import annotations

import pytest
from pydantic import ValidationError

from coldbench.evidence.contract.schemas import JobRequest, JobSpec, Manifest, Record, SpecLimits


def _record(**overrides: object) -> dict[str, object]:
    record: dict[str, object] = {
        "schema": "coldbench.record/1",
        "run_id": "r1",
        "variant": "base",
        "round": 0,
        "order": 0,
        "context_tokens": 64,
        "prompt_tokens": 64,
        "prompt_sha256": "0" * 64,
        "cached_tokens": 0,
        "prefill_s": 0.5,
        "prefill_tps": 128.0,
        "decode_tokens": 4,
        "decode_s": 0.1,
        "decode_tps": 40.0,
        "output_sha256": "1" * 64,
        "output_head": [1, 2, 3, 4],
        "peak_memory_bytes": 1000,
        "counters": {"chunks": 1},
        "started_at": "2026-11-29T00:00:00Z",
        "ended_at": "2026-11-29T00:00:01Z",
        "status": "ok",
        "reason": None,
    }
    record.update(overrides)
    return record


def test_ok_record_round_trips() -> None:
    record = Record.model_validate(_record())
    assert record.to_json_dict()["schema"] == "coldbench.record/1"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cached_tokens": 12}, "cached_tokens=12"),
        ({"prompt_tokens": 63}, "prompt_tokens=63"),
        ({"status": "invalid", "reason": None}, "needs a reason"),
        ({"unexpected": 1}, "unexpected"),
        ({"prefill_s": None}, "prefill_s"),
    ],
)
def test_bad_records_are_refused_with_the_field_named(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Record.model_validate(_record(**overrides))


def test_job_spec_defaults_baseline_and_refuses_duplicates() -> None:
    spec = JobSpec.model_validate(
        {"variants": [{"name": "a"}, {"name": "b"}], "contexts": [256, 128], "rounds": 3}
    )
    assert spec.baseline == "a"
    assert spec.contexts == [128, 256]
    with pytest.raises(ValidationError, match="unique"):
        JobSpec.model_validate(
            {"variants": [{"name": "a"}, {"name": "a"}], "contexts": [64], "rounds": 3}
        )


@pytest.mark.parametrize("ref", ["--upload-pack=evil", "a..b", "x y", ""])
def test_refs_that_could_be_options_or_ranges_are_refused(ref: str) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(
            {"variants": [{"name": "a", "ref": ref}], "contexts": [64], "rounds": 3}
        )


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "manifest.json"])
def test_manifest_refuses_unsafe_names(name: str) -> None:
    with pytest.raises(ValidationError, match="unsafe or reserved"):
        Manifest.model_validate({"files": {name: {"sha256": "0" * 64, "bytes": 1}}})


def test_a_validation_error_is_one_line_naming_its_field() -> None:
    from coldbench.evidence.contract.schemas import error_line

    base = {"model": "m", "contexts": [64], "rounds": 3, "variants": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate(base | {"contexts": [0], "rounds": "many"})
    first = error_line(raised.value)
    assert first == "contexts: context lengths must be positive token counts"
    every = error_line(raised.value, every=True)
    assert every.startswith(first + "; ") and "rounds: " in every and "\n" not in every
    # a rule across fields names the field its SpecError is about, without pydantic's prefix
    with pytest.raises(ValidationError) as raised:
        JobSpec.model_validate(base | {"baseline": "nope"})
    assert error_line(raised.value, whole="job").startswith("baseline: ")
    assert "Value error" not in error_line(raised.value)


def test_a_request_may_leave_rounds_out_and_the_job_that_runs_may_not() -> None:
    """`JobRequest`: rounds absent means the job's default (resolved later), until absent means
    decided. `JobSpec` (what runs and what job.json holds): rounds required; until absent reads
    as `rounds`, what a job.json written before `until` existed measured. A service's bound on
    rounds holds for both, and refuses in one clear line."""
    raw = {"variants": [{"name": "a"}], "contexts": [64]}
    request = JobRequest.model_validate(raw)
    assert (request.rounds, request.until) == (None, "decided")
    with pytest.raises(ValidationError, match="rounds"):
        JobSpec.model_validate(raw)
    older = JobSpec.model_validate({**raw, "rounds": 6})
    assert isinstance(older, JobRequest) and (older.rounds, older.until) == (6, "rounds")
    limits = SpecLimits(
        max_contexts=4, max_context_tokens=4096, max_rounds=8, max_decode_tokens=8, max_hosts=1
    )
    for model in (JobRequest, JobSpec):
        with pytest.raises(ValidationError, match="rounds=9; at most 8 allowed"):
            model.model_validate({**raw, "rounds": 9}, context={"limits": limits})
    assert JobRequest.model_validate(raw, context={"limits": limits}).rounds is None
