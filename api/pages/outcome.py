"""What a job came to, in a few words, for the job list: its verdicts, the commit a bisection
found (or why it found none), a history's steps, or why it failed.

Read from the stored summary as JSON (the list shows a hundred jobs: validating each summary as
a `Summary` would cost more than the page), and only the fields named here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.contract.summary_schema import DECIDED


@dataclass(frozen=True)
class Outcome:
    """`text` for the list; `tone`: ok (an answer), warn (done without one), bad (failed or
    cancelled), or empty while the job is still going."""

    text: str
    tone: str


def job_outcome(state: str, reason: str | None, summary: dict[str, Any] | None) -> Outcome:
    if state == JobState.FAILED:
        return Outcome(reason or "failed without a reason", "bad")
    if state == JobState.CANCELLED:
        return Outcome("cancelled", "bad")
    if state != JobState.DONE:
        return Outcome("", "")
    summary = summary or {}
    if summary.get("bisect"):
        return _bisect_outcome(summary["bisect"])
    if summary.get("history"):
        steps = summary["history"].get("steps") or []
        if steps:
            at = ", ".join(f"{s['direction']} at {str(s['to_commit'])[:12]}" for s in steps[:3])
            return Outcome(f"{len(steps)} step{'s' if len(steps) != 1 else ''}: {at}", "ok")
        return Outcome("no step between neighbouring commits", "ok")
    verdicts = Counter(str(c.get("verdict")) for c in summary.get("comparisons") or [])
    if not verdicts:
        return Outcome("done, with no comparison", "warn")
    text = ", ".join(f"{count} {verdict}" for verdict, count in verdicts.most_common())
    answered = any(verdict in DECIDED for verdict in verdicts)
    return Outcome(text, "ok" if answered else "warn")


def _bisect_outcome(bisect: dict[str, Any]) -> Outcome:
    direction = bisect.get("direction", "changed")
    if bisect.get("first_bad_commit"):
        return Outcome(f"first {direction} commit {str(bisect['first_bad_commit'])[:12]}", "ok")
    if bisect.get("final"):
        return Outcome(f"no single first commit: {bisect.get('reason') or 'no reason'}", "warn")
    return Outcome(f"step {bisect.get('step')}: {bisect.get('decision')}", "")
