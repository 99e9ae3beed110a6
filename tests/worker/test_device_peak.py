"""The device peak a run's provenance records (worker/provenance.py): the chip table's for a
GPU, a matmul measured now for the CPU; and the model shape its FLOPs follow from."""

from __future__ import annotations

from pathlib import Path

from coldbench.evidence.analysis.peak import prefill_flops
from coldbench.evidence.contract.schemas import HostInfo
from coldbench.worker.provenance import device_peak, model_info


def test_a_cpu_host_measures_its_peak_and_a_gpu_host_reads_the_table() -> None:
    measured = device_peak(HostInfo(backend="cpu", cpu="test CPU"))
    assert measured is not None and measured.measured and measured.tflops > 0
    assert measured.device == "CPU: test CPU" and "matmuls" in measured.source
    table = device_peak(HostInfo(backend="cuda", gpu="NVIDIA H200"))
    assert table is not None and not table.measured and table.tflops == 989.5
    assert device_peak(HostInfo(backend="cuda", gpu="NVIDIA A10G")) is None


def test_the_models_shape_is_in_its_provenance(tiny_model_dir: Path) -> None:
    shape = model_info("preset:tiny", tiny_model_dir).shape
    assert shape is not None and shape.hidden == 256 and shape.head_dim == 64
    assert prefill_flops(shape, 64) and prefill_flops(shape, 64) > 0  # type: ignore[operator]
