"""The one parser of what people type for a job spec (CLI, submit and the form use it)."""

from __future__ import annotations

import pytest

from coldbench.evidence.contract.spec_text import (
    flag_text,
    flags_text,
    parse_context,
    parse_contexts,
    parse_feature,
    parse_features,
    parse_flag_value,
    parse_flags,
    parse_variant,
)
from coldbench.evidence.contract.variant import parse_variant as parse_variant_spec


def test_contexts_take_k_and_m_suffixes_everywhere() -> None:
    assert parse_context("512") == 512
    assert parse_context(" 4K ") == 4096
    assert parse_context("16k") == 16384
    assert parse_context("1M") == 1024 * 1024
    assert parse_contexts("128,256") == [128, 256]
    assert parse_contexts("4K, 16K 32k") == [4096, 16384, 32768]
    for bad in ("12x", "-4", "4G", "", "0", "1.5K"):
        with pytest.raises(ValueError):
            parse_context(bad)
    with pytest.raises(ValueError, match="'12x' is not a token count"):
        parse_contexts("64, 12x")
    with pytest.raises(ValueError, match="at least one"):
        parse_contexts(" , ")


def test_flag_values_and_flags() -> None:
    assert [parse_flag_value(t) for t in ("TRUE", "false", "64", "0.5", "fp16")] == [
        True,
        False,
        64,
        0.5,
        "fp16",
    ]
    assert parse_flags("prefill_step_size=256, clear_cache=false") == {
        "prefill_step_size": 256,
        "clear_cache": False,
    }
    assert parse_flags("") == {}
    with pytest.raises(ValueError, match="name=value"):
        parse_flags("compile")
    with pytest.raises(ValueError, match="not a flag name"):
        parse_flags("Bad-Name=1")
    with pytest.raises(ValueError, match="twice"):
        parse_flags("compile=true, compile=false")


def test_flags_print_as_they_are_typed_and_parse_back() -> None:
    flags = {"prefill_step_size": 256, "clear_cache": False, "compile": True, "scale": 0.5}
    text = flags_text(flags)
    assert text == "clear_cache=false, compile=true, prefill_step_size=256, scale=0.5"
    assert parse_flags(text) == flags
    assert flag_text("kv_bits", "fp16") == "kv_bits=fp16"
    assert flags_text({}) == "" and flags_text({}, empty="defaults") == "defaults"


def test_features() -> None:
    assert parse_features("compile, clear_cache=false prefill_step_size=4096") == [
        "compile",
        "clear_cache=false",
        "prefill_step_size=4096",
    ]
    assert parse_feature("compile") == ("compile", True)
    assert parse_feature("prefill_step_size=4096") == ("prefill_step_size", 4096)


def test_variants_split_target_keys_from_flags() -> None:
    assert parse_variant("cand:ref=main,recipe=editable,prefill_step_size=64") == {
        "name": "cand",
        "ref": "main",
        "recipe": "editable",
        "flags": {"prefill_step_size": 64},
    }
    assert parse_variant("base") == {"name": "base", "flags": {}}
    with pytest.raises(ValueError, match="expected key=value, got 'prefill_step_size'"):
        parse_variant("x:prefill_step_size")
    with pytest.raises(ValueError, match="compile given twice"):
        parse_variant("x:compile=true,compile=false")
    assert parse_variant_spec("cand:fast=1").flags == {"fast": 1}
    with pytest.raises(ValueError, match="^name: String should match pattern"):
        parse_variant_spec("-x")
    with pytest.raises(ValueError, match="^ref: ref '--upload-pack=x' is not a plain"):
        parse_variant_spec("x:ref=--upload-pack=x")
