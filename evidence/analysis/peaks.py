"""Peak FLOP rates of the chips coldbench runs on, with where each figure comes from.

A prefill's achieved FLOP rate (evidence/analysis/peak.py) is held against its device's peak: a
share near or above 1 means the timing is wrong (an un-synchronized clock, a cell that did not run
what it says), and the share of the fastest variant says how far it is from the limit.

NVIDIA figures are the datasheets' dense bf16 Tensor Core rates (the datasheets print the rate
with 2:4 sparsity, twice the dense one). Apple publishes no FLOP rate for its GPUs: the Apple
figures are derived as GPU cores x 128 FP32 lanes x 2 FLOP per FMA x the GPU's clock (third-party
measurements of the clock; Apple GPUs run fp16/bf16 at the fp32 rate) and are marked
unverified. The CPU has no table entry: the worker measures a short matmul on the host
(engine/peak.py) and records that as the device's peak (`measured`).

Matched against the host fingerprint's `gpu` (nvidia-smi's name, or `Apple M3 Ultra 80-core
GPU`) or `chip`; the first pattern that matches wins, so more specific names come first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coldbench.evidence.contract.schemas import DevicePeak, HostInfo

_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, BF16 Tensor Core"
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (datasheet, BF16 Tensor Core"
_APPLE = (
    "derived, unverified: {cores} GPU cores x 128 FP32 lanes x 2 FLOP/FMA x {clock} GHz "
    "(Apple publishes no FLOP rate; clock from third-party measurements)"
)


@dataclass(frozen=True)
class ChipPeak:
    device: str
    pattern: str  # a regular expression searched in the host's gpu, then chip
    tflops: float
    dtype: str
    source: str


def _apple(device: str, pattern: str, cores: int, clock_ghz: float) -> ChipPeak:
    return ChipPeak(
        device=device,
        pattern=pattern,
        tflops=round(cores * 128 * 2 * clock_ghz / 1000, 1),
        dtype="fp32 FMA rate (fp16/bf16 run at it)",
        source=_APPLE.format(cores=cores, clock=clock_ghz),
    )


CHIP_PEAKS: tuple[ChipPeak, ...] = (
    ChipPeak(
        "NVIDIA H100 NVL", r"H100 NVL", 835.5, "bf16 dense", f"{_NVIDIA_H100} 1,671 sparse / 2)"
    ),
    ChipPeak(
        "NVIDIA H100 PCIe", r"H100 PCIe", 756.5, "bf16 dense", f"{_NVIDIA_H100} 1,513 sparse / 2)"
    ),
    ChipPeak(
        "NVIDIA H100 SXM",
        r"H100( 80GB HBM3| SXM)",
        989.5,
        "bf16 dense",
        f"{_NVIDIA_H100} 1,979 sparse / 2)",
    ),
    ChipPeak(
        "NVIDIA H200 NVL", r"H200 NVL", 835.5, "bf16 dense", f"{_NVIDIA_H200} 1,671 sparse / 2)"
    ),
    ChipPeak("NVIDIA H200 SXM", r"H200", 989.5, "bf16 dense", f"{_NVIDIA_H200} 1,979 sparse / 2)"),
    _apple("Apple M3 Ultra 80-core GPU", r"M3 Ultra 80-core", 80, 1.4),
    _apple("Apple M3 Ultra 60-core GPU", r"M3 Ultra 60-core", 60, 1.4),
    _apple("Apple M4 Max 40-core GPU", r"M4 Max 40-core", 40, 1.58),
    _apple("Apple M4 Max 32-core GPU", r"M4 Max 32-core", 32, 1.58),
)


def table_peak(host: HostInfo) -> DevicePeak | None:
    """The table's peak for this host's GPU (None: not in the table, or a CPU host)."""
    if host.backend == "cpu":
        return None
    for text in (host.gpu, host.chip):
        for chip in CHIP_PEAKS:
            if text and re.search(chip.pattern, text):
                return DevicePeak(
                    device=chip.device, tflops=chip.tflops, dtype=chip.dtype, source=chip.source
                )
    return None
