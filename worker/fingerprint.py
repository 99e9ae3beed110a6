"""The host fingerprint: what machine measured, in what state, and the labels it offers.

Linux reads /proc/cpuinfo, /proc/meminfo, /etc/os-release, uname and nvidia-smi when present;
macOS asks sysctl, system_profiler, sw_vers and pmset (power source, low-power mode, thermal
warnings). Every probe goes through a `Probe` (run a command, read a file) so the macOS paths
are tested with recorded outputs on Linux. A probe that fails leaves its field unknown (None),
never a guess.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coldbench.evidence.contract.schemas import HostInfo

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 15.0
_GIB = 1024**3


def _run_command(argv: Sequence[str]) -> str | None:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _read_file(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


@dataclass
class Probe:
    """Where facts come from: commands and files (swapped for recordings in tests)."""

    system: str = field(default_factory=platform.system)
    run: Callable[[Sequence[str]], str | None] = _run_command
    read: Callable[[str], str | None] = _read_file
    hostname: Callable[[], str] = socket.gethostname


def detect_backend() -> str:
    """`metal`, `cuda` or `cpu`: the device MLX runs on (the engine's own answer)."""
    from coldbench.engine.backend import detect_backend as engine_backend

    return engine_backend()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def memory_class(memory_bytes: int | None) -> str | None:
    """`mem:24g`: memory rounded to whole GiB, so hosts of one model share the label."""
    if not memory_bytes:
        return None
    return f"mem:{round(memory_bytes / _GIB)}g"


def automatic_labels(host: HostInfo) -> list[str]:
    labels = []
    if host.backend:
        labels.append(f"backend:{host.backend}")
    chip = host.chip or host.cpu
    if chip:
        labels.append(f"chip:{slug(chip)}")
    if host.gpu:
        labels.append(f"gpu:{slug(host.gpu)}")
    mem = memory_class(host.memory_bytes)
    if mem:
        labels.append(mem)
    if host.os:
        labels.append(f"os:{slug(host.os.split()[0])}")
    return labels


def host_labels(host: HostInfo, configured: Sequence[str]) -> list[str]:
    """Automatic labels plus the configured ones, deduplicated, order kept."""
    return list(dict.fromkeys([*automatic_labels(host), *configured]))


# --- Linux -----------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> tuple[str | None, int | None]:
    """(CPU model name, logical processors) from /proc/cpuinfo."""
    names = re.findall(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    processors = re.findall(r"^processor\s*:", text, re.MULTILINE)
    return (names[0].strip() if names else None, len(processors) or None)


def parse_meminfo(text: str) -> int | None:
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def parse_os_release(text: str) -> str | None:
    match = re.search(r'^PRETTY_NAME="?([^"\n]+)"?$', text, re.MULTILINE)
    return match.group(1).strip() if match else None


def parse_nvidia_smi(text: str) -> str | None:
    """GPU names from `nvidia-smi --query-gpu=name --format=csv,noheader`: `2x NVIDIA H200`."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        return None
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"
    return ", ".join(names)


def _linux(probe: Probe, host: HostInfo) -> None:
    cpu, cores = parse_cpuinfo(probe.read("/proc/cpuinfo") or "")
    host.cpu = cpu
    host.cores = cores
    host.memory_bytes = parse_meminfo(probe.read("/proc/meminfo") or "")
    host.os = parse_os_release(probe.read("/etc/os-release") or "")
    host.kernel = (probe.run(["uname", "-r"]) or "").strip() or None
    product = (probe.read("/sys/class/dmi/id/product_name") or "").strip()
    host.machine_model = product or None
    smi = probe.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    host.gpu = parse_nvidia_smi(smi) if smi else None
    # On a laptop, /sys says whether it runs on mains power.
    supply = probe.read("/sys/class/power_supply/AC/online")
    if supply is not None and supply.strip() in ("0", "1"):
        host.power_source = "ac" if supply.strip() == "1" else "battery"


# --- macOS -----------------------------------------------------------------------------------


def parse_system_profiler_hardware(text: str) -> dict[str, str]:
    """The first item of `system_profiler SPHardwareDataType -json`."""
    try:
        items = json.loads(text).get("SPHardwareDataType") or []
    except (json.JSONDecodeError, AttributeError):
        return {}
    return items[0] if items and isinstance(items[0], dict) else {}


def parse_gpu_cores(text: str) -> int | None:
    """GPU core count from `system_profiler SPDisplaysDataType -json` (Apple Silicon)."""
    try:
        items = json.loads(text).get("SPDisplaysDataType") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    for item in items:
        cores = str(item.get("sppci_cores", "")).strip()
        if cores.isdigit():
            return int(cores)
    return None


def parse_pmset_batt(text: str) -> str | None:
    """`Now drawing from 'AC Power'` -> `ac`; `'Battery Power'` -> `battery`."""
    match = re.search(r"drawing from '([^']+)'", text)
    if not match:
        return None
    source = match.group(1).lower()
    if "ac" in source.split():
        return "ac"
    if "battery" in source:
        return "battery"
    return slug(source) or None


def parse_low_power_mode(text: str) -> bool | None:
    """`pmset -g` lists ` lowpowermode 1` (or `powermode 1` on newer releases) when enabled."""
    match = re.search(r"^\s*(?:lowpowermode|powermode)\s+(\d+)", text, re.MULTILINE)
    return None if match is None else match.group(1) != "0"


def parse_thermal_state(text: str) -> str | None:
    """From `pmset -g therm`: `nominal` when no warning is recorded, else the warning levels."""
    if not text.strip():
        return None
    warnings = re.findall(r"(thermal|performance) warning level\s*(?:=|:)?\s*(\d+)", text, re.I)
    limit = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    parts = [f"{kind.lower()}-warning-{level}" for kind, level in warnings if level != "0"]
    if limit and int(limit.group(1)) < 100:
        parts.append(f"cpu-speed-limit-{limit.group(1)}")
    if parts:
        return ",".join(parts)
    if "No thermal warning level has been recorded" in text or warnings or limit:
        return "nominal"
    return None


def parse_apple_memory(text: str) -> int | None:
    """`physical_memory`: `512 GB` -> bytes."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*([GT])B", text or "")
    if not match:
        return None
    scale = _GIB if match.group(2) == "G" else 1024 * _GIB
    return int(float(match.group(1)) * scale)


def _darwin(probe: Probe, host: HostInfo) -> None:
    hardware = parse_system_profiler_hardware(
        probe.run(["system_profiler", "SPHardwareDataType", "-json"]) or ""
    )
    brand = (probe.run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "").strip()
    host.chip = hardware.get("chip_type") or brand or None
    host.cpu = brand or host.chip
    model = hardware.get("machine_name"), hardware.get("machine_model")
    host.machine_model = " ".join(filter(None, model)) or (
        (probe.run(["sysctl", "-n", "hw.model"]) or "").strip() or None
    )
    memsize = (probe.run(["sysctl", "-n", "hw.memsize"]) or "").strip()
    host.memory_bytes = (
        int(memsize) if memsize.isdigit() else parse_apple_memory(hardware.get("physical_memory"))
    )
    ncpu = (probe.run(["sysctl", "-n", "hw.ncpu"]) or "").strip()
    host.cores = int(ncpu) if ncpu.isdigit() else None
    gpu_cores = parse_gpu_cores(probe.run(["system_profiler", "SPDisplaysDataType", "-json"]) or "")
    if host.chip and gpu_cores:
        host.gpu = f"{host.chip} {gpu_cores}-core GPU"
    name = (probe.run(["sw_vers", "-productName"]) or "macOS").strip()
    version = (probe.run(["sw_vers", "-productVersion"]) or "").strip()
    host.os = f"{name} {version}".strip() if version else None
    host.kernel = (probe.run(["uname", "-r"]) or "").strip() or None
    host.power_source = parse_pmset_batt(probe.run(["pmset", "-g", "batt"]) or "")
    host.low_power_mode = parse_low_power_mode(probe.run(["pmset", "-g"]) or "")
    host.thermal_state = parse_thermal_state(probe.run(["pmset", "-g", "therm"]) or "")


def host_fingerprint(probe: Probe | None = None, *, backend: str | None = None) -> HostInfo:
    """The fingerprint of this host now (refreshed at each lease: power and thermal change)."""
    probe = probe or Probe()
    host = HostInfo(hostname=probe.hostname())
    if probe.system == "Darwin":
        _darwin(probe, host)
    else:
        _linux(probe, host)
    if host.cores is None:
        host.cores = os.cpu_count()
    host.backend = backend or detect_backend()  # type: ignore[assignment]
    return host
