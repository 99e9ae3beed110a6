"""Host-owned server options: how a host declares them and how a variant's values become argv.

A server repository of a host (worker.toml, adapter `openai-server`) declares named options.
Each maps one typed value (an int within bounds, or a bool) to argv pieces appended to the
server command and/or environment variables, with `{value}` filled by the *validated* value.
A variant names options like flags (`fast=1`, `prefill_step_size=4096`); nothing else of the
submitter's reaches the command line. An optional `proof` is a regular expression over the
server's own output lines during a cell; its matches are the option's counter, and a requested
option whose proof never matches is a silent no-op. `stock` (the server's own value) makes a
request of that value inert and keeps a proof line stock would print too from counting;
`prefill_step` says the option is the server's prefill chunk width, judged at each context as
the engine flag `prefill_step_size` is (docs/ENGINE.md).

This is contract: the worker validates variants against it before starting a server and the
API (registration, submit) can validate the same declarations. Imports only pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

OPTION_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
VALUE_PLACEHOLDER = "{value}"
# A proof over server output: bounded so a host's typo cannot make every cell crawl.
PROOF_MAX_CHARS = 500
OptionValue = int | bool


class OptionError(ValueError):
    """A variant's option value the host's declaration does not allow; names the option."""


def _placeholders_ok(text: str) -> bool:
    """Only `{value}` may appear in braces: anything else is a typo, not a literal."""
    return all(found == "value" for found in re.findall(r"\{([^{}]*)\}", text))


class HostOption(BaseModel):
    """One option of a server repository, declared by the host (worker.toml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["int", "bool"]
    min: int | None = None
    max: int | None = None
    # Appended to the server command when the option is requested (a bool: when true).
    argv: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    # A regular expression over the server's stdout/stderr lines; `{value}` is the value,
    # escaped. Its matches during a cell become the counter `<option>.dispatched`.
    proof: str | None = Field(None, max_length=PROOF_MAX_CHARS)
    description: str | None = Field(None, max_length=300)
    # The value the server acts on when the option is not given (a bool option: false). A
    # request of it is inert; a proof line it would print proves nothing.
    stock: OptionValue | None = None
    # The option is the width of the server's prefill chunks (mlx_lm.server's
    # --prefill-step-size): what a value implies at a context is judged as for the engine flag
    # prefill_step_size (a step wider than the prompt is inert where stock's is too), and a
    # proof line naming a chunk boundary stock also reaches at that context counts for nothing.
    prefill_step: bool = False

    @field_validator("argv")
    @classmethod
    def _argv_pieces(cls, argv: tuple[str, ...]) -> tuple[str, ...]:
        for piece in argv:
            if not piece:
                raise ValueError("argv pieces must not be empty strings")
            if not _placeholders_ok(piece):
                raise ValueError(f"argv piece {piece!r}: the only placeholder is {{value}}")
        return argv

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME_PATTERN.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if not _placeholders_ok(value):
                raise ValueError(f"env {name}={value!r}: the only placeholder is {{value}}")
        return env

    @field_validator("proof")
    @classmethod
    def _proof_compiles(cls, proof: str | None) -> str | None:
        if proof is None:
            return None
        try:
            re.compile(proof.replace(VALUE_PLACEHOLDER, "0"))
        except re.error as error:
            raise ValueError(f"not a regular expression: {error}") from None
        return proof

    @model_validator(mode="after")
    def _typed_and_effective(self) -> HostOption:
        if self.type == "int":
            if self.min is None or self.max is None:
                raise ValueError("an int option needs min and max (the values a variant may ask)")
            if self.min > self.max:
                raise ValueError(f"min {self.min} is above max {self.max}")
        elif self.min is not None or self.max is not None:
            raise ValueError("min and max apply to int options only")
        if not self.argv and not self.env:
            raise ValueError("an option must set argv pieces or env variables (or both)")
        if self.stock is not None and isinstance(self.stock, bool) != (self.type == "bool"):
            raise ValueError(f"stock must be a{'' if self.type == 'bool' else 'n'} {self.type}")
        if self.prefill_step and (self.type != "int" or self.stock is None):
            raise ValueError(
                "a prefill_step option is an int with its stock value (the server's own step)"
            )
        if (
            self.type == "int"
            and self.proof
            and VALUE_PLACEHOLDER in self.proof
            and self.stock is None
        ):
            raise ValueError(
                "a proof naming {value} needs stock (the server's own value): a line stock "
                "prints too proves nothing"
            )
        if self.type == "int" and not any(
            VALUE_PLACEHOLDER in piece for piece in (*self.argv, *self.env.values())
        ):
            raise ValueError("an int option must pass its {value} in argv or env")
        return self

    def validate_value(self, name: str, raw: Any) -> OptionValue:
        """The typed value of `name=raw`, or OptionError naming the option and its bounds."""
        if self.type == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, int) and raw in (0, 1):
                return bool(raw)
            if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
                return raw.lower() in ("true", "1")
            raise OptionError(f"option {name}: give true/false or 1/0, not {raw!r}")
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str) and re.fullmatch(r"-?[0-9]{1,18}", raw):
            value = int(raw)
        if value is None:
            raise OptionError(f"option {name}: give an integer, not {raw!r}")
        assert self.min is not None and self.max is not None  # model validator
        if not self.min <= value <= self.max:
            raise OptionError(f"option {name}={value}: allowed {self.min}..{self.max}")
        return value

    def offer(self) -> dict[str, Any]:
        """What registration may tell the API of this option: its type, bounds and whether it
        is proven, never its argv or env (those stay the host's)."""
        return {"type": self.type, "min": self.min, "max": self.max, "proof": bool(self.proof)}

    def applies(self, value: OptionValue) -> bool:
        """A bool option that is false is the stock server: nothing is added."""
        return not (self.type == "bool" and value is False)

    def render(self, value: OptionValue) -> tuple[list[str], dict[str, str]]:
        """(argv pieces, env) for a validated value: `{value}` replaced, nothing concatenated
        from submitter text (the value is an int or a bool by now)."""
        if not self.applies(value):
            return [], {}
        text = ("1" if value else "0") if isinstance(value, bool) else str(int(value))
        argv = [piece.replace(VALUE_PLACEHOLDER, text) for piece in self.argv]
        env = {key: item.replace(VALUE_PLACEHOLDER, text) for key, item in self.env.items()}
        return argv, env

    def proof_pattern(self, value: OptionValue) -> str | None:
        """The proof with `{value}` filled (escaped), or None when nothing is to be proven."""
        if self.proof is None or not self.applies(value):
            return None
        text = ("1" if value else "0") if isinstance(value, bool) else str(int(value))
        return self.proof.replace(VALUE_PLACEHOLDER, re.escape(text))


def validate_option_values(
    declared: Mapping[str, HostOption], values: Mapping[str, Any]
) -> dict[str, OptionValue]:
    """A variant's option values checked against a repository's declarations (OptionError)."""
    unknown = sorted(set(values) - set(declared))
    if unknown:
        offered = ", ".join(sorted(declared)) or "none"
        raise OptionError(
            f"option {', '.join(unknown)} is not declared by the host (declared: {offered})"
        )
    return {name: declared[name].validate_value(name, raw) for name, raw in values.items()}


def resolved_options(
    declared: Mapping[str, HostOption], values: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """What a variant process needs per requested option: the value, its argv pieces and env,
    and the proof pattern (or None). Raises OptionError for a value the host does not allow."""
    typed = validate_option_values(declared, values)
    resolved: dict[str, dict[str, Any]] = {}
    for name in sorted(typed):
        argv, env = declared[name].render(typed[name])
        option = declared[name]
        resolved[name] = {
            "value": typed[name],
            "argv": argv,
            "env": env,
            "proof": option.proof_pattern(typed[name]),
            # what the engine needs to judge the option at each context (coldbench.engine.judge)
            "stock": option.stock,
            "prefill_step": option.prefill_step,
            "proof_template": option.proof,
        }
    return resolved
