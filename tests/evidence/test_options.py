"""Host-declared server options: typed values, bounds, and argv/env rendered from them only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coldbench.evidence.spec.options import (
    HostOption,
    OptionError,
    resolved_options,
    validate_option_values,
)

STEP = HostOption(
    type="int",
    min=64,
    max=16384,
    argv=("--prefill-step-size", "{value}"),
    proof="Prompt processing progress: {value}/",
    stock=2048,
    prefill_step=True,
)
FAST = HostOption(type="bool", argv=("--fast",), env={"FAST_LOG": "{value}"}, proof="fast: on")


def test_values_are_typed_and_bounded() -> None:
    assert STEP.validate_value("step", 4096) == 4096
    assert STEP.validate_value("step", "4096") == 4096
    for bad, why in ((63, "allowed 64..16384"), (True, "give an integer"), ("4k", "integer")):
        with pytest.raises(OptionError, match=f"option step.*{why}"):
            STEP.validate_value("step", bad)
    assert FAST.validate_value("fast", 1) is True and FAST.validate_value("fast", "false") is False
    with pytest.raises(OptionError, match="option fast: give true/false or 1/0, not 2"):
        FAST.validate_value("fast", 2)


def test_rendering_fills_only_the_validated_value() -> None:
    assert STEP.render(4096) == (["--prefill-step-size", "4096"], {})
    assert FAST.render(True) == (["--fast"], {"FAST_LOG": "1"})
    assert FAST.render(False) == ([], {})  # off is the stock server
    assert STEP.proof_pattern(4096) == "Prompt processing progress: 4096/"
    assert FAST.proof_pattern(False) is None  # nothing to prove when off
    resolved = resolved_options({"step": STEP, "fast": FAST}, {"step": "128", "fast": 1})
    assert resolved["step"] == {
        "value": 128,
        "argv": ["--prefill-step-size", "128"],
        "env": {},
        "proof": "Prompt processing progress: 128/",
        "stock": 2048,
        "prefill_step": True,
        "proof_template": "Prompt processing progress: {value}/",
    }


def test_a_submitter_cannot_add_an_option_or_an_argument() -> None:
    with pytest.raises(OptionError, match=r"option extra is not declared by the host \(declared"):
        validate_option_values({"step": STEP}, {"extra": "--evil"})
    with pytest.raises(OptionError, match="give an integer, not '1; rm -rf /'"):
        validate_option_values({"step": STEP}, {"step": "1; rm -rf /"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": "int", "argv": ["--n", "{value}"]}, "needs min and max"),
        ({"type": "int", "min": 1, "max": 8, "argv": ["--n"]}, "must pass its {value}"),
        ({"type": "bool", "min": 1, "argv": ["--x"]}, "apply to int options only"),
        ({"type": "bool"}, "must set argv pieces or env"),
        ({"type": "bool", "argv": ["--x={port}"]}, "the only placeholder is {value}"),
        ({"type": "bool", "argv": ["--x"], "proof": "("}, "not a regular expression"),
        ({"type": "bool", "env": {"A-B": "1"}}, "not an environment variable name"),
        # a proof naming the value, without the server's own value: stock's lines would count
        (
            {"type": "int", "min": 1, "max": 8, "argv": ["--n", "{value}"], "proof": "n={value}"},
            "a proof naming {value} needs stock",
        ),
        ({"type": "bool", "argv": ["--x"], "stock": 3}, "stock must be a bool"),
        ({"type": "int", "min": 1, "max": 8, "argv": ["{value}"], "stock": True}, "be an int"),
        ({"type": "bool", "argv": ["--x"], "prefill_step": True}, "a prefill_step option is an"),
    ],
)
def test_bad_declarations_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("}", r"\}")):
        HostOption.model_validate(fields)


def test_offer_describes_without_argv_or_env() -> None:
    assert STEP.offer() == {"type": "int", "min": 64, "max": 16384, "proof": True}
    assert "argv" not in FAST.offer() and "env" not in FAST.offer()
