"""What the job page says of time: how long the job has gone, and how much measuring is left.

A running run's estimate (`Progress.eta_s`) is as of its host's last heartbeat, which renewed
its lease for `lease_ttl_s` (api/runs/heartbeat.py): that heartbeat came at `lease_expires_at -
lease_ttl_s`, and the estimate counts down from there. A host that missed two heartbeats gets
no estimate: the page says how long it has been silent and when its lease ends, after which the
run waits for a host again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from coldbench.api.jobs.schemas import JobOut
from coldbench.api.pages.templates import fmt_duration
from coldbench.evidence.contract.protocol import HEARTBEAT_S, JobState, RunState

# Silent for longer than this, a host has missed two heartbeats.
OVERDUE_AFTER_S: Final = 2 * HEARTBEAT_S


def job_timing(job: JobOut, *, now: datetime, lease_ttl_s: float) -> str:
    """One sentence: the time a final job took, a queued job has waited, or a running job has
    gone with the measuring left (or why there is no estimate)."""
    if JobState(job.state).is_final:
        took = fmt_duration((job.updated_at - job.created_at).total_seconds())
        return f"Took {took} from submission to its {job.state} state."
    going = fmt_duration((now - job.created_at).total_seconds())
    if job.state == JobState.QUEUED:
        return f"Waiting for a host for {going}."
    silent: list[str] = []
    left: list[float] = []
    for run in job.runs:
        if run.state != RunState.LEASED or run.lease_expires_at is None:
            continue
        heard_s = max(0.0, lease_ttl_s - (run.lease_expires_at - now).total_seconds())
        if heard_s > OVERDUE_AFTER_S:
            silent.append(_silent_host(run.host_name or run.id, heard_s, heard_s - lease_ttl_s))
            continue
        eta_s = (run.progress or {}).get("eta_s")
        if isinstance(eta_s, int | float):
            left.append(max(0.0, eta_s - heard_s))
    if silent:
        return f"Going for {going} · no estimate: {'; '.join(silent)}."
    if left:
        longest = max(left)
        if longest < 1:
            return f"Going for {going} · its last cells are being measured."
        return (
            f"Going for {going} · about {fmt_duration(longest)} of measuring left (the mean cell "
            "time so far, counted down from its host's last heartbeat)."
        )
    return f"Going for {going}."


def _silent_host(host: str, heard_s: float, expired_s: float) -> str:
    if expired_s < 0:
        then = f"its lease ends in {fmt_duration(-expired_s)}, then the run waits for a host again"
    else:
        then = "its lease has ended; the run waits for a host again"
    return f"{host} has not been heard from for {fmt_duration(heard_s)} ({then})"
