"""The run state the agent's heartbeat thread reads (worker/agent.py, RunState): no processes."""

from __future__ import annotations

from coldbench.evidence.contract.protocol import Progress
from coldbench.worker.agent import RunState


def test_a_heartbeat_counts_the_estimate_down_from_its_report() -> None:
    """A cell may run for minutes between two reports: each heartbeat's estimate is as of
    itself, so the server can count down from the heartbeat (api/pages/timing.py)."""
    state = RunState()
    state.start("run-1", 1)
    state.report(Progress(cells_done=2, cells_total=8, eta_s=100.0))
    state.progress_at -= 30  # reported 30 s ago
    body = state.body()
    assert body.progress is not None and body.progress.eta_s is not None
    assert 69 <= body.progress.eta_s <= 70
    assert state.progress is not None and state.progress.eta_s == 100.0  # the report is kept
    state.progress_at -= 500
    assert state.body().progress.eta_s == 0  # type: ignore[union-attr]
    state.report(Progress(cells_done=0, cells_total=8))
    assert state.body().progress.eta_s is None  # type: ignore[union-attr]
