"""The warm canary's section of summary.json: did each run's cold check catch a cell that was
warm on purpose (engine/canary.py)?

A canary record has round -2 and the status the cell judge gave it: `invalid` with a reason
about cached tokens is the canary caught; `ok` is the canary judged cold, so the run's cold
check could not see a warm cache and none of its cells is shown cold: the evidence is invalid.
A canary with status `error` proved nothing either way (a caveat). A run without a canary
beside runs that have one is listed as `missing`; evidence whose runs have none at all (bundles
from before the canary) gets no section.

The openai-server adapter's canary is a repeat of a prompt the server was sent, timed against
cold twins (engine/adapters/openai_server.py): its record says `canary.warm_by_timing`. Judged
cold while warm by its timing is `passed` (the server's count is blind, its reason says so);
judged cold and not warm by timing is `unwarmed`: the server keeps no prompt cache, so its
cells are cold by its setting, but the count's sight of a cache is unproven (a caveat). Judged
cold where the timing could not tell (`canary.timing_could_tell` false: the cold twin
prefilled faster than the adapter can time apart from a held prompt's repeat) is `unverified`:
a count that saw nothing and a blind count read alike, so the cold check of that server is
unverified (a caveat, never silently `unwarmed`).
"""

from __future__ import annotations

from collections.abc import Sequence

from coldbench.evidence.contract.schemas import CANARY_ROUND, Record
from coldbench.evidence.contract.summary_schema import Canary, CanaryCell, CanaryResult

CANARY_RULE = (
    "one cell per run is warm on purpose (the first half of its prompt already in the KV "
    "cache) and judged by the cell judge: invalid is caught; ok means the cold check cannot "
    "see a warm cache, and the run's evidence is invalid"
)


def canary_section(records: Sequence[Record], run_ids: Sequence[str]) -> Canary | None:
    canaries = [r for r in records if r.round == CANARY_ROUND]
    if not canaries:
        return None
    cells = []
    for run_id in run_ids:
        mine = [r for r in canaries if r.run_id == run_id]
        if not mine:
            cells.append(
                CanaryCell(
                    run_id=run_id,
                    variant="",
                    context_tokens=0,
                    cached_tokens=None,
                    result="missing",
                    reason=None,
                )
            )
            continue
        for record in mine:
            cells.append(
                CanaryCell(
                    run_id=run_id,
                    variant=record.variant,
                    context_tokens=record.context_tokens,
                    cached_tokens=record.cached_tokens,
                    result=canary_result(record),
                    reason=(record.reason or "")[:300] or None,
                )
            )
    return Canary(runs=cells, rule=CANARY_RULE)


def canary_result(record: Record) -> CanaryResult:
    """What one canary record proves: the judge's status, and for a server's canary judged
    cold, what its timing (engine/adapters/openai_server.py `canary_timing`) made of it."""
    if record.status == "invalid":
        return "caught"
    if record.status != "ok":
        return "error"
    if record.counters.get("canary.timing_could_tell") is False:
        return "unverified"
    if record.counters.get("canary.warm_by_timing") is False:
        return "unwarmed"
    return "passed"


def canary_invalidations(canary: Canary | None) -> list[str]:
    """Why the evidence is invalid because of its canaries: one sentence per canary judged
    cold."""
    if canary is None:
        return []
    return [
        f"Run {cell.run_id}'s warm canary ({cell.variant} at {cell.context_tokens} tokens, its "
        "prompt's first half cached on purpose) was judged cold: the cold check on this host "
        "cannot see a warm KV cache, so no cell of the run is shown cold."
        + (f" The canary's record: {cell.reason}" if cell.reason else "")
        for cell in canary.runs
        if cell.result == "passed"
    ]


def canary_caveats(canary: Canary | None) -> list[str]:
    """Canaries that proved nothing: errors and runs without one."""
    if canary is None:
        return []
    found = []
    for cell in canary.runs:
        if cell.result == "error":
            found.append(
                f"Run {cell.run_id}'s warm canary did not run to a verdict ({cell.reason}): "
                "its cold check is unproven."
            )
        elif cell.result == "unwarmed":
            found.append(
                f"Run {cell.run_id}'s warm canary could not be made warm ({cell.reason}): its "
                "cells are cold by the server's setting, but its count of cached tokens is "
                "unproven."
            )
        elif cell.result == "unverified":
            found.append(
                f"Run {cell.run_id}'s warm canary could not verify the server's cold check "
                f"({cell.reason}): the server counted no cached tokens at "
                f"{cell.context_tokens} tokens, which a blind count would report too, and its "
                "timing could not tell; the cold check of this server is unverified."
            )
        elif cell.result == "missing":
            found.append(f"Run {cell.run_id} has no warm canary: its cold check is unproven.")
    return found
