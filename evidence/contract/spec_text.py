"""The text a person types for a job spec's fields, parsed in one place.

`coldbench run`, `coldbench submit` and the web form all read variants, contexts, flags and
features through these functions, so `4K` means the same everywhere and a typo gets the same
message everywhere. Below `schemas.py` (it imports nothing of this package): the results are
plain values and dicts that `JobSpec` and `VariantSpec` then validate.

- a flag value: `true`/`false` (any case), then an int, then a float, else the text itself;
- flags: `prefill_step_size=256, clear_cache=false` (commas or new lines between);
- a variant: `NAME[:key=value[,key=value...]]`, where `ref` and `recipe` pick the target and
  every other key is a flag;
- a context: `128`, `4K`/`4k` (x 1024) or `1M`/`1m` (x 1024 x 1024); contexts: `128,256` or
  `4K 16K` (commas and/or spaces);
- features: `compile, clear_cache=false` (commas and/or spaces); one feature is `flag`
  (meaning `flag=true`) or `flag=value`, the value that turns the optimization on.

Flags are printed back the way they are typed (`flag_text`, `flags_text`): `clear_cache=false`,
never Python's `False`, on every page, in every Markdown and report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

FlagValue = int | float | bool | str
FLAG_NAME_PATTERN: Final = r"^[a-z][a-z0-9_]{0,63}$"
# The keys of a variant's text that pick its target rather than set an engine flag.
TARGET_KEYS: Final = ("ref", "recipe")
CONTEXT_UNITS: Final = {"": 1, "k": 1024, "m": 1024 * 1024}
_CONTEXT = re.compile(r"^(\d+)\s*([kKmM]?)$")
_LIST_SEPARATORS = re.compile(r"[,\s]+")


def parse_flag_value(text: str) -> FlagValue:
    """`true`/`false` (any case) -> bool, then int, then float, else the string itself."""
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def flag_value_text(value: object) -> str:
    """A flag value as a person types it (what `parse_flag_value` reads back): `true`/`false`,
    `256`, `0.5`, the text itself."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flag_text(name: str, value: object) -> str:
    """`clear_cache=false`."""
    return f"{name}={flag_value_text(value)}"


def flags_text(flags: Mapping[str, object], *, empty: str = "") -> str:
    """`clear_cache=false, prefill_step_size=256` (sorted by name; `empty` for no flags): what
    `parse_flags` reads back."""
    return ", ".join(flag_text(name, value) for name, value in sorted(flags.items())) or empty


def parse_feature(feature: str) -> tuple[str, FlagValue]:
    """`compile` -> ("compile", True); `prefill_step_size=4096` -> ("prefill_step_size", 4096)."""
    flag, sep, value = feature.partition("=")
    if not flag:
        raise ValueError(f"feature {feature!r} has no flag name")
    return flag, parse_flag_value(value) if sep else True


def split_list(text: str) -> list[str]:
    """`a, b c` -> ["a", "b", "c"]: the separators of every list field."""
    return [part for part in _LIST_SEPARATORS.split(text.strip()) if part]


def parse_features(text: str) -> list[str]:
    return split_list(text)


def parse_context(text: str) -> int:
    """`4096`, `4K`, `16k`, `1M` -> tokens (K = 1024, M = 1024 * 1024)."""
    match = _CONTEXT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text.strip()!r} is not a token count (e.g. 512, 4096, 4K or 1M)")
    value = int(match.group(1)) * CONTEXT_UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text.strip()!r}: a context needs at least 1 token")
    return value


def parse_contexts(text: str) -> list[int]:
    """`128,256` or `4K 16K` -> token counts; ValueError naming the first bad item."""
    items = split_list(text)
    if not items:
        raise ValueError("give at least one context length, e.g. 128,256 or 4K")
    return [parse_context(item) for item in items]


def parse_flags(text: str) -> dict[str, FlagValue]:
    """`prefill_step_size=256, clear_cache=false` -> {"prefill_step_size": 256, ...}."""
    flags: dict[str, FlagValue] = {}
    for item in filter(None, (part.strip() for part in re.split(r"[,\n]", text))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not value:
            raise ValueError(f"{item!r}: write flags as name=value, e.g. clear_cache=false")
        if not re.fullmatch(FLAG_NAME_PATTERN, key):
            raise ValueError(f"{key!r} is not a flag name (lowercase letters, digits, _)")
        if key in flags:
            raise ValueError(f"{key} given twice")
        flags[key] = parse_flag_value(value)
    return flags


def parse_variant(text: str) -> dict[str, Any]:
    """`NAME[:key=value,...]` -> VariantSpec fields; `ref` and `recipe` are target keys."""
    name, _, rest = text.partition(":")
    fields: dict[str, Any] = {"name": name, "flags": {}}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"expected key=value, got {item!r}")
        if key in TARGET_KEYS:
            fields[key] = value
        elif key in fields["flags"]:
            raise ValueError(f"{key} given twice")
        else:
            fields["flags"][key] = parse_flag_value(value)
    return fields
