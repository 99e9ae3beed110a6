"""The job page's sentence of time (api/pages/timing.py): the estimate counts down from the
host's last heartbeat, and a host that stopped answering gets none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from coldbench.api.jobs.schemas import JobOut
from coldbench.api.pages.timing import job_timing
from coldbench.api.runs.schemas import RunOut

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
TTL_S = 60.0


def _run(name: str, *, heard_s_ago: float, eta_s: float | None, state: str = "leased") -> RunOut:
    progress: dict[str, Any] = {"cells_done": 2, "cells_total": 8, "eta_s": eta_s}
    return RunOut(
        id=f"run-{name}",
        slot=0,
        attempt=1,
        state=state,
        host_id=f"h-{name}",
        host_name=name,
        progress=progress,
        # each heartbeat renews the lease for the TTL
        lease_expires_at=NOW - timedelta(seconds=heard_s_ago) + timedelta(seconds=TTL_S),
        completed_at=None,
        processed_at=None,
        reason=None,
        attempts=[],
    )


def _job(state: str, runs: list[RunOut], *, age_s: float = 600) -> JobOut:
    return JobOut(
        id="j",
        state=state,
        spec={},
        spec_sha256="0" * 64,
        created_at=NOW - timedelta(seconds=age_s),
        updated_at=NOW - timedelta(seconds=age_s - 95),
        reason=None,
        evidence_id=None,
        evidence_url=None,
        runs=runs,
    )


def _timing(job: JobOut) -> str:
    return job_timing(job, now=NOW, lease_ttl_s=TTL_S)


def test_the_estimate_counts_down_from_the_last_heartbeat() -> None:
    fresh = _job("running", [_run("studio-1", heard_s_ago=0, eta_s=185)])
    assert _timing(fresh) == (
        "Going for 10 min 0 s · about 3 min 5 s of measuring left (the mean cell time so far, "
        "counted down from its host's last heartbeat)."
    )
    later = _job("running", [_run("studio-1", heard_s_ago=20, eta_s=185)])
    assert "about 2 min 45 s of measuring left" in _timing(later)
    # the longest run sets the job's estimate; one past its estimate is about to finish
    two = [_run("a", heard_s_ago=5, eta_s=100), _run("b", heard_s_ago=5, eta_s=40)]
    assert "about 1 min 35 s of measuring left" in _timing(_job("running", two))
    done_soon = _job("running", [_run("a", heard_s_ago=25, eta_s=10)])
    assert _timing(done_soon) == "Going for 10 min 0 s · its last cells are being measured."
    assert _timing(_job("running", [_run("a", heard_s_ago=1, eta_s=None)])) == (
        "Going for 10 min 0 s."
    )


def test_a_host_that_stopped_answering_gets_no_estimate() -> None:
    silent = _job("running", [_run("studio-1", heard_s_ago=45, eta_s=185)])
    assert _timing(silent) == (
        "Going for 10 min 0 s · no estimate: studio-1 has not been heard from for 45 s (its "
        "lease ends in 15 s, then the run waits for a host again)."
    )
    gone = _job(
        "running", [_run("studio-1", heard_s_ago=200, eta_s=185), _run("b", heard_s_ago=1, eta_s=9)]
    )
    assert _timing(gone) == (
        "Going for 10 min 0 s · no estimate: studio-1 has not been heard from for 3 min 20 s "
        "(its lease has ended; the run waits for a host again)."
    )


def test_queued_and_final_jobs_say_how_long() -> None:
    queued = _job("queued", [_run("a", heard_s_ago=0, eta_s=None, state="queued")], age_s=75)
    assert _timing(queued) == "Waiting for a host for 1 min 15 s."
    done = _job("done", [_run("a", heard_s_ago=0, eta_s=5, state="processed")])
    assert _timing(done) == "Took 1 min 35 s from submission to its done state."
