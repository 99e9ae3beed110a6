"""What the cells' GPU telemetry says about a run (evidence/analysis/telemetry.py)."""

from __future__ import annotations

from typing import Any

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.rendering.headline import caveats
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html
from tests.evidence.builders import simulate_run


def _with(counters_of: Any) -> list[Any]:
    records = simulate_run(effects={"base": 1.0, "pr": 1.1}, contexts=(64,), rounds=8)
    return [r.model_copy(update={"counters": {**r.counters, **counters_of(r)}}) for r in records]


def _nvml(clock: int, reasons: str = "", power_ms: float = 0.0) -> dict[str, Any]:
    return {
        "gpu.telemetry": "nvml",
        "gpu.sm_clock_mhz": clock,
        "gpu.sm_clock_max_mhz": 1980,
        "gpu.power_w": 650.0,
        "gpu.temperature_c": 60,
        "gpu.clocks_event_reasons": reasons,
        "gpu.power_violation_ms": power_ms,
        "gpu.thermal_violation_ms": 0.0,
    }


def test_a_steady_gpu_is_not_flagged() -> None:
    summary = summarize(_with(lambda r: _nvml(1980)), baseline="base")
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.cells == 16 and run.sm_clock_mhz_median == 1980 and not run.flagged
    assert not [c for c in caveats(summary) if "GPU" in c]


def test_throttling_and_a_clock_drop_within_a_run_undercut_it() -> None:
    def reading(record: Any) -> dict[str, Any]:
        if record.round >= 6:  # the last two rounds: power capped, the clock down 25%
            return _nvml(1485, "sw_power_cap", 40.0)
        return _nvml(1980)

    summary = summarize(_with(reading), baseline="base")
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.flagged and run.throttled_cells == 4 and run.sm_clock_mhz_min == 1485
    assert run.throttle_reasons == ["sw_power_cap", "power_violation"]
    assert run.clock_drop_pct == 25.0
    undercut = [c for c in caveats(summary) if "GPU" in c]
    assert len(undercut) == 2
    assert "4 of run r-1's 16 measured cells ran while the GPU throttled" in undercut[0]
    assert "dropped to 1485 MHz" in undercut[1]
    assert "throttled" in render_summary_md(summary, [])


def test_a_run_without_telemetry_says_why() -> None:
    why = {
        "gpu.sm_clock_mhz": None,
        "gpu.telemetry_unavailable": "the cpu backend has no NVML device",
    }
    summary = summarize(_with(lambda r: why), baseline="base")
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.source is None and run.unavailable == "the cpu backend has no NVML device"
    assert not run.flagged and run.sm_clock_mhz_median is None
    assert "GPU telemetry of run r-1: none (the cpu backend has no NVML device)" in (
        render_summary_md(summary, [])
    )
    # records from before telemetry: no section at all
    assert summarize(_with(lambda r: {}), baseline="base").telemetry is None


def _pmset(limit: int | None, warning: int = 0) -> dict[str, Any]:
    """A Mac cell's counters (engine/telemetry.py's parse of `pmset -g therm`)."""
    return {
        "gpu.sm_clock_mhz": None,
        "gpu.telemetry_unavailable": "the metal backend has no NVML device",
        "mac.telemetry": "pmset",
        "mac.cpu_speed_limit_pct": limit,
        "mac.thermal_warning_level": 0,
        "mac.performance_warning_level": warning,
    }


def test_a_mac_that_never_limited_its_cpu_is_not_flagged() -> None:
    summary = summarize(_with(lambda r: _pmset(None)), baseline="base")
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.mac_cells == 16 and run.cpu_speed_limit_min_pct is None and not run.flagged
    assert not [c for c in caveats(summary) if "macOS" in c]


def test_a_speed_limit_drop_inside_a_run_undercuts_it() -> None:
    # the last two rounds: macOS limits the CPU to 78% and records performance warning 2
    summary = summarize(
        _with(lambda r: _pmset(78, 2) if r.round >= 6 else _pmset(100)), baseline="base"
    )
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.flagged and run.cpu_speed_limit_min_pct == 78 and run.mac_warning_level_max == 2
    undercut = [c for c in caveats(summary) if "macOS" in c]
    assert len(undercut) == 2
    assert "limited the CPU to 78% of its speed" in undercut[0]
    assert "warning level of 2" in undercut[1]
    what_undercuts = render_summary_md(summary, []).split("**What undercuts", 1)[1]
    assert "limited the CPU to 78% of its speed" in what_undercuts.split("\n\n")[1]
    html = render_report_html(summary, [], [], None, plotly_js_src="plotly.js")
    assert "lowest CPU speed limit 78%" in html and "flagged" in html


def test_a_gpu_at_its_power_cap_in_every_cell_is_one_steady_state() -> None:
    # what an H100 SXM showed at 16K (2026-12-07): sw_power_cap in all 40 cells, 1620-1680 MHz
    summary = summarize(
        _with(lambda r: _nvml(1680 - 60 * (r.round % 2), "sw_power_cap", 25.0)), baseline="base"
    )
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.throttled_cells == run.cells == 16 and not run.flagged
    assert not [c for c in caveats(summary) if "GPU" in c]
    assert "every cell at the power cap (sw_power_cap, power_violation)" in render_summary_md(
        summary, []
    )


def test_a_thermal_slowdown_in_every_cell_is_still_flagged() -> None:
    summary = summarize(_with(lambda r: _nvml(1680, "sw_thermal_slowdown")), baseline="base")
    (run,) = summary.telemetry.runs  # type: ignore[union-attr]
    assert run.flagged
    assert [c for c in caveats(summary) if "GPU throttled (sw_thermal_slowdown)" in c]
