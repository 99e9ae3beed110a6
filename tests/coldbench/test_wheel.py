"""The distribution as a user installs it: one import package, `coldbench`, beside Hugging Face's
`kernels` (which transformers 5.25 requires) in a clean venv, and a real `coldbench run` on the
micro preset from that install (not from this checkout).

Before the move to one namespace the wheel installed seven generic top-level packages (`api`,
`engine`, `evidence`, ...), and its fast-path package once had to be renamed because Hugging
Face's `kernels` shadowed it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")  # `make install` puts uv in the venv

pytestmark = pytest.mark.slow


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, **kwargs
    )


def test_the_wheel_installs_only_coldbench_beside_hugging_faces_kernels(
    tmp_path: Path, model_root: Path
) -> None:
    # sdist, then the wheel from it: both must carry the folders coldbench/ links
    built = _run(UV, "build", "--quiet", "--out-dir", tmp_path / "dist", REPO_ROOT, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("coldbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"coldbench"}, top
    for path in (
        "coldbench/kernels/__init__.py",
        "coldbench/engine/runner.py",
        "coldbench/api/main.py",
        "coldbench/migrations/env.py",
        "coldbench/web/templates/_field_error.html",
        "coldbench/evidence/rendering/templates/report.html.j2",
    ):
        assert path in names, path

    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", "--without-pip", venv, timeout=300).returncode == 0
    python = venv / "bin" / "python"
    extras = "worker" if sys.platform == "darwin" else "worker,cpu"
    installed = _run(
        *(UV, "pip", "install", "--quiet", "--python", python),
        *(f"coldbench[{extras}] @ {wheel.as_uri()}", "kernels", "transformers>=5.25"),
        timeout=900,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    # Away from this checkout: nothing of it on the path, so what runs is the installed wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    probe = _run(
        python,
        "-c",
        "import importlib.metadata as m, json, kernels, transformers, coldbench.kernels as ours\n"
        "print(json.dumps({'hf': kernels.__file__, 'ours': ours.__file__,\n"
        "    'transformers': transformers.__version__,\n"
        "    'top': sorted(m.packages_distributions().keys())}))",
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.splitlines()[-1])
    site = Path(found["ours"]).parents[2]
    assert found["hf"] == str(site / "kernels" / "__init__.py")
    assert found["ours"] == str(site / "coldbench" / "kernels" / "__init__.py")
    assert tuple(int(p) for p in found["transformers"].split(".")[:2]) >= (5, 25)
    assert not {"api", "engine", "evidence", "fastpaths", "migrations", "web", "worker"} & set(
        found["top"]
    )

    out = tmp_path / "out"
    run = _run(
        *(venv / "bin" / "coldbench", "run", "--model", "preset:micro"),
        *("--variant", "a", "--variant", "b:prefill_step_size=32", "--contexts", "64"),
        *("--rounds", "1", "--decode-tokens", "1", "--out", out, "--state-dir", tmp_path / "s"),
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in records if r["status"] == "ok"} == {"a", "b"}
    provenance = json.loads((out / "provenance.json").read_text())
    for target in provenance.get("runs", [provenance])[0]["targets"]:
        files = target["software"]["files"]
        assert files["engine"] == str(site / "coldbench" / "engine" / "__init__.py")
        assert files["kernels"] == str(site / "coldbench" / "kernels" / "__init__.py")
