"""Each variant's process fingerprints the MLX build it loaded (engine/mlx_build.py), and the
evidence says when the variants of a run loaded different ones.

Variant `b` imports a copy of the installed mlx package whose libmlx has one byte changed (the
last byte: the ELF section headers, which the dynamic loader never reads, so the copy loads and
computes): a real second build, loaded by a real variant process."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import mlx.core as mx

from coldbench.engine.plan import Plan
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.records import parse_records
from coldbench.evidence.contract.schemas import HostInfo, ModelInfo, SoftwareInfo, VariantSpec
from coldbench.evidence.rendering.headline import caveats
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.worker.provenance import run_provenance, target_info
from coldbench.worker.schedule import plan_rounds
from coldbench.worker.variants import VariantLaunch, engine_root, run_schedule


def _patched_mlx(where: Path) -> Path:
    """A site folder holding a copy of the installed mlx (and its vendored libraries) whose
    libmlx differs from the installed one in one byte."""
    package = Path(mx.__file__).resolve().parent
    where.mkdir()
    shutil.copytree(package, where / "mlx")
    for vendored in package.parent.glob("mlx*.libs"):
        shutil.copytree(vendored, where / vendored.name)
    (library,) = (where / "mlx" / "lib").glob("libmlx.*")
    data = bytearray(library.read_bytes())
    data[-1] ^= 0x01
    library.write_bytes(bytes(data))
    return where


def test_variants_that_loaded_different_mlx_builds_get_the_caveat(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    site = _patched_mlx(tmp_path / "site")

    def launch(name: str, env: dict[str, str] | None = None) -> VariantLaunch:
        plan = Plan(
            run_id="r-builds",
            variant=name,
            adapter="embedded",
            model=str(micro_model_dir),
            decode_tokens=1,
            warmup_contexts=[32],
        )
        return VariantLaunch(name=name, python=sys.executable, plan=plan, env=env or {})

    patched = {"PYTHONPATH": f"{site}:{engine_root()}"}
    outcome = run_schedule(
        [launch("a"), launch("b", patched)],
        plan_rounds(["a", "b"], [32], seed=0, rounds=1),
        workdir=tmp_path / "run",
        cell_timeout_s=120,
    )
    builds = {name: target["software"]["mlx_build"] for name, target in outcome.targets.items()}
    assert builds["a"]["origin"] == "wheel" and builds["a"]["record_matches"] is True
    # b's process loaded the copy: its own libmlx, no distribution owns it, another digest
    assert any(lib["path"].startswith(str(site)) for lib in builds["b"]["libraries"])
    assert builds["b"]["origin"] == "unknown"
    assert builds["a"]["digest"] != builds["b"]["digest"]
    assert builds["a"]["version"] == builds["b"]["version"] == mx.__version__

    targets = [
        target_info(VariantSpec(name=name), adapter="embedded", ready_target=outcome.targets[name])
        for name in ("a", "b")
    ]
    provenance = run_provenance(
        run_id="r-builds",
        host=HostInfo(backend="cpu"),
        software=SoftwareInfo(),
        targets=targets,
        model=ModelInfo(name="micro"),
        spec=None,
        command="test",
    )
    records, problems = parse_records((tmp_path / "run" / "records.jsonl").read_bytes())
    assert not problems
    summary = summarize(records, baseline="a", provenances=[provenance])
    assert summary.mlx_builds is not None
    assert summary.mlx_builds.runs_with_different_builds == ["r-builds"]
    (caveat,) = [c for c in caveats(summary) if "different MLX builds" in c]
    assert "variants ran different MLX builds" in caveat
    assert "variants ran different MLX builds" in render_summary_md(summary, [provenance])

    # the same build in both: no caveat
    same = provenance.model_copy(
        update={"targets": [targets[0], targets[0].model_copy(update={"variant": "b"})]}
    )
    summary = summarize(records, baseline="a", provenances=[same])
    assert summary.mlx_builds is not None and summary.mlx_builds.runs_with_different_builds == []
    assert not [c for c in caveats(summary) if "MLX builds" in c]
