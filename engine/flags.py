"""Engine flags of the embedded adapter: real prefill choices, each with a reference path.

- `prefill_step_size` (int, default 2048): width of the prefill chunks.
- `clear_cache` (bool, default true): stock mlx-lm empties MLX's buffer cache after every
  chunk; `false` keeps the buffers for the next chunk.
- `compile` (bool, default false): the per-layer MLP half runs through `mx.compile`.
- `fused_swiglu` (bool, default false): the MLPs' `silu(gate) * up` runs through
  `coldbench.kernels.swiglu` (one Metal/CUDA kernel) where its gate allows, else its reference.
- `fused_add_rms_norm` (bool, default false): each residual add and the RMSNorm after it run
  through `coldbench.kernels.add_rms_norm` (one kernel per row) where its gate allows.

The fast-path flags (`coldbench.kernels.FAST_PATHS`) cannot be combined with `compile`: a compiled
layer step runs its Python once per shape, so it could not count the kernels' dispatches.
`COLDBENCH_DISABLE_KERNELS=name,name` (or `all`) sends requested fast paths to their reference
paths, which the cell records as `<flag>.fallback` (the cell is then `fell back: <flag>`).

Counters (`coldbench.engine.cell`): `<flag>.dispatched` counts how often the flag's non-default path
ran (`prefill_step_size`: chunks exactly that wide; `chunk_widths` lists them all). What each
non-default value implies at a context, and whether the cell delivered it, is judged by
`coldbench.engine.judge` (`ok`, `ok` with the flag inert, `silent no-op: <flag>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from coldbench.kernels import FAST_PATHS

MAX_PREFILL_STEP = 1 << 20


@dataclass(frozen=True)
class Flags:
    prefill_step_size: int = 2048
    clear_cache: bool = True
    compile: bool = False
    fused_swiglu: bool = False
    fused_add_rms_norm: bool = False

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
        flags = cls(**parsed)
        if flags.compile and flags.fast_paths():
            raise ValueError(
                f"flag compile cannot be combined with {', '.join(flags.fast_paths())}: the "
                "compiled layer step would hide the kernels' dispatch counts"
            )
        return flags

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fast_paths(self) -> list[str]:
        """The requested fast paths of kernels/ (flags named like them, set to true)."""
        return [name for name in FAST_PATHS if getattr(self, name)]

    def non_default(self) -> dict[str, Any]:
        default = Flags()
        return {k: v for k, v in asdict(self).items() if getattr(default, k) != v}

    def judged(self) -> list[str]:
        """The flags whose execution a cell must prove: every non-default one, and every fast
        path that is on, by request or by this engine's default (a branch that turns a kernel
        on claims it runs, so a fallback must not be timed as the kernel)."""
        return list(dict.fromkeys([*self.non_default(), *self.fast_paths()]))


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
