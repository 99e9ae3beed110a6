"""What a run's warm canary proves, decided from its record's status and counters
(evidence/analysis/canary.py), and how the summary says it."""

from __future__ import annotations

from typing import Any

import pytest

from coldbench.evidence.analysis.canary import (
    canary_caveats,
    canary_invalidations,
    canary_result,
    canary_section,
)
from coldbench.evidence.contract.schemas import CANARY_ROUND
from coldbench.evidence.rendering.markdown import canary_lines
from tests.evidence.builders import record


def _canary(status: str = "ok", cached: int = 0, **counters: Any) -> Any:
    return record(
        round=CANARY_ROUND,
        order=-1,
        context_tokens=512,
        prompt_tokens=512,
        cached_tokens=cached,
        counters=counters,
        status=status,
        reason=None if status == "ok" else f"warm canary: cached_tokens={cached}",
    )


@pytest.mark.parametrize(
    ("status", "cached", "counters", "result"),
    [
        (
            "invalid",
            511,
            {"canary.timing_could_tell": False, "canary.warm_by_timing": None},
            "caught",
        ),
        ("ok", 0, {"canary.timing_could_tell": True, "canary.warm_by_timing": True}, "passed"),
        ("ok", 0, {"canary.timing_could_tell": True, "canary.warm_by_timing": False}, "unwarmed"),
        ("ok", 0, {"canary.timing_could_tell": False, "canary.warm_by_timing": None}, "unverified"),
        # an embedded canary has no timing: judged cold is passed
        ("ok", 0, {}, "passed"),
        # a server canary from before the floor: its ratio alone decided
        ("ok", 0, {"canary.warm_by_timing": False}, "unwarmed"),
    ],
)
def test_the_canary_result_comes_from_the_status_and_the_timing_counters(
    status: str, cached: int, counters: dict[str, Any], result: str
) -> None:
    assert canary_result(_canary(status, cached, **counters)) == result


def test_an_unverified_canary_is_a_caveat_naming_the_twin_not_invalid_evidence() -> None:
    reason = "timing could not tell: cold twin took 12 ms, under the 50 ms a cold prefill needs"
    canary = _canary(**{"canary.timing_could_tell": False, "canary.warm_by_timing": None})
    canary = canary.model_copy(update={"reason": reason})
    section = canary_section([canary], ["r-1"])
    assert section is not None and section.runs[0].result == "unverified"
    assert canary_invalidations(section) == []
    (caveat,) = canary_caveats(section)
    assert caveat.startswith("Run r-1's warm canary could not verify the server's cold check")
    assert "cold twin took 12 ms" in caveat and caveat.endswith("this server is unverified.")
    (line,) = canary_lines(section)
    assert line.endswith("not verified (the server counted none; its timing could not tell)")
