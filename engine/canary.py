"""The warm canary: one cell per run that is warm on purpose, so the run proves its cold check.

MLPerf audits its own rules with planted tests (TEST04 runs a deliberately cached pass). Here
one variant process of each run (the orchestrator sets `COLDBENCH_CANARY=1` for the first
process it starts) runs, after its warm-ups, one extra cell whose KV cache already holds the
first half of the cell's own prompt: what a wrong cache setting (a prefix cache left on, a
cache reused between cells) would leave behind. The cell is judged by the same rule as every
other (engine/judge.py); the cold check must call it invalid (`cached_tokens > 0`). The record
has round -2 (`CANARY_ROUND`), never enters statistics, and the evidence reports it as
`caught` or, when the judge passed it as cold, marks the whole run invalid: a cold check that
cannot see a warm cache on this host today proves nothing about the other cells.

`COLDBENCH_BLIND_COLD_CHECK=1` breaks the cold check on purpose (the cell reads the cache's
accounting as 0 tokens whatever it holds): the fault the canary exists to catch, used by the
tests that show a run with it marked invalid. No host sets it.

The canary's prompt is the warm-up prompt of the plan's smallest warmed context (its shape is
compiled already, so the canary costs one short prefill, and no measured cell uses it); an
adapter with `canary_tokens(context)` sizes its own (the openai-server adapter: at least 1024
tokens, so its timing can tell a held prompt from a cold one).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

CANARY_ENV = "COLDBENCH_CANARY"
BLIND_COLD_CHECK_ENV = "COLDBENCH_BLIND_COLD_CHECK"
CANARY_ROUND = -2
CANARY_ORDER = -1
CANARY_REASON = "warm canary (its prompt's first half was cached on purpose)"


def canary_requested() -> bool:
    return os.environ.get(CANARY_ENV) == "1"


def cold_check_blind() -> bool:
    """The planted fault: the cell's cold check reads 0 cached tokens whatever the cache holds."""
    return os.environ.get(BLIND_COLD_CHECK_ENV) == "1"


def canary_context(warmed: Sequence[int]) -> int:
    """The canary's context: the smallest warmed one (compiled already, the cheapest cell)."""
    return min(warmed)


def warm_cache(model: Any, make_cache: Callable[[Any], list[Any]], ids: Sequence[int]) -> list[Any]:
    """A fresh cache of `model` with the first half of `ids` prefilled into it (at least one
    token): the state a prefix cache would leave for a prompt sharing that prefix."""
    import mlx.core as mx  # here: the orchestrator imports this module's names, never mlx

    cache = make_cache(model)
    prefix = list(ids[: max(len(ids) // 2, 1)])
    model(mx.array(prefix, dtype=mx.int32)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache
