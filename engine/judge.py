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
   also by an engine branch's default). The adapter states an `Expectation`: what the
   requested value implies at this context and what the stock value implies there, and an
   `Observation`: what its counters saw (the chunk widths really delivered, dispatch counts,
   proof lines, a fallback reason, a backend that cannot run it).
   - `not exercised: <flag> (why)`: this backend cannot run the flag (invalid);
   - `fell back: <flag> (why)`: a fast path that recorded a `<flag>.fallback` reason ran its
     reference path, so the cell's time is not the fast path's time (invalid);
   - the request implies exactly what stock implies at this context: `ok`, and the flag is
     listed as inert (a step wider than the prompt that the stock step also takes in one
     chunk; `clear_cache=false` when there is a single chunk, so nothing to keep between
     chunks; a server option set to the server's own default). The measurement is the stock
     configuration's, and summaries say so per context;
   - `not provable: <flag> (why)`: the only evidence the adapter has for the flag is a line
     stock also prints at this context (invalid: neither ran nor not-ran can be shown);
   - the observation matches the request: `ok`;
   - the observation is what stock does (and not what the request implies): `silent no-op:
     <flag>`, the cell provably did stock's work;
   - neither: `not as requested: <flag> (...)` with what was implied and what was observed.
     Something ran that is neither the request nor stock (a branch that caps chunks at 32
     when asked for 64): the cell is invalid, but it is not called a no-op.

Chunk widths are judged by what a step implies, not by one loop's exact cut: `ChunksOf(step)`
admits every layout that cuts N tokens into chunks of `step` whatever its remainder policy (the
remainder last, first, merged with the first output's token, or the last token alone: the
layouts mlx-lm has shipped and this engine's cell). Other expectations are compared by
equality, or by `AtLeast(n)` for counts (a fast path must dispatch at least once; a server
option's proof line must match at least once).

The verdict goes into the record as `status` and `reason`; the inert flags go into
`counters["inert"]` (comma-separated names, absent when none), which keeps record/1 as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coldbench.engine.record import Measurement

# A run of chunk widths: (width, how many consecutive chunks had it), in prefill order.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AtLeast:
    """An expected count that any value from `count` up satisfies."""

    count: int

    def __str__(self) -> str:
        return f">={self.count}"


@dataclass(frozen=True)
class ChunksOf:
    """The chunk widths a prefill step implies for a prompt, whatever the remainder policy.

    `layout` is the cut of the adapter's own stock loop with this step (used to tell whether
    two steps imply the same work here: inert); `admits` accepts any layout of the same tokens
    in which every chunk is at most `step` wide and, a final one-token chunk aside (the step
    that yields the first output), at most one chunk is narrower than `step` (the remainder,
    wherever it goes)."""

    step: int
    layout: Runs

    def admits(self, observed: Any) -> bool:
        if not isinstance(observed, tuple) or sum(w * c for w, c in observed) != sum(
            w * c for w, c in self.layout
        ):
            return False
        widths = [width for width, count in observed for _ in range(count)]
        if not widths or any(not 1 <= width <= self.step for width in widths):
            return False
        if len(widths) > 1 and widths[-1] == 1:
            widths.pop()
        return sum(1 for width in widths if width < self.step) <= 1

    def __str__(self) -> str:
        return f"chunks of {self.step}"


@dataclass(frozen=True)
class Expectation:
    """What a requested flag value implies at this cell's context, and what stock implies.

    `same_as_stock` says whether the two imply the same work when that is not what is compared
    (a server option proven by a log line, whose request may still imply stock's work here);
    by default requested and stock are compared (chunk steps by their layouts)."""

    flag: str
    requested: Any
    stock: Any
    same_as_stock: bool | None = None

    @property
    def inert(self) -> bool:
        if self.same_as_stock is not None:
            return self.same_as_stock
        if isinstance(self.requested, ChunksOf) and isinstance(self.stock, ChunksOf):
            return self.requested.layout == self.stock.layout
        return bool(self.requested == self.stock)


@dataclass(frozen=True)
class Observation:
    """What the adapter's counters saw for the flag during the cell."""

    flag: str
    observed: Any
    fallback: str | None = None
    not_exercised: str | None = None
    # Why the observation cannot tell the request from stock at this context.
    unprovable: str | None = None


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
    if isinstance(expected, ChunksOf):
        return expected.admits(observed)
    return bool(expected == observed)


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(run, tuple) for run in value):
        return runs_text(value) or "none"
    return str(value)


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
            continue
        if observation.unprovable:
            return Judgement("invalid", f"not provable: {flag} ({observation.unprovable})")
        if matches(expectation.requested, observation.observed):
            continue
        if matches(expectation.stock, observation.observed):
            return Judgement("invalid", f"silent no-op: {flag}")
        return Judgement(
            "invalid",
            f"not as requested: {flag} (the request implies {_shown(expectation.requested)}, "
            f"stock {_shown(expectation.stock)}; observed {_shown(observation.observed)})",
        )
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


def generate_step_widths(prompt_tokens: int, step: int) -> Runs:
    """Chunk widths stock mlx-lm's generate_step (and mlx_lm.server) delivers for N tokens:
    N-1 tokens cut into chunks of `step` (remainder last), then the last token alone, which
    yields the first output."""
    return join_runs(split_runs(prompt_tokens - 1, step), ((1, 1),))
