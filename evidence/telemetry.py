"""GPU telemetry of the measured cells (engine/telemetry.py's counters): summary.json's
`telemetry`, and what of it undercuts a verdict.

Per run, over its measured cells (round >= 0, status ok): the SM clock's median and minimum,
the highest power and temperature, and the cells that ran throttled (a clocks-event reason of
power or thermal slowdown, or power/thermal violation time accrued during the cell). A run is
flagged when any cell ran throttled or its SM clock dropped `CLOCK_DROP_PCT` or more below the
run's median: the cells of one run were not measured on the same machine state, and a pair
whose two cells straddle the drop compares clocks, not code. A run without telemetry (the CPU,
no NVML) says why and is not flagged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coldbench.evidence.schemas import Record
from coldbench.evidence.summary_schema import RunTelemetry, Telemetry

CLOCK_DROP_PCT = 10.0
TELEMETRY_RULE = (
    "a run is flagged when a measured cell ran throttled (NVML clocks-event reasons of power "
    "or thermal slowdown, or violation time during the cell) or its SM clock fell "
    f"{CLOCK_DROP_PCT:g}% or more below the run's median"
)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def telemetry_section(records: Sequence[Record], run_ids: Sequence[str]) -> Telemetry | None:
    """None when no record carries telemetry counters (records from before them)."""
    keyed = [
        r
        for r in records
        if "gpu.telemetry" in r.counters or "gpu.telemetry_unavailable" in r.counters
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
                flagged=throttled > 0 or (drop is not None and drop >= CLOCK_DROP_PCT),
            )
        )
    return Telemetry(runs=runs, rule=TELEMETRY_RULE)


def telemetry_caveats(telemetry: Telemetry | None) -> list[str]:
    found = []
    for run in telemetry.runs if telemetry else []:
        if run.throttled_cells:
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
        if run.source is None:
            lines.append(
                f"GPU telemetry of run {run.run_id}: none ({run.unavailable or 'not read'})"
            )
            continue
        lines.append(
            f"GPU telemetry of run {run.run_id} ({run.cells} cells, NVML): SM clock median "
            f"{run.sm_clock_mhz_median:.0f} MHz (lowest {run.sm_clock_mhz_min:.0f}), power up to "
            f"{run.power_w_max} W, up to {run.temperature_c_max} C, "
            f"{run.throttled_cells} throttled cells" + (" **flagged**" if run.flagged else "")
        )
    return lines
