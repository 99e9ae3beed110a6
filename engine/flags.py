"""Engine flags of the embedded adapter: real prefill choices, each with a reference path.

- `prefill_step_size` (int, default 2048): width of the prefill chunks.
- `clear_cache` (bool, default true): stock mlx-lm empties MLX's buffer cache after every
  chunk; `false` keeps the buffers for the next chunk.
- `compile` (bool, default false): the per-layer MLP half runs through `mx.compile`.

Counters (`engine.cell`): `<flag>.dispatched` counts how often the flag's non-default path ran
(`prefill_step_size`: chunks exactly that wide; `chunk_widths` lists them all). What each
non-default value implies at a context, and whether the cell delivered it, is judged by
`engine.judge` (`ok`, `ok` with the flag inert, `silent no-op: <flag>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

MAX_PREFILL_STEP = 1 << 20


@dataclass(frozen=True)
class Flags:
    prefill_step_size: int = 2048
    clear_cache: bool = True
    compile: bool = False

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None) -> Flags:
        """Flags from a plan's JSON (typed values) or command-line strings; ValueError with
        one line naming the flag for an unknown name or a bad value."""
        known = {f.name: f for f in fields(cls)}
        parsed: dict[str, Any] = {}
        for name, value in (values or {}).items():
            if name not in known:
                raise ValueError(f"unknown engine flag {name!r}; known: {', '.join(sorted(known))}")
            if name == "prefill_step_size":
                parsed[name] = _positive_int(name, value)
            else:
                parsed[name] = _boolean(name, value)
        return cls(**parsed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def non_default(self) -> dict[str, Any]:
        default = Flags()
        return {k: v for k, v in asdict(self).items() if getattr(default, k) != v}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"flag {name}={value!r}: expected a positive integer")
    try:
        number = int(value) if isinstance(value, int | str) else None
    except ValueError:
        number = None
    if number is None or not 1 <= number <= MAX_PREFILL_STEP:
        raise ValueError(f"flag {name}={value!r}: expected an integer from 1 to {MAX_PREFILL_STEP}")
    return number


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"flag {name}={value!r}: expected true or false")
