"""What a message or file crossing a boundary may hold: only values the database, JSON and the
pages can hold, whoever sent them.

Every model of the data contract (`evidence/schemas.py`) and of the worker protocol
(`evidence/protocol.py`) derives from `Checked`, so the agent and the API refuse alike:

- text: no control character (NUL, CR, ESC, DEL, C1) and no line or paragraph separator, in
  any field, dict key or list item, nested or not; a field typed `Paragraph` (a reason, a
  server's log tail) may hold line breaks, tabs and terminal colour escapes;
- numbers: floats finite (JSON has no NaN or infinity; PostgreSQL's JSON refuses them),
  integers within 64 bits (PostgreSQL's BIGINT), `Int32` where a column is a 32-bit INTEGER;
- fields beyond the declared ones: refused (`extra="forbid"`), or, where a model lets a newer
  agent report more (`extra="allow"`), at most `MAX_EXTRA_FIELDS` of them, each named
  like an identifier and held to the same rules;
- JSON text: parsed by `strict_json_loads` (no `NaN`/`Infinity`, no number that overflows to
  infinity, no nesting deeper than the models read).

PostgreSQL stores JSON text as sent, but `->>` on a value with `\\u0000` fails every query that
reads it: one host's fingerprint made every submission fail until then. This module imports
nothing of coldbench.
"""

from __future__ import annotations

import functools
import json
import math
import re
import unicodedata
from typing import Annotated, Any, Final, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
MAX_EXTRA_FIELDS: Final = 32
# Nesting of a free-form value (a provenance's dicts in a manifest): deeper is refused.
MAX_DEPTH: Final = 16
EXTRA_FIELD_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def _not_below_int32(value: int) -> int:
    if value < INT32_MIN:
        raise ValueError(f"{value} is below the 32-bit range of its column ({INT32_MIN})")
    return value


# A field's own `Field(ge=...)` keeps its lower bound: two `ge` constraints on one field do not
# combine (the later wins), so the type's lower bound is a validator.
Int32 = Annotated[int, Field(le=INT32_MAX), AfterValidator(_not_below_int32)]


class _Multiline:
    """Marks a text field that may hold line breaks and tabs (`Paragraph`)."""


MULTILINE: Final = _Multiline()
# What a process's own words may hold (a reason, a server's log tail): line breaks, tabs and
# the escape of terminal colours. Shown, every one becomes a space (evidence/escaping.py).
_PARAGRAPH_CONTROLS: Final = frozenset("\n\r\t\x1b")
_SEPARATORS: Final = frozenset({"Zl", "Zp"})


def text_problem(text: str, *, multiline: bool = False) -> str | None:
    """What makes `text` unfit to store and show (None: nothing)."""
    if text.isprintable():
        return None
    for char in text:
        if char == " " or (multiline and char in _PARAGRAPH_CONTROLS):
            continue
        category = unicodedata.category(char)
        if category == "Cc" or category in _SEPARATORS:
            return f"holds the control character U+{ord(char):04X}"
    return None


def _single_line(text: str) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


# Text that may span lines (a reason with a server's log tail): no NUL, no control character
# but line breaks, tabs and ESC.
Paragraph = Annotated[str, MULTILINE]
# One line of text (checked also where it is not a field of a Checked model).
Text = Annotated[str, AfterValidator(_single_line)]


def value_problem(value: Any, *, multiline: bool = False, depth: int = 0) -> str | None:
    """What makes a validated value unfit for the database, JSON or a page (None: nothing):
    its text, numbers, dict keys and items, nested; models are checked by their own class."""
    if isinstance(value, str):
        return text_problem(value, multiline=multiline)
    if isinstance(value, bool) or value is None or isinstance(value, BaseModel):
        return None
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return f"the integer {value} is outside the 64-bit range"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, dict | list | tuple | set | frozenset):
        if depth >= MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
        for key, item in items:
            if isinstance(key, str) and (problem := text_problem(key)) is not None:
                return f"key {key[:40]!r} {problem}"
            problem = value_problem(item, multiline=multiline, depth=depth + 1)
            if problem is not None:
                return f"{key[:40]!r}: {problem}" if isinstance(key, str) else problem
    return None


class Checked(BaseModel):
    """A model whose every value `value_problem` accepts (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        problem = value_problem(value, multiline=_is_multiline(cls, info.field_name or ""))
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _bounded_extras(self) -> Checked:
        extra = self.__pydantic_extra__
        if not extra:
            return self
        if len(extra) > MAX_EXTRA_FIELDS:
            raise ValueError(
                f"{len(extra)} fields beyond the declared ones; at most {MAX_EXTRA_FIELDS}"
            )
        for name, value in extra.items():
            if not EXTRA_FIELD_NAME.fullmatch(name):
                raise ValueError(f"field name {name[:40]!r} is not a plain identifier")
            problem = value_problem(value, multiline=True)
            if problem is not None:
                raise ValueError(f"{name}: {problem}")
        return self


@functools.cache
def _is_multiline(model: type[BaseModel], name: str) -> bool:
    """Whether the field `name` of `model` is typed `Paragraph` (also inside `| None`)."""
    field = model.model_fields.get(name)
    return field is not None and (MULTILINE in field.metadata or _marked(field.annotation))


def _marked(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        base, *extras = get_args(annotation)
        return any(extra is MULTILINE for extra in extras) or _marked(base)
    return any(_marked(argument) for argument in get_args(annotation))


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is too large for a 64-bit float")
    return value


def strict_json_loads(raw: bytes | str) -> Any:
    """JSON as the standard defines it: `NaN`, `Infinity` and numbers that overflow a float
    (`1e999`) refused, as are integers too long to parse and nesting Python cannot recurse
    into. Every failure is a `json.JSONDecodeError` (a ValueError) with one line saying why."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", _document(raw), 0) from None
    except ValueError as error:
        # A refused constant or float, an integer beyond Python's digit limit, or bytes that
        # are not UTF-8.
        message = str(error).splitlines()[0]
        raise json.JSONDecodeError(message, _document(raw), 0) from None


def _document(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
