"""GPU telemetry per cell (engine/telemetry.py): NVML's readings on CUDA, None and why elsewhere.

This machine has no GPU: the absent paths run for real (the CPU backend; pynvml installed but
no NVML library). The NVML path runs against the real library where one opens, else against
NVML's functions substituted with the readings of a throttling GPU."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from coldbench.engine.telemetry import (
    GpuTelemetry,
    MacTelemetry,
    open_telemetry,
    parse_pmset_therm,
)


def test_the_cpu_backend_records_none_and_says_why() -> None:
    reader = GpuTelemetry.open("cpu")
    counters = reader.finish(reader.start())
    assert counters == {
        "gpu.sm_clock_mhz": None,
        "gpu.power_w": None,
        "gpu.temperature_c": None,
        "gpu.telemetry_unavailable": "the cpu backend has no NVML device",
    }


def _real_nvml_opens() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


@pytest.mark.skipif(_real_nvml_opens(), reason="an NVML library is present on this host")
def test_a_cuda_host_without_the_nvml_library_records_none_and_says_why() -> None:
    reader = GpuTelemetry.open("cuda")  # the real pynvml: its library is absent here
    assert reader.why is not None and reader.why.startswith("NVML: NVMLError_LibraryNotFound")
    counters = reader.finish(reader.start())
    assert counters["gpu.sm_clock_mhz"] is None and counters["gpu.telemetry_unavailable"]


def _throttling_gpu() -> Any:
    """NVML's functions, answering as an H100 that hit its power cap during the cell."""
    violation = iter([5_000_000, 1_000, 17_000_000, 1_000])  # power, thermal; before, after

    def violation_status(handle: object, policy: int) -> Any:
        return SimpleNamespace(referenceTime=0, violationTime=next(violation))

    return SimpleNamespace(
        NVML_PERF_POLICY_POWER=pynvml.NVML_PERF_POLICY_POWER,
        NVML_PERF_POLICY_THERMAL=pynvml.NVML_PERF_POLICY_THERMAL,
        NVML_CLOCK_SM=pynvml.NVML_CLOCK_SM,
        NVML_TEMPERATURE_GPU=pynvml.NVML_TEMPERATURE_GPU,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
        nvmlDeviceGetHandleByUUID=lambda uuid: ("gpu", uuid),
        nvmlDeviceGetViolationStatus=violation_status,
        nvmlDeviceGetClockInfo=lambda handle, clock: 1410,
        nvmlDeviceGetMaxClockInfo=lambda handle, clock: 1980,
        nvmlDeviceGetPowerUsage=lambda handle: 699_500,
        nvmlDeviceGetTemperature=lambda handle, sensor: 71,
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: (
            pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonGpuIdle
        ),
    )


def test_the_nvml_path_reads_clock_power_temperature_and_throttling() -> None:
    if _real_nvml_opens():
        reader = GpuTelemetry.open("cuda")
        counters = reader.finish(reader.start())
        assert counters["gpu.telemetry"] == "nvml" and counters["gpu.sm_clock_mhz"] > 0
        return
    reader = GpuTelemetry.open("cuda", nvml=_throttling_gpu())
    assert reader.why is None and reader.handle == ("gpu", 0)
    counters = reader.finish(reader.start())
    assert counters == {
        "gpu.telemetry": "nvml",
        "gpu.sm_clock_mhz": 1410,
        "gpu.sm_clock_max_mhz": 1980,
        "gpu.power_w": 699.5,
        "gpu.temperature_c": 71,
        # idle is not throttling; the power cap is
        "gpu.clocks_event_reasons": "sw_power_cap",
        "gpu.power_violation_ms": 12.0,
        "gpu.thermal_violation_ms": 0.0,
    }


def test_the_device_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert GpuTelemetry.open("cuda", nvml=_throttling_gpu()).handle == ("gpu", 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert GpuTelemetry.open("cuda", nvml=_throttling_gpu()).handle == ("gpu", "GPU-1234")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc")
    assert "MIG" in (GpuTelemetry.open("cuda", nvml=_throttling_gpu()).why or "")


# `pmset -g therm` as published, not recorded here (this machine is Linux; the macOS path has
# not run on a Mac): the speed-limited output is the question's at
# https://apple.stackexchange.com/questions/407192 (mirrored at
# https://newbetuts.com/407192-where-does-the-pmset-cpu-speed-limit-variable-come-from-and-how-to-modify-it),
# a MacBook Pro on macOS 10.13.6; the nominal and warning ones are the worker fingerprint's
# recordings (tests/worker/recordings/darwin_pmset_therm_*.txt).
RECORDINGS = Path(__file__).parent / "recordings"
WORKER_RECORDINGS = Path(__file__).parents[1] / "worker" / "recordings"


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (
            RECORDINGS / "pmset_therm_speed_limited.txt",
            {
                "mac.cpu_speed_limit_pct": 35,
                "mac.thermal_warning_level": 0,
                "mac.performance_warning_level": 0,
            },
        ),
        (
            WORKER_RECORDINGS / "darwin_pmset_therm_nominal.txt",
            {
                "mac.cpu_speed_limit_pct": None,
                "mac.thermal_warning_level": 0,
                "mac.performance_warning_level": 0,
            },
        ),
        (
            WORKER_RECORDINGS / "darwin_pmset_therm_hot.txt",
            {
                "mac.cpu_speed_limit_pct": 78,
                "mac.thermal_warning_level": 0,
                "mac.performance_warning_level": 2,
            },
        ),
    ],
)
def test_pmset_therm_is_parsed(sample: Path, expected: dict[str, int | None]) -> None:
    assert parse_pmset_therm(sample.read_text()) == expected


def test_text_that_is_not_pmset_says_nothing() -> None:
    assert set(parse_pmset_therm("pmset: unknown option").values()) == {None}


def _pmset_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample: Path) -> None:
    """A `pmset` that prints a published sample, first on PATH (no Mac here)."""
    script = tmp_path / "pmset"
    script.write_text(f'#!/bin/sh\n[ "$1 $2" = "-g therm" ] && exec cat {sample}\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_the_platform_chooses_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _pmset_on_path(tmp_path, monkeypatch, RECORDINGS / "pmset_therm_speed_limited.txt")
    assert isinstance(open_telemetry("cpu", platform="linux"), GpuTelemetry)
    reader = open_telemetry("metal", platform="darwin")
    assert isinstance(reader, MacTelemetry)
    counters = reader.finish(reader.start())
    assert counters["mac.telemetry"] == "pmset" and counters["mac.cpu_speed_limit_pct"] == 35
    assert counters["gpu.telemetry_unavailable"] == "the metal backend has no NVML device"


def test_a_mac_without_pmset_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    reader = open_telemetry("metal", platform="darwin")
    counters = reader.finish(reader.start())
    assert counters["mac.telemetry_unavailable"] == "no pmset on this host's PATH"
    assert "mac.telemetry" not in counters
