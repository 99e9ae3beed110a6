"""The adapters' traits: one table of what each adapter is, which the rest of the engine and the
worker read (the registry of engine/adapters/, the mlx-lm adapter's flags, worker.toml's
adapters and their default modules, which adapters start a server).

The service's side of the contract (evidence/contract/schemas.py `AdapterName` and
`SERVER_ADAPTERS`, evidence/spec/engine_flags.py `ADAPTER_FLAGS`) is declared there, since evidence/
imports nothing of engine/ and engine/ nothing of evidence/; tests/engine/test_flags_contract.py
holds the two equal.

May import: the standard library only (the worker reads it without importing an adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class AdapterTraits:
    """`module`: the adapter's module (`create(plan)`); `target_module`: the engine module of
    the target whose import path a build checks (a repository may name another); `flags`: the
    engine flags it takes (a server takes none: its host declares options instead);
    `runs_checkout_engine`: a repository's variants run the checkout's own engine/ (a tree of
    coldbench, put first on the path), not the orchestrator's."""

    name: str
    starts_server: bool
    runs_checkout_engine: bool
    module: str
    target_module: str
    flags: tuple[str, ...]


# The embedded engine's flags are the fields of engine/flags.py `Flags`.
EMBEDDED_FLAGS: Final = (
    "prefill_step_size",
    "clear_cache",
    "compile",
    "fused_swiglu",
    "fused_add_rms_norm",
)
ADAPTERS: Final[dict[str, AdapterTraits]] = {
    traits.name: traits
    for traits in (
        AdapterTraits(
            "embedded",
            starts_server=False,
            runs_checkout_engine=True,
            module="coldbench.engine.adapters.embedded",
            target_module="coldbench.engine",
            flags=EMBEDDED_FLAGS,
        ),
        AdapterTraits(
            "mlx-lm",
            starts_server=False,
            runs_checkout_engine=False,
            module="coldbench.engine.adapters.mlx_lm",
            target_module="mlx_lm",
            flags=("prefill_step_size",),
        ),
        AdapterTraits(
            "openai-server",
            starts_server=True,
            runs_checkout_engine=False,
            module="coldbench.engine.adapters.openai_server",
            target_module="mlx_lm",
            flags=(),
        ),
    )
}


def runs_checkout_engine(adapter: str) -> bool:
    """Whether `adapter`'s variants run the checkout's own engine/ (False for a name it does not
    know)."""
    traits = ADAPTERS.get(adapter)
    return traits is not None and traits.runs_checkout_engine


def starts_server(adapter: str) -> bool:
    """Whether `adapter` measures a server it starts (False for a name it does not know)."""
    traits = ADAPTERS.get(adapter)
    return traits is not None and traits.starts_server
