"""The engine flags each adapter takes, as the service and every front end check them at submit.

A job's flags run in a host's engine (engine/flags.py `Flags`, engine/adapters/mlx_lm.py
`SUPPORTED_FLAGS`), which refuses an unknown flag or a bad value when the variant starts. So
that a submitter hears it at once, not from a host minutes later, the same flags are declared
here (engine/ imports nothing of evidence/; tests/engine/test_flags_contract.py holds the two
equal) and `flag_problems` checks a spec against them: for the embedded engine installed on the
hosts and for the mlx-lm adapter. A server's flags are its host-declared options (checked
against the hosts' offers, api/hosts/matching.py); a job of the embedded adapter on refs of a
coldbench checkout runs that checkout's own engine, whose flags may differ: neither is checked
here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final, Literal

from coldbench.evidence.contract.schemas import (
    ENGINE_ADAPTER,
    JobSpec,
    SpecError,
    default_adapter,
)
from coldbench.evidence.contract.spec_text import FlagValue, parse_feature

FlagKind = Literal["step", "bool"]
# The widest chunk engine/flags.py accepts (its MAX_PREFILL_STEP).
MAX_PREFILL_STEP: Final = 1 << 20
EMBEDDED_FLAGS: Final[dict[str, FlagKind]] = {
    "prefill_step_size": "step",
    "clear_cache": "bool",
    "compile": "bool",
    "fused_swiglu": "bool",
    "fused_add_rms_norm": "bool",
}
# Flags that run the fast paths of kernels/: a compiled layer step would hide their dispatch
# counts.
FAST_PATH_FLAGS: Final = ("fused_swiglu", "fused_add_rms_norm")
ADAPTER_FLAGS: Final[dict[str, dict[str, FlagKind]]] = {
    "embedded": EMBEDDED_FLAGS,
    "mlx-lm": {"prefill_step_size": "step"},
}
_TRUE: Final = ("true", "1", "yes", "on")
_FALSE: Final = ("false", "0", "no", "off")


def value_problem(name: str, kind: FlagKind, value: FlagValue) -> str | None:
    """Why `name=value` is not a value of its kind (as engine/flags.py parses it), or None."""
    if kind == "step":
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and value.isdigit():
            number = int(value)
        if number is None or not 1 <= number <= MAX_PREFILL_STEP:
            return f"{name}={value}: give a chunk width from 1 to {MAX_PREFILL_STEP}"
        return None
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return None
    if isinstance(value, str) and value.lower() in (*_TRUE, *_FALSE):
        return None
    return f"{name}={value}: give true or false"


def _is_on(value: FlagValue) -> bool:
    return value is True or value == 1 or (isinstance(value, str) and value.lower() in _TRUE)


def flag_problems(spec: JobSpec | Mapping[str, Any]) -> list[SpecError]:
    """Every flag of the spec's variants and ablation features that its adapter does not take,
    or whose value it refuses, each located at its field. A payload not yet valid as a JobSpec
    is checked as far as its shape allows (so its other problems are reported with these)."""
    raw = spec.model_dump() if isinstance(spec, JobSpec) else spec
    adapter = raw.get("adapter") or default_adapter(raw.get("repository"))
    if (adapter == ENGINE_ADAPTER and raw.get("repository")) or adapter not in ADAPTER_FLAGS:
        return []  # a checkout's own engine, or a server: see the module docstring
    known = ADAPTER_FLAGS[adapter]
    offered = ", ".join(known)
    problems: list[SpecError] = []

    def check(field: str, flags: Mapping[str, Any]) -> None:
        for name, value in flags.items():
            kind = known.get(name)
            if kind is None:
                problems.append(
                    SpecError(field, f"the {adapter} adapter has no flag {name} ({offered})")
                )
                continue
            problem = value_problem(name, kind, value)
            if problem is not None:
                problems.append(SpecError(field, problem))

    features: dict[str, FlagValue] = {}
    for feature in raw.get("features") or []:
        if isinstance(feature, str):
            with contextlib.suppress(ValueError):  # a feature's own syntax is JobSpec's rule
                name, value = parse_feature(feature)
                features[name] = value
    variants = raw.get("variants")
    for index, variant in enumerate(variants if isinstance(variants, list) else []):
        flags = variant.get("flags") if isinstance(variant, Mapping) else None
        if not isinstance(flags, Mapping):
            continue
        check(f"variants.{index}.flags", flags)
        combined = {**flags, **(features if index == 0 else {})}
        fast = [flag for flag in FAST_PATH_FLAGS if _is_on(combined.get(flag, False))]
        if adapter == ENGINE_ADAPTER and fast and _is_on(combined.get("compile", False)):
            problems.append(
                SpecError(
                    f"variants.{index}.flags",
                    f"compile cannot be combined with {', '.join(fast)}: the compiled layer "
                    "step would hide the kernels' dispatch counts",
                )
            )
    check("features", features)
    return problems
