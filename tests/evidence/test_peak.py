"""Each prefill against its device's peak (evidence/analysis/peak.py,
evidence/analysis/peaks.py)."""

from __future__ import annotations

import pytest

from coldbench.evidence.analysis.peak import prefill_flops
from coldbench.evidence.analysis.peaks import table_peak
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import DevicePeak, HostInfo, ModelShape
from coldbench.evidence.rendering.markdown import render_summary_md
from tests.evidence.builders import provenance, simulate_run

# Llama 3 8B's config.json sizes (the llama-8b-shape preset).
LLAMA_8B = ModelShape.from_config(
    {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
)
H100 = DevicePeak(device="NVIDIA H100 SXM", tflops=989.5, dtype="bf16 dense", source="datasheet")


def test_the_flops_of_a_prefill_follow_the_shape() -> None:
    assert LLAMA_8B is not None and LLAMA_8B.head_dim == 128 and LLAMA_8B.kv_heads == 8
    # 6.98e9 matmul parameters in the layers (DESIGN.md's "7.0 B"), each 2 FLOPs per token
    layers = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert layers == 6_979_321_856
    for tokens in (1, 4096, 16384):
        attention = 4 * 32 * 4096 * tokens * (tokens + 1) / 2
        expected = 2 * tokens * layers + 2 * 4096 * 128256 + attention
        assert prefill_flops(LLAMA_8B, tokens) == pytest.approx(expected, rel=1e-12)
    # at 16K causal attention is nearly a quarter of the work: what tok/s alone hides
    share = 4 * 32 * 4096 * 16384 * 16385 / 2 / prefill_flops(LLAMA_8B, 16384)  # type: ignore[operator]
    assert 0.23 < share < 0.24
    assert prefill_flops(LLAMA_8B.model_copy(update={"experts": 8}), 64) is None


@pytest.mark.parametrize(
    ("gpu", "chip", "backend", "device"),
    [
        ("NVIDIA H100 80GB HBM3", None, "cuda", "NVIDIA H100 SXM"),
        ("2x NVIDIA H100 80GB HBM3", None, "cuda", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", None, "cuda", "NVIDIA H100 PCIe"),
        ("NVIDIA H200", None, "cuda", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", None, "cuda", "NVIDIA H200 NVL"),
        ("Apple M3 Ultra 80-core GPU", "Apple M3 Ultra", "metal", "Apple M3 Ultra 80-core GPU"),
        ("Apple M4 Max 40-core GPU", "Apple M4 Max", "metal", "Apple M4 Max 40-core GPU"),
        (None, "Intel Xeon", "cpu", None),
        ("NVIDIA A10G", None, "cuda", None),
    ],
)
def test_the_chip_table_names_each_device_with_its_source(
    gpu: str | None, chip: str | None, backend: str, device: str | None
) -> None:
    found = table_peak(HostInfo(gpu=gpu, chip=chip, backend=backend))  # type: ignore[arg-type]
    assert (found.device if found else None) == device
    if found is not None:
        assert found.source and found.tflops > 0
    if device and device.startswith("NVIDIA H"):
        assert found is not None and found.dtype == "bf16 dense"
        assert found.tflops == (989.5 if "SXM" in device else found.tflops)


def _summary(seconds_scale: float, peak: DevicePeak | None = H100) -> object:
    # simulated tok/s of about 1000: put 8B-shaped FLOPs on them and scale the time
    records = simulate_run(effects={"base": 1.0, "pr": 1.2}, contexts=(4096,), rounds=6)
    records = [
        r.model_copy(update={"prefill_s": r.prefill_s * seconds_scale}) if r.prefill_s else r
        for r in records
    ]
    prov = provenance()
    prov = prov.model_copy(
        update={
            "model": prov.model.model_copy(update={"shape": LLAMA_8B}),
            "device_peak": peak,
        }
    )
    return summarize(records, baseline="base", provenances=[prov]), prov


def test_summary_gives_tflops_and_share_of_peak_per_context() -> None:
    # 4096 tokens at ~0.98 s a cell, scaled to 0.25 s: about 240 TFLOP/s
    summary, prov = _summary(0.25 / 4.1)
    peak = summary.peak
    assert peak is not None and peak.runs[0].peak_tflops == 989.5 and peak.runs[0].over_peak == 0
    rates = {r.variant: r for r in peak.rates}
    flops = prefill_flops(LLAMA_8B, 4096)
    assert rates["base"].flops_per_cell == flops
    assert 100 < rates["base"].tflops_median < rates["pr"].tflops_median < 989.5
    assert rates["pr"].share_of_peak == pytest.approx(rates["pr"].tflops_median / 989.5)
    text = render_summary_md(summary, [prov])
    assert "Achieved FLOP rate" in text and "the fastest, pr, reaches" in text
    assert "of the peak is left" in text
    assert "peak" in summary.to_json_value()


def test_a_cell_faster_than_the_device_can_compute_is_invalid() -> None:
    # times cut 20x: about 4,800 TFLOP/s, five times an H100's peak
    summary, _ = _summary(0.25 / 4.1 / 20)
    assert summary.peak is not None and summary.peak.runs[0].over_peak == 12
    assert summary.invalid.total == 12
    (reason,) = summary.invalid.by_reason
    assert "faster than the NVIDIA H100 SXM peak of 989.5 TFLOP/s" in reason
    assert "timing is wrong" in reason
    assert all(c.n == 0 for c in summary.comparisons)


def test_a_measured_cpu_peak_invalidates_nothing_and_no_peak_gives_no_share() -> None:
    cpu = DevicePeak(device="CPU", tflops=100.0, dtype="float32", source="measured", measured=True)
    summary, _ = _summary(0.25 / 4.1 / 20, peak=cpu)  # ~4,800 TFLOP/s: 48 x the measured 100
    assert summary.invalid.total == 0 and summary.peak is not None
    assert all(r.share_of_peak is not None for r in summary.peak.rates)
    summary, _ = _summary(0.25 / 4.1, peak=None)
    assert summary.peak is not None and summary.invalid.total == 0
    assert all(r.share_of_peak is None for r in summary.peak.rates)
