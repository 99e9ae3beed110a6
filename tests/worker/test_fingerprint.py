from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from coldbench.evidence.contract.schemas import HostInfo
from coldbench.worker.fingerprint import (
    Probe,
    automatic_labels,
    host_fingerprint,
    host_labels,
    memory_class,
    parse_low_power_mode,
    parse_nvidia_smi,
    parse_pmset_batt,
    parse_thermal_state,
)

RECORDINGS = Path(__file__).parent / "recordings"


def _recording(name: str) -> str:
    return (RECORDINGS / name).read_text()


def _darwin_probe(*, batt: str, therm: str, pmset: str = "darwin_pmset_g.txt") -> Probe:
    """A Mac Studio as recorded: every command the macOS path runs has an answer here."""
    answers = {
        ("system_profiler", "SPHardwareDataType", "-json"): _recording("darwin_sp_hardware.json"),
        ("system_profiler", "SPDisplaysDataType", "-json"): _recording("darwin_sp_displays.json"),
        ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M3 Ultra\n",
        ("sysctl", "-n", "hw.memsize"): "549755813888\n",
        ("sysctl", "-n", "hw.ncpu"): "32\n",
        ("sw_vers", "-productName"): "macOS\n",
        ("sw_vers", "-productVersion"): "26.1\n",
        ("uname", "-r"): "25.1.0\n",
        ("pmset", "-g", "batt"): _recording(batt),
        ("pmset", "-g"): _recording(pmset),
        ("pmset", "-g", "therm"): _recording(therm),
    }
    asked: list[tuple[str, ...]] = []

    def run(argv: Sequence[str]) -> str | None:
        asked.append(tuple(argv))
        return answers.get(tuple(argv))

    probe = Probe(system="Darwin", run=run, read=lambda _: None, hostname=lambda: "studio-1")
    probe.asked = asked  # type: ignore[attr-defined]
    return probe


def test_macos_fingerprint_from_recorded_outputs() -> None:
    probe = _darwin_probe(batt="darwin_pmset_batt_ac.txt", therm="darwin_pmset_therm_nominal.txt")
    host = host_fingerprint(probe, backend="metal")
    assert host.hostname == "studio-1"
    assert host.chip == "Apple M3 Ultra"
    assert host.machine_model == "Mac Studio Mac15,14"
    assert host.memory_bytes == 512 * 1024**3
    assert host.cores == 32
    assert host.gpu == "Apple M3 Ultra 80-core GPU"
    assert host.os == "macOS 26.1"
    assert host.kernel == "25.1.0"
    assert host.power_source == "ac"
    assert host.low_power_mode is True
    assert host.thermal_state == "nominal"
    assert automatic_labels(host) == [
        "backend:metal",
        "chip:apple-m3-ultra",
        "gpu:apple-m3-ultra-80-core-gpu",
        "mem:512g",
        "os:macos",
    ]


def test_macos_on_battery_and_throttled_is_recorded_as_such() -> None:
    probe = _darwin_probe(batt="darwin_pmset_batt_battery.txt", therm="darwin_pmset_therm_hot.txt")
    host = host_fingerprint(probe, backend="metal")
    assert host.power_source == "battery"
    assert host.thermal_state == "performance-warning-2,cpu-speed-limit-78"


def test_macos_probes_that_fail_leave_fields_unknown() -> None:
    probe = Probe(system="Darwin", run=lambda argv: None, read=lambda _: None, hostname=lambda: "m")
    host = host_fingerprint(probe, backend="metal")
    assert host.chip is None and host.memory_bytes is None and host.power_source is None
    assert host.low_power_mode is None and host.thermal_state is None
    assert host.cores == os.cpu_count()


def test_linux_fingerprint_of_this_machine_matches_proc() -> None:
    host = host_fingerprint(backend="cpu")
    cpuinfo = Path("/proc/cpuinfo").read_text()
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    assert host.cpu == names[0].strip()
    assert host.cores == cpuinfo.count("processor\t:")
    kib = int(re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text()).group(1))
    assert host.memory_bytes == kib * 1024
    assert host.kernel == os.uname().release
    assert host.os and host.os in Path("/etc/os-release").read_text()
    labels = host_labels(host, ["lab:home", "backend:cpu"])
    assert labels[0] == "backend:cpu" and labels[-1] == "lab:home"
    assert labels.count("backend:cpu") == 1
    assert f"mem:{round(kib * 1024 / 1024**3)}g" in labels
    HostInfo.model_validate(host.model_dump())


def test_linux_nvidia_smi_when_present() -> None:
    answers = {("nvidia-smi", "--query-gpu=name", "--format=csv,noheader"): "NVIDIA H200\n" * 2}
    probe = Probe(
        system="Linux",
        run=lambda argv: answers.get(tuple(argv)),
        read=lambda path: None,
        hostname=lambda: "gpu-1",
    )
    host = host_fingerprint(probe, backend="cuda")
    assert host.gpu == "2x NVIDIA H200"
    assert "gpu:2x-nvidia-h200" in automatic_labels(host)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Now drawing from 'AC Power'", "ac"),
        ("Now drawing from 'Battery Power'", "battery"),
        ("garbage", None),
    ],
)
def test_pmset_batt(text: str, expected: str | None) -> None:
    assert parse_pmset_batt(text) == expected


def test_small_parsers() -> None:
    assert parse_low_power_mode(" lowpowermode 0\n") is False
    assert parse_low_power_mode(" powermode 1\n") is True
    assert parse_low_power_mode("nothing") is None
    assert parse_thermal_state("") is None
    assert parse_nvidia_smi("A100\nH100\n") == "A100, H100"
    assert memory_class(None) is None
    assert memory_class(24683652 * 1024) == "mem:24g"
