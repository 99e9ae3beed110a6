"""The flags the service checks at submit (evidence/spec/engine_flags.py) are the engine's own: the
same names, kinds, bounds and fast paths, and the same values refused."""

from __future__ import annotations

import importlib
from dataclasses import fields
from typing import Any, get_args

import pytest

from coldbench.engine.adapter_traits import ADAPTERS
from coldbench.engine.adapters.mlx_lm import SUPPORTED_FLAGS
from coldbench.engine.flags import MAX_PREFILL_STEP, Flags
from coldbench.evidence.contract.schemas import (
    ENGINE_ADAPTER,
    REPOSITORY_ADAPTER,
    SERVER_ADAPTERS,
    AdapterName,
    default_adapter,
)
from coldbench.evidence.spec import engine_flags
from coldbench.kernels import FAST_PATHS


def test_the_declared_flags_are_the_engines() -> None:
    kinds = {f.name: ("step" if f.type in (int, "int") else "bool") for f in fields(Flags)}
    assert kinds == engine_flags.EMBEDDED_FLAGS
    assert tuple(engine_flags.ADAPTER_FLAGS["mlx-lm"]) == SUPPORTED_FLAGS
    assert engine_flags.MAX_PREFILL_STEP == MAX_PREFILL_STEP
    assert tuple(FAST_PATHS) == engine_flags.FAST_PATH_FLAGS
    assert ADAPTERS["embedded"].flags == tuple(kinds)


def test_the_engines_adapter_table_is_the_contracts() -> None:
    """engine/adapter_traits.py and evidence's declarations name the same adapters, the same
    server adapters and the same flags; each adapter's module exists and offers `create`."""
    assert tuple(ADAPTERS) == get_args(AdapterName)
    assert {name for name, t in ADAPTERS.items() if t.starts_server} == SERVER_ADAPTERS
    # The one adapter of coldbench's own engine: a job without a repository runs it, and a
    # repository that declares it runs the checkout's engine/.
    assert {name for name, t in ADAPTERS.items() if t.runs_checkout_engine} == {ENGINE_ADAPTER}
    assert ADAPTERS[ENGINE_ADAPTER].target_module == "coldbench.engine"
    assert default_adapter(None) == ENGINE_ADAPTER
    assert default_adapter("a-repository") == REPOSITORY_ADAPTER
    assert not ADAPTERS[REPOSITORY_ADAPTER].starts_server
    assert {name: t.flags for name, t in ADAPTERS.items() if not t.starts_server} == {
        name: tuple(flags) for name, flags in engine_flags.ADAPTER_FLAGS.items()
    }
    assert all(not t.flags for t in ADAPTERS.values() if t.starts_server)
    for traits in ADAPTERS.values():
        assert callable(importlib.import_module(traits.module).create), traits


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("prefill_step_size", 64),
        ("prefill_step_size", "64"),
        ("prefill_step_size", 0),
        ("prefill_step_size", MAX_PREFILL_STEP + 1),
        ("prefill_step_size", True),
        ("prefill_step_size", 6.5),
        ("clear_cache", False),
        ("clear_cache", "off"),
        ("clear_cache", 1),
        ("clear_cache", 2),
        ("compile", "maybe"),
        ("fused_swiglu", 0.5),
    ],
)
def test_a_value_is_refused_by_both_or_by_neither(name: str, value: Any) -> None:
    kind = engine_flags.EMBEDDED_FLAGS[name]
    try:
        Flags.parse({name: value})
        engine_refuses = False
    except ValueError:
        engine_refuses = True
    assert (engine_flags.value_problem(name, kind, value) is not None) == engine_refuses
