"""The one rule that judges a cell, for every adapter (embedded, mlx-lm, openai-server).

An adapter measures; this module decides `ok` or `invalid` and why. In order, the first failed
check gives the reason:

1. Cold: the cache's own accounting says it held 0 tokens before the prefill. Unknown
   (`cached_tokens` None) is invalid, never assumed 0.
2. Prompt length: the prompt has exactly the cell's N tokens.
3. Prefilled tokens: the engine prefilled exactly N (skipped where the adapter cannot see it,
   e.g. a server).
4. Decoded tokens: exactly the cell's decode count.
5. Execution, for each requested non-default flag or option (and each fast path that is on,
   also by an engine branch's default). The adapter states an
   `Expectation`: what the requested value implies at this context and what the stock value
   implies there (for chunking: the chunk widths the requested step gives for N tokens, and
   the widths the stock step gives), and an `Observation`: what its counters saw (the chunk
   widths really delivered, dispatch counts, a fallback reason, a backend that cannot run it).
   - `not exercised: <flag> (why)`: this backend cannot run the flag (invalid);
   - `fell back: <flag> (why)`: a fast path that recorded a `<flag>.fallback` reason ran its
     reference path, so the cell's time is not the fast path's time (invalid);
   - the request implies exactly what stock implies at this context: `ok`, and the flag is
     listed as inert (a step wider than the prompt that the stock step also takes in one
     chunk; `clear_cache=false` when there is a single chunk, so nothing to keep between
     chunks). The measurement is the stock configuration's, and summaries say so per context;
   - the observation matches the request: `ok`;
   - anything else (the observation matches stock, or neither): `silent no-op: <flag>`.

An expectation is compared by equality, or by `AtLeast(n)` for counts (a fast path must
dispatch at least once; a server option's proof line must match at least once).

The verdict goes into the record as `status` and `reason`; the inert flags go into
`counters["inert"]` (comma-separated names, absent when none), which keeps record/1 as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.record import Measurement

# A run of chunk widths: (width, how many consecutive chunks had it), in prefill order.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AtLeast:
    """An expected count that any value from `count` up satisfies."""

    count: int

    def __str__(self) -> str:
        return f">={self.count}"


@dataclass(frozen=True)
class Expectation:
    """What a requested flag value implies at this cell's context, and what stock implies."""

    flag: str
    requested: Any
    stock: Any

    @property
    def inert(self) -> bool:
        return self.requested == self.stock


@dataclass(frozen=True)
class Observation:
    """What the adapter's counters saw for the flag during the cell."""

    flag: str
    observed: Any
    fallback: str | None = None
    not_exercised: str | None = None


@dataclass(frozen=True)
class Judgement:
    status: Literal["ok", "invalid"]
    reason: str | None
    inert: tuple[str, ...] = ()

    def record(self, result: Measurement) -> None:
        """Write the verdict into an adapter's measurement (status, reason, counters["inert"])."""
        result.status, result.reason = self.status, self.reason
        if self.inert:
            result.counters["inert"] = ",".join(self.inert)


def matches(expected: Any, observed: Any) -> bool:
    if isinstance(expected, AtLeast):
        return isinstance(observed, int) and observed >= expected.count
    return bool(expected == observed)


def judge_cell(
    *,
    context_tokens: int,
    decode_tokens: int,
    cached_tokens: int | None,
    prompt_tokens: int | None,
    prefilled_tokens: int | None,
    decoded_tokens: int | None,
    execution: Sequence[tuple[Expectation, Observation]] = (),
    prefill_observed: bool = True,
    cache: str = "the engine's KV cache",
    reuse: str = "the KV cache was not fresh",
) -> Judgement:
    """The verdict on one measured cell (see the module docstring for the rule).

    `prefill_observed=False` is for adapters that cannot count prefilled tokens (a server);
    `cache` names what reports the cached count and `reuse` says what a count above 0 means,
    in the adapter's words.
    """
    if cached_tokens is None:
        return Judgement(
            "invalid", f"{cache} does not report cached tokens (cached_tokens unknown)"
        )
    if cached_tokens > 0:
        return Judgement("invalid", f"cached_tokens={cached_tokens}: {reuse}")
    if prompt_tokens != context_tokens:
        return Judgement(
            "invalid", f"prompt has {prompt_tokens} tokens, the cell asks for {context_tokens}"
        )
    if prefill_observed and prefilled_tokens != context_tokens:
        return Judgement(
            "invalid", f"the engine prefilled {prefilled_tokens} tokens of {context_tokens}"
        )
    if decoded_tokens != decode_tokens:
        return Judgement("invalid", f"decoded {decoded_tokens} tokens of {decode_tokens}")
    inert: list[str] = []
    for expectation, observation in execution:
        flag = expectation.flag
        if observation.flag != flag:
            raise ValueError(f"observation of {observation.flag!r} paired with {flag!r}")
        if observation.not_exercised:
            return Judgement("invalid", f"not exercised: {flag} ({observation.not_exercised})")
        if observation.fallback:
            why = observation.fallback.removeprefix(f"{flag}: ")
            return Judgement("invalid", f"fell back: {flag} ({why})")
        if expectation.inert:
            inert.append(flag)
        elif not matches(expectation.requested, observation.observed):
            return Judgement("invalid", f"silent no-op: {flag}")
    return Judgement("ok", None, tuple(inert))


# -- chunk widths ---------------------------------------------------------------------------


def split_runs(tokens: int, step: int) -> Runs:
    """Widths of `tokens` cut into chunks of `step` with the remainder last, as runs."""
    if tokens <= 0:
        return ()
    full, rest = divmod(tokens, step)
    runs = [(step, full)] if full else []
    if rest:
        runs.append((rest, 1))
    return tuple(runs)


def to_runs(widths: Iterable[int]) -> Runs:
    """Consecutive equal widths merged: [64, 64, 64, 1] -> ((64, 3), (1, 1))."""
    runs: list[tuple[int, int]] = []
    for width in widths:
        if runs and runs[-1][0] == width:
            runs[-1] = (width, runs[-1][1] + 1)
        else:
            runs.append((width, 1))
    return tuple(runs)


def join_runs(*parts: Runs) -> Runs:
    """Runs one after the other, adjacent equal widths merged."""
    joined: list[tuple[int, int]] = []
    for width, count in (run for runs in parts for run in runs):
        if joined and joined[-1][0] == width:
            joined[-1] = (width, joined[-1][1] + count)
        else:
            joined.append((width, count))
    return tuple(joined)


def runs_text(runs: Runs) -> str:
    """A counter's text for chunk widths: `64x3+1` (width x count, in order)."""
    return "+".join(f"{width}x{count}" if count > 1 else str(width) for width, count in runs)


def chunk_count(runs: Runs) -> int:
    return sum(count for _, count in runs)
