"""GPU telemetry per cell: on CUDA, the SM clock, power and temperature from NVML
(`nvidia-ml-py`), and whether the GPU throttled while the cell ran.

The variant process reads the device twice per cell, outside the timed region: before (NVML's
cumulative power and thermal violation times) and right after the cell (the SM clock still at
its loaded value, power, temperature, the current clocks-event reasons, and the violation time
accrued during the cell). A cell that ran throttled, or a run whose clock drops, is named under
"what undercuts it" (evidence/analysis/telemetry.py).

Where there is nothing to read (the CPU or Metal backend, no `pynvml` module, no NVML library,
a MIG slice), every value is None and `gpu.telemetry_unavailable` says why; the evidence says so
instead of guessing.

macOS (`sys.platform == "darwin"`, `open_telemetry`): `powermetrics` needs root, which a worker
does not have, and `pmset -g` lists settings, not state; what a Mac tells any user is
`pmset -g therm`: the thermal and performance warning levels and, once the OS has limited the
CPU, `CPU_Speed_Limit` (percent). It is read right after each cell, outside the timed region,
into `mac.telemetry` (`pmset`), `mac.cpu_speed_limit_pct` (None while no CPU power status has
been recorded), `mac.thermal_warning_level`, `mac.performance_warning_level` (0: none
recorded), or `mac.telemetry_unavailable`. The parser is tested against published outputs of
the command only: this path has not run on a Mac.

Counters written into each record (engine/judge.py's record keeps unknown values None):
`gpu.telemetry` (`nvml`), `gpu.sm_clock_mhz`, `gpu.sm_clock_max_mhz`, `gpu.power_w`,
`gpu.temperature_c`, `gpu.clocks_event_reasons` (names, comma-separated; empty: none),
`gpu.power_violation_ms`, `gpu.thermal_violation_ms`.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from typing import Any

# NVML's clocks-event reasons that mean the GPU was slowed (idle and application settings are
# not throttling).
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
UNKNOWN = {"gpu.sm_clock_mhz": None, "gpu.power_w": None, "gpu.temperature_c": None}


class GpuTelemetry:
    """One variant process's NVML reader (`open`); `why` says why there is none."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.why: str | None = None

    @classmethod
    def unavailable(cls, why: str) -> GpuTelemetry:
        reader = cls(None, None)
        reader.why = why
        return reader

    @classmethod
    def open(cls, backend: str, nvml: Any = None) -> GpuTelemetry:
        """The reader of the device this process computes on. `nvml` replaces the `pynvml`
        module (a test on a host without a GPU)."""
        if backend != "cuda":
            return cls.unavailable(f"the {backend} backend has no NVML device")
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                return cls.unavailable("pynvml (nvidia-ml-py) is not installed")
        try:
            nvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if visible.startswith("MIG-"):
                return cls.unavailable("a MIG slice: NVML reports the whole GPU's clocks")
            if visible.startswith("GPU-"):
                handle = nvml.nvmlDeviceGetHandleByUUID(visible)
            else:
                handle = nvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
        except Exception as error:  # noqa: BLE001 - NVMLError_* and ctypes errors alike
            return cls.unavailable(f"NVML: {type(error).__name__}: {error}")
        return cls(nvml, handle)

    def _violation_ns(self, policy: int) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetViolationStatus(self.handle, policy).violationTime)
        except Exception:  # noqa: BLE001 - not every board reports it
            return None

    def start(self) -> dict[str, int | None]:
        """Read before a cell: the cumulative violation times."""
        if self.nvml is None:
            return {}
        return {
            "power": self._violation_ns(self.nvml.NVML_PERF_POLICY_POWER),
            "thermal": self._violation_ns(self.nvml.NVML_PERF_POLICY_THERMAL),
        }

    def finish(self, before: dict[str, int | None]) -> dict[str, Any]:
        """The cell's counters, read right after it (module docstring)."""
        if self.nvml is None:
            return {**UNKNOWN, "gpu.telemetry_unavailable": self.why}
        nvml, handle = self.nvml, self.handle
        try:
            clock = int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            max_clock = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
            power_w = round(int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000, 1)
            temperature = int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            reasons = int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except Exception as error:  # noqa: BLE001 - the cell stands; its telemetry does not
            return {**UNKNOWN, "gpu.telemetry_unavailable": f"NVML: {error}"}
        counters: dict[str, Any] = {
            "gpu.telemetry": "nvml",
            "gpu.sm_clock_mhz": clock,
            "gpu.sm_clock_max_mhz": max_clock,
            "gpu.power_w": power_w,
            "gpu.temperature_c": temperature,
            "gpu.clocks_event_reasons": ",".join(
                name for bit, name in THROTTLE_REASONS.items() if reasons & bit
            ),
        }
        for policy, key in (
            (nvml.NVML_PERF_POLICY_POWER, "power"),
            (nvml.NVML_PERF_POLICY_THERMAL, "thermal"),
        ):
            now, then = self._violation_ns(policy), before.get(key)
            counters[f"gpu.{key}_violation_ms"] = (
                None if now is None or then is None else round((now - then) / 1e6, 3)
            )
        return counters


PMSET_TIMEOUT_S = 5.0


def parse_pmset_therm(text: str) -> dict[str, int | None]:
    """`pmset -g therm`'s state: the warning levels (0 where "No ... has been recorded") and
    `CPU_Speed_Limit` (None where no CPU power status has been recorded). Unparseable text
    gives None everywhere."""
    found: dict[str, int | None] = {
        "mac.cpu_speed_limit_pct": None,
        "mac.thermal_warning_level": None,
        "mac.performance_warning_level": None,
    }
    for kind in ("thermal", "performance"):
        key = f"mac.{kind}_warning_level"
        level = re.search(rf"{kind} warning level\s*[:=]?\s*(\d+)", text, re.I)
        if level:
            found[key] = int(level.group(1))
        elif re.search(rf"No {kind} warning level has been recorded", text, re.I):
            found[key] = 0
    limit = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    if limit:
        found["mac.cpu_speed_limit_pct"] = int(limit.group(1))
    return found


class MacTelemetry:
    """One variant process's `pmset -g therm` reader (macOS); `gpu` keeps the NVML counters'
    reason for having none."""

    def __init__(self, gpu: GpuTelemetry, pmset: str | None) -> None:
        self.gpu = gpu
        self.pmset = pmset

    def start(self) -> dict[str, int | None]:
        return {}

    def read(self) -> dict[str, Any]:
        if self.pmset is None:
            return {"mac.telemetry_unavailable": "no pmset on this host's PATH"}
        try:
            done = subprocess.run(
                [self.pmset, "-g", "therm"],
                capture_output=True,
                text=True,
                timeout=PMSET_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return {"mac.telemetry_unavailable": f"pmset -g therm: {error}"}
        if done.returncode != 0:
            return {"mac.telemetry_unavailable": f"pmset -g therm exited {done.returncode}"}
        return {"mac.telemetry": "pmset", **parse_pmset_therm(done.stdout)}

    def finish(self, before: dict[str, int | None]) -> dict[str, Any]:
        return {**self.gpu.finish(before), **self.read()}


def open_telemetry(
    backend: str, *, platform: str = sys.platform, nvml: Any = None
) -> GpuTelemetry | MacTelemetry:
    """This process's per-cell reader, chosen by platform: `pmset` on macOS, NVML elsewhere."""
    gpu = GpuTelemetry.open(backend, nvml)
    if platform == "darwin":
        return MacTelemetry(gpu, shutil.which("pmset"))
    return gpu
