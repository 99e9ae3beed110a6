from __future__ import annotations

import pytest
from pydantic import ValidationError

from coldbench.evidence.contract.schemas import JobSpec, error_field
from coldbench.evidence.contract.variant import baseline_name, expand_variants, parse_flag_value


def _spec(**overrides: object) -> JobSpec:
    values: dict[str, object] = {
        "mode": "ablation",
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "variants": [{"name": "cand", "ref": "feature", "flags": {"compile": False, "x": 1}}],
        "features": ["compile", "clear_cache=false", "prefill_step_size=4096"],
        "contexts": [256],
        "rounds": 3,
    }
    values.update(overrides)
    return JobSpec.model_validate(values)


def test_ablation_expands_none_all_and_leave_one_out() -> None:
    variants = expand_variants(_spec())
    by_name = {v.name: v.flags for v in variants}
    assert [v.name for v in variants] == [
        "none",
        "all",
        "all-minus-compile",
        "all-minus-clear_cache",
        "all-minus-prefill_step_size",
    ]
    # A feature is off at the template's own value (compile=False here), else at the default.
    assert by_name["none"] == {"compile": False, "x": 1}
    assert by_name["all"] == {
        "x": 1,
        "compile": True,
        "clear_cache": False,
        "prefill_step_size": 4096,
    }
    assert by_name["all-minus-clear_cache"] == {"x": 1, "compile": True, "prefill_step_size": 4096}
    assert by_name["all-minus-compile"] == {
        "x": 1,
        "compile": False,
        "clear_cache": False,
        "prefill_step_size": 4096,
    }
    assert all(v.ref == "feature" for v in variants)
    assert baseline_name(_spec()) == "none"


def test_other_variants_are_kept_and_clashing_names_refused() -> None:
    spec = _spec(variants=[{"name": "cand", "ref": "feature"}, {"name": "upstream", "ref": "main"}])
    assert [v.name for v in expand_variants(spec)][-1] == "upstream"
    with pytest.raises(ValidationError, match="clashes") as refused:
        _spec(variants=[{"name": "cand", "ref": "f"}, {"name": "all", "ref": "main"}])
    assert error_field(refused.value) == "variants.1.name"


def test_template_chunk_width_is_kept_where_its_feature_is_off() -> None:
    spec = _spec(
        variants=[{"name": "cand", "ref": "f", "flags": {"prefill_step_size": 32}}],
        features=["prefill_step_size=64", "clear_cache=false"],
    )
    by_name = {v.name: v.flags for v in expand_variants(spec)}
    assert by_name["none"] == {"prefill_step_size": 32}
    assert by_name["all-minus-prefill_step_size"] == {"prefill_step_size": 32, "clear_cache": False}


def test_feature_already_on_in_the_template_is_refused() -> None:
    with pytest.raises(ValidationError, match="already on in the first variant.*compile=true"):
        _spec(variants=[{"name": "cand", "ref": "f", "flags": {"compile": True}}])


def test_repeated_feature_flag_is_refused() -> None:
    with pytest.raises(ValidationError, match="same flag twice: compile") as refused:
        _spec(features=["compile", "compile=false"])
    assert error_field(refused.value) == "features"


def test_expanded_names_must_fit() -> None:
    with pytest.raises(ValidationError, match="too long or not a plain name"):
        _spec(features=["a" * 60])


def test_ab_mode_keeps_the_spec_and_its_baseline() -> None:
    spec = JobSpec.model_validate(
        {"variants": [{"name": "a"}, {"name": "b"}], "contexts": [64], "rounds": 3, "baseline": "b"}
    )
    assert [v.name for v in expand_variants(spec)] == ["a", "b"]
    assert baseline_name(spec) == "b"


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("False", False), ("4096", 4096), ("0.5", 0.5), ("fast", "fast")],
)
def test_flag_values_parse_to_bool_int_float_or_str(text: str, value: object) -> None:
    parsed = parse_flag_value(text)
    assert parsed == value and type(parsed) is type(value)
