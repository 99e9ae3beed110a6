"""GPU telemetry of the measured cells (engine/telemetry.py's counters): summary.json's
`telemetry`, and what of it undercuts a verdict.

Per run, over its measured cells (round >= 0, status ok): the SM clock's median and minimum,
the highest power and temperature, and the cells that ran throttled (a clocks-event reason of
power or thermal slowdown, or power/thermal violation time accrued during the cell). A run is
flagged when some cells ran throttled and others not, when any cell was slowed for heat or by
the hardware, or when its SM clock dropped `CLOCK_DROP_PCT` or more below the run's median: the
cells of one run were not measured on the same machine state, and a pair whose two cells
straddle the change compares clocks, not code. A run whose every cell ran at the power cap
alone (`sw_power_cap`, power violation time) is not flagged: that is a datacenter GPU's steady
state under a long prefill (an H100 SXM at 16K held it in every cell, up to 694 W, its clock
within 5% of the median), the same for both sides of every pair; the report states it. A run
without telemetry (the CPU, no NVML) says why and is not flagged.

On macOS the cells carry `pmset -g therm`'s state instead (engine/telemetry.py): a run is
flagged when a measured cell saw a CPU_Speed_Limit below 100 or a thermal or performance
warning level above 0, since the OS slowed the chip for some of its cells. Tested against
published outputs of the command only, not on a Mac.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from coldbench.evidence.contract.schemas import Record
from coldbench.evidence.contract.summary_schema import RunTelemetry, Telemetry

CLOCK_DROP_PCT = 10.0
# Reasons that mean the GPU held its power limit; a run capped in every cell is in one state.
POWER_CAP_REASONS = frozenset({"sw_power_cap", "power_violation"})
TELEMETRY_RULE = (
    "a run is flagged when some of its measured cells ran throttled (NVML clocks-event reasons "
    "of power or thermal slowdown, or violation time during the cell) and others not, when any "
    "cell was slowed for heat or by the hardware, or when its SM clock fell "
    f"{CLOCK_DROP_PCT:g}% or more below the run's median; every cell at the power cap alone is "
    "one steady state, stated and not flagged"
)


def _capped_throughout(throttled: int, cells: int, reasons: Sequence[str]) -> bool:
    return cells > 0 and throttled == cells and set(reasons) <= POWER_CAP_REASONS


def power_capped_throughout(run: RunTelemetry) -> bool:
    """Every measured cell at the power cap, nothing else slowing the GPU."""
    return _capped_throughout(run.throttled_cells, run.cells, run.throttle_reasons)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def telemetry_section(records: Sequence[Record], run_ids: Sequence[str]) -> Telemetry | None:
    """None when no record carries telemetry counters (records from before them)."""
    keyed = [
        r
        for r in records
        if "gpu.telemetry" in r.counters
        or "gpu.telemetry_unavailable" in r.counters
        or "mac.telemetry" in r.counters
    ]
    if not keyed:
        return None
    runs = []
    for run_id in run_ids:
        mine = [r for r in keyed if r.run_id == run_id and r.round >= 0 and r.status == "ok"]
        read = [r for r in mine if r.counters.get("gpu.telemetry") == "nvml"]
        why = next(
            (
                str(r.counters["gpu.telemetry_unavailable"])
                for r in keyed
                if r.run_id == run_id and r.counters.get("gpu.telemetry_unavailable")
            ),
            None,
        )
        clocks = [c for r in read if (c := _number(r.counters.get("gpu.sm_clock_mhz")))]
        power = [p for r in read if (p := _number(r.counters.get("gpu.power_w"))) is not None]
        heat = [t for r in read if (t := _number(r.counters.get("gpu.temperature_c"))) is not None]
        reasons: dict[str, None] = {}
        throttled = 0
        for record in read:
            named = [
                n
                for n in str(record.counters.get("gpu.clocks_event_reasons") or "").split(",")
                if n
            ]
            violated = [
                key.removeprefix("gpu.").removesuffix("_ms")
                for key in ("gpu.power_violation_ms", "gpu.thermal_violation_ms")
                if (_number(record.counters.get(key)) or 0) > 0
            ]
            if named or violated:
                throttled += 1
                reasons.update(dict.fromkeys([*named, *violated]))
        mac = _mac_fields([r for r in mine if r.counters.get("mac.telemetry") == "pmset"])
        median = float(np.median(clocks)) if clocks else None
        drop = (median - min(clocks)) / median * 100 if clocks and median else None
        runs.append(
            RunTelemetry(
                run_id=run_id,
                source="nvml" if read else None,
                unavailable=None if read else why,
                cells=len(read),
                sm_clock_mhz_median=median,
                sm_clock_mhz_min=min(clocks) if clocks else None,
                power_w_max=max(power) if power else None,
                temperature_c_max=max(heat) if heat else None,
                throttled_cells=throttled,
                throttle_reasons=list(reasons),
                clock_drop_pct=drop,
                flagged=(
                    throttled > 0 and not _capped_throughout(throttled, len(read), list(reasons))
                )
                or (drop is not None and drop >= CLOCK_DROP_PCT)
                or _mac_slowed(mac),
                **mac,
            )
        )
    return Telemetry(runs=runs, rule=TELEMETRY_RULE)


def _mac_fields(read: Sequence[Record]) -> dict[str, Any]:
    """RunTelemetry's macOS fields from the cells that read `pmset` (none: left unset)."""
    if not read:
        return {}
    limits = [int(v) for r in read if (v := _number(r.counters.get("mac.cpu_speed_limit_pct")))]
    levels = [
        int(v)
        for r in read
        for key in ("mac.thermal_warning_level", "mac.performance_warning_level")
        if (v := _number(r.counters.get(key))) is not None
    ]
    return {
        "mac_cells": len(read),
        "cpu_speed_limit_min_pct": min(limits) if limits else None,
        "mac_warning_level_max": max(levels) if levels else None,
    }


def _mac_slowed(mac: dict[str, Any]) -> bool:
    limit, level = mac.get("cpu_speed_limit_min_pct"), mac.get("mac_warning_level_max")
    return (limit is not None and limit < 100) or (level is not None and level > 0)


def telemetry_caveats(telemetry: Telemetry | None) -> list[str]:
    found = []
    for run in telemetry.runs if telemetry else []:
        limit, level = run.cpu_speed_limit_min_pct, run.mac_warning_level_max
        if limit is not None and limit < 100:
            found.append(
                f"macOS limited the CPU to {limit}% of its speed (pmset CPU_Speed_Limit) during "
                f"run {run.run_id}'s measured cells: their times are the limited chip's."
            )
        if level is not None and level > 0:
            found.append(
                f"macOS recorded a thermal or performance warning level of {level} (pmset -g "
                f"therm) during run {run.run_id}'s measured cells: the chip may have slowed."
            )
        if run.throttled_cells and not power_capped_throughout(run):
            found.append(
                f"{run.throttled_cells} of run {run.run_id}'s {run.cells} measured cells ran "
                f"while the GPU throttled ({', '.join(run.throttle_reasons)}): their times are "
                "the throttled GPU's."
            )
        if run.clock_drop_pct is not None and run.clock_drop_pct >= CLOCK_DROP_PCT:
            found.append(
                f"The GPU's SM clock dropped to {run.sm_clock_mhz_min:.0f} MHz in run "
                f"{run.run_id}, {run.clock_drop_pct:.0f}% below its median of "
                f"{run.sm_clock_mhz_median:.0f} MHz: cells of one run ran at different clocks."
            )
    return found


def telemetry_lines(telemetry: Telemetry) -> list[str]:
    """One line per run: what the GPU did, or why nothing is known."""
    lines = []
    for run in telemetry.runs:
        if run.mac_cells:
            limit = run.cpu_speed_limit_min_pct
            lines.append(
                f"macOS thermal state of run {run.run_id} ({run.mac_cells} cells, pmset -g "
                f"therm): lowest CPU speed limit {'none recorded' if limit is None else limit}"
                f"{'' if limit is None else '%'}, highest warning level "
                f"{run.mac_warning_level_max}" + (" **flagged**" if run.flagged else "")
            )
            continue
        if run.source is None:
            lines.append(
                f"GPU telemetry of run {run.run_id}: none ({run.unavailable or 'not read'})"
            )
            continue
        lines.append(
            f"GPU telemetry of run {run.run_id} ({run.cells} cells, NVML): SM clock median "
            f"{run.sm_clock_mhz_median:.0f} MHz (lowest {run.sm_clock_mhz_min:.0f}), power up to "
            f"{run.power_w_max} W, up to {run.temperature_c_max} C, "
            + (
                f"every cell at the power cap ({', '.join(run.throttle_reasons)}): one steady "
                "state for both sides of each pair"
                if power_capped_throughout(run)
                else f"{run.throttled_cells} throttled cells"
            )
            + (" **flagged**" if run.flagged else "")
        )
    return lines
