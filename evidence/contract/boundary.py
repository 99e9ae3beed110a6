"""What a message or file crossing a boundary may hold: only values the database, JSON and the
pages can hold, whoever sent them.

Every model of the data contract (`evidence/contract/schemas.py`) and of the worker protocol
(`evidence/contract/protocol.py`) derives from `Checked`, so the agent and the API refuse alike:

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

The door (`door_check_json`, `door_text_problem`): whatever a service receives, before any
schema reads it, is text PostgreSQL's `text` and `jsonb` accept: UTF-8 (a byte that is not is
refused with its position), no NUL (`text` cannot hold it, `jsonb` refuses `\\u0000`), no lone
surrogate (`"\\ud800"` parses into a Python str no UTF-8 encoder accepts: the driver fails the
statement, or a later read of the stored JSON fails), no string longer than
`MAX_DOOR_TEXT_CHARS`. A refusal is a `TextRefused` naming the field (`fingerprint.chip`,
`variants.1.flags.kv_bits`). The API applies it to every request, whatever its route
(`api/routing.py: DoorMiddleware`), the admin commands to every argument (`api/cli.py`),
uploads of JSON files to every line (`Utf8Lines`, `api/artifacts/store.py`); `Checked`
models refuse lone surrogates too, wherever they parse.

PostgreSQL stores JSON text as sent, but `->>` on a value with `\\u0000` fails every query that
reads it: one host's fingerprint made every submission fail until then. This module imports
nothing of coldbench.
"""

from __future__ import annotations

import codecs
import functools
import json
import math
import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Final, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
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


# Integers within a 32-bit INTEGER or 64-bit BIGINT column. A field with a lower bound of its
# own writes `Field(ge=..., le=INT32_MAX)` on `int` instead: two `ge` constraints on one field
# do not combine (the later wins), so `Int32 = Field(ge=1)` would accept 0.
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


class _Multiline:
    """Marks a text field that may hold line breaks and tabs (`Paragraph`)."""


MULTILINE: Final = _Multiline()
# What a process's own words may hold (a reason, a server's log tail): line breaks, tabs and
# the escape of terminal colours. Shown, every one becomes a space (evidence/rendering/escaping.py).
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
        if category == "Cs":
            return f"holds the lone surrogate U+{ord(char):04X} (not UTF-8)"
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
    kind = type(value)
    if kind is str:
        return None if value.isprintable() else text_problem(value, multiline=multiline)
    if value is None or kind is bool:
        return None
    if kind is int:
        if INT64_MIN <= value <= INT64_MAX:
            return None
        return f"the integer {value} is outside the 64-bit range"
    if kind is float:
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, dict | list | tuple | set | frozenset):
        if depth >= MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
        for key, item in items:
            if type(key) is str and (problem := text_problem(key)) is not None:
                return f"key {key[:40]!r} {problem}"
            problem = value_problem(item, multiline=multiline, depth=depth + 1)
            if problem is not None:
                return f"{key[:40]!r}: {problem}" if type(key) is str else problem
        return None
    # A subclass (an enum member, a numpy scalar): checked as the plain value it holds.
    if isinstance(value, str):
        return value_problem(str(value), multiline=multiline)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value_problem(float(value) if isinstance(value, float) else int(value))
    return None


class Checked(BaseModel):
    """A model whose every value `value_problem` accepts (see the module docstring).

    Floats are held finite by pydantic itself (`allow_inf_nan=False`, also inside unions,
    lists and dicts); text is checked once per model, in one pass over the fields that can
    hold text nothing else constrains (`_text_fields`: not a pattern-checked string, a
    Literal, a number, a time or a nested model), so a record of 27 fields costs four
    checks, most of them `str.isprintable`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="after")
    def _storable(self) -> Checked:
        values = self.__dict__
        for name, multiline in _text_fields(type(self)):
            value = values[name]
            if value is None or (type(value) is str and value.isprintable()):
                continue
            problem = value_problem(value, multiline=multiline)
            if problem is not None:
                raise ValueError(f"{name}: {problem}")
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
def _text_fields(model: type[BaseModel]) -> tuple[tuple[str, bool], ...]:
    """(name, may span lines) of each field of `model` that `Checked` checks."""
    return tuple(
        (name, MULTILINE in field.metadata or _marked(field.annotation))
        for name, field in model.model_fields.items()
        if _may_hold_text(field.annotation, field.metadata)
    )


def _marked(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        base, *extras = get_args(annotation)
        return any(extra is MULTILINE for extra in extras) or _marked(base)
    return any(_marked(argument) for argument in get_args(annotation))


_UNCHECKED_TYPES: Final = (bool, int, float, datetime, type(None))


def _may_hold_text(annotation: Any, metadata: Sequence[Any] = ()) -> bool:
    """Whether a value of `annotation` may hold text no pattern constrains, or an integer
    past 64 bits (a free-form JSON value)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extras = get_args(annotation)
        return _may_hold_text(base, [*metadata, *extras])
    if annotation is str:
        return not any(_pattern_of(item) for item in metadata)
    if annotation in _UNCHECKED_TYPES or origin is Literal:
        return False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel | Enum):
        return False  # a nested model checks itself; an enum's values are its own
    arguments = get_args(annotation)
    if origin is dict:
        return True  # its keys are text
    if arguments and origin is not None:
        return any(_may_hold_text(argument) for argument in arguments)
    return True  # Any, or a type this rule does not know: checked


def _pattern_of(item: Any) -> str | None:
    found = getattr(item, "pattern", None)
    if found:
        return str(found)
    return next((str(p) for m in getattr(item, "metadata", ()) if (p := _pattern_of(m))), None)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


# An exponent of three digits or more: what a float can overflow with (a mantissa of over 308
# digits without one still reads as infinity here: `Checked` models refuse it).
_HUGE_TEXT: Final = re.compile(r"[eE][+-]?\d{3}")
_HUGE_BYTES: Final = re.compile(_HUGE_TEXT.pattern.encode())


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is too large for a 64-bit float")
    return value


def strict_json_loads(raw: bytes | str) -> Any:
    """JSON as the standard defines it: `NaN`, `Infinity` and numbers that overflow a float
    (`1e999`) refused, as are integers too long to parse and nesting Python cannot recurse
    into. Every failure is a `json.JSONDecodeError` (a ValueError) with one line saying why."""
    # The usual document has no long exponent and keeps the C parser's own float conversion.
    if isinstance(raw, bytes):
        might_overflow = _HUGE_BYTES.search(raw) is not None
    else:
        might_overflow = _HUGE_TEXT.search(raw) is not None
    parse_float = _finite_float if might_overflow else None
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=parse_float)
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


# --- the door: text every service receives ------------------------------------------------------

# The longest string a request may hold anywhere (a reason with a server's log tail is at most
# 4,000 characters; request bodies are at most 1 MiB, `Settings.max_request_body_bytes`).
MAX_DOOR_TEXT_CHARS: Final = 65_536


class TextRefused(ValueError):
    """Text the door refuses: `field` names where (a dotted JSON path, `body`, `header
    x-name`, `argument 2`), `problem` says what, in a few words."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def door_text_problem(text: str) -> str | None:
    """What PostgreSQL's `text` and `jsonb` cannot hold in `text` (None: nothing): NUL, a lone
    surrogate, more than `MAX_DOOR_TEXT_CHARS` characters."""
    if len(text) > MAX_DOOR_TEXT_CHARS:
        return f"longer than {MAX_DOOR_TEXT_CHARS} characters"
    if "\x00" in text:
        return "holds NUL (U+0000)"
    try:
        text.encode("utf-8")  # fails on a lone surrogate, and only on one
    except UnicodeEncodeError as error:
        return f"holds the lone surrogate U+{ord(text[error.start]):04X} (not UTF-8)"
    return None


def document_problem(value: Any, path: str = "") -> tuple[str, str] | None:
    """(field, problem) of the first text of a parsed JSON document, key or value, nested,
    that `door_text_problem` refuses; None when there is none. A field is the dotted path
    (`variants.1.flags`), `body` for the document itself."""
    if isinstance(value, str):
        problem = door_text_problem(value)
        return None if problem is None else (path or "body", problem)
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            problem = door_text_problem(key)
            if problem is not None:
                # The key itself cannot be shown as it is: name it by its first characters.
                return (path or "body", f"a key {problem}")
            found = document_problem(item, where)
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = document_problem(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


# What a JSON text that holds NUL or a surrogate must contain: their escapes (a raw NUL is not
# JSON; a raw surrogate is not UTF-8). A valid pair escaped (`\\ud83d\\ude00`) matches too
# and is then found whole by the walk.
_SUSPECT_ESCAPE: Final = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def door_check_json(raw: bytes | str, *, what: str = "body") -> None:
    """The door's rule on a JSON text before anything parses it: `raw` strict UTF-8
    (`TextRefused` naming the byte's position), and every string of the document held to
    `door_text_problem` (`TextRefused` naming its path). The document is parsed only where a
    string could be refused (an escape of NUL or a surrogate, or a text longer than one
    string may be), so a lease's body costs a UTF-8 check and one regular-expression search;
    malformed JSON is left to the parser that reads it, with its own message."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TextRefused(
                what, f"byte {error.start} (0x{raw[error.start]:02x}) is not UTF-8"
            ) from None
    else:
        text = raw
    if len(text) <= MAX_DOOR_TEXT_CHARS and _SUSPECT_ESCAPE.search(text) is None:
        return
    try:
        value = strict_json_loads(text)
    except ValueError:
        return
    found = document_problem(value)
    if found is not None:
        field, problem = found
        raise TextRefused(field if what == "body" else f"{what}: {field}", problem)


def door_json_loads(raw: bytes | str, *, what: str = "body") -> Any:
    """`strict_json_loads` of a JSON text the door accepts (`door_check_json`): for a reader
    of JSON from outside that no request door stands before (a file, a message)."""
    door_check_json(raw, what=what)
    return strict_json_loads(raw)


class Utf8Lines:
    """The door's rule on a JSON file arriving in chunks (an upload of `records.jsonl`): UTF-8
    throughout and no NUL byte, refused at the first that is not with its line number
    (`TextRefused(name, "line 3: byte 0xff is not UTF-8")`), so a file is never accepted and
    its records dropped later. JSON must be UTF-8 (RFC 8259) and holds no raw NUL; what a line
    holds beyond that (its JSON, its schema) is the reader's, line by line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._newlines = 0

    def _refuse(self, data: bytes, index: int, problem: str) -> TextRefused:
        line = self._newlines + data.count(b"\n", 0, index) + 1
        return TextRefused(self.name, f"line {line}: {problem}")

    def feed(self, chunk: bytes) -> None:
        nul = chunk.find(b"\x00")
        if nul >= 0:
            raise self._refuse(chunk, nul, "holds a NUL byte")
        buffered = self._decoder.getstate()[0]
        try:
            self._decoder.decode(chunk)
        except UnicodeDecodeError as error:
            data = buffered + chunk
            raise self._refuse(
                data, error.start, f"byte 0x{data[error.start]:02x} is not UTF-8"
            ) from None
        self._newlines += chunk.count(b"\n")

    def close(self) -> None:
        """The end of the file: a character cut short there is refused too."""
        buffered = self._decoder.getstate()[0]
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise self._refuse(
                buffered, 0, f"ends inside a character (byte 0x{buffered[0]:02x})"
            ) from None
