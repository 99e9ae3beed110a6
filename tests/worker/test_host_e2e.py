"""benchmarks/host_e2e.py: a benchmark host end to end on the embedded default, as a rented GPU
host runs it, here on the CPU with the micro preset and a bundle of two commits of the engine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from coldbench.evidence.bundles.bundle import bundle_records, read_bundle, verify_bundle
from tests.conftest import IMPORT_PATH
from tests.worker.conftest import git

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_two_refs_from_a_bundle_through_service_celery_and_agent_give_a_verified_zip(
    coldbench_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path, tmp_path: Path
) -> None:
    repo, (main, step64) = coldbench_repo
    bundle = tmp_path / "cb.bundle"
    git(repo, "bundle", "create", str(bundle), main, step64)
    out = tmp_path / "evidence"
    # Started from the repository root, as on the GPU machine: the variant processes must
    # still run each ref's worktree, not this checkout's engine/ (the offline recipe).
    done = subprocess.run(
        [
            *(sys.executable, "benchmarks/host_e2e.py", "--repo", str(bundle)),
            *("--ref", main, "--ref", step64, "--model", str(micro_model_dir)),
            *("--contexts", "128", "--rounds", "1", "--decode-tokens", "1", "--first-seed", "3"),
            *("--out", str(out), "--workdir", str(tmp_path / "work"), "--timeout-s", "400"),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(IMPORT_PATH)},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["verify"] == "ok", result
    zip_path = Path(result["zip"])
    assert zip_path.parent == out and verify_bundle(zip_path).is_intact
    # the seed asked for is the job's (jobs of several invocations prompt differently)
    assert result["seed"] == 3 and json.loads(read_bundle(zip_path)["job.json"])["seed"] == 3
    commits = {name: git(repo, "rev-parse", name) for name in (main, step64)}
    assert result["variants"] == commits
    assert result["cells"] == result["cells_ok"] == 2
    for key in ("startup_s", "time_to_first_cell_s", "time_to_upload_s", "measuring_s"):
        assert 0 < result[key] < result["wall_s"], key
    assert result["time_to_upload_s"] <= result["time_to_first_evidence_s"]
    assert result["cells_per_minute"] > result["cells_per_minute_end_to_end"] > 0
    # where the time went, from the evidence the service rendered (the run's timeline.json)
    assert 0 < result["duty_cycle"] <= 1 and result["blocks"] == 1
    assert result["phases"]["first_block"]["load_s"] > 0
    assert "measuring until decided" in result["block_rule"]  # the default: looks in whole blocks
    # each ref's own engine ran: the step-64 branch's default cuts 128 tokens into two chunks
    timed = [r for r in bundle_records(read_bundle(zip_path)) if r.round >= 0]
    assert {r.variant: r.counters["chunk_widths"] for r in timed} == {main: "128", step64: "64x2"}
    # everything it started is stopped: the API no longer answers
    with pytest.raises(httpx.HTTPError):
        httpx.get(result["api"] + "/healthz", timeout=2)


_SERVICE_IMPORTS = """
import json, os, sys, tempfile
from pathlib import Path
from coldbench.demo import demo_env
os.environ.update(demo_env(Path(tempfile.mkdtemp())))
from typer.testing import CliRunner
from coldbench.api.cli import app
assert CliRunner().invoke(app, ["db", "upgrade"]).exit_code == 0
from fastapi.testclient import TestClient
from coldbench.api.app import create_app
with TestClient(create_app()) as client:  # the embedded default: SQLite through asyncio
    assert client.get("/healthz").status_code == 200
    client.get("/api/v1/hosts")
from coldbench.api.celery_app import celery_app
with celery_app.connection_for_write() as connection:  # kombu's SQLAlchemy transport
    connection.ensure_connection(max_retries=1)
import celery.bin.celery, uvicorn  # `coldbench celery worker`, `coldbench server`
import coldbench.submit, coldbench.evidence.rendering.report, coldbench.worker.agent
import coldbench.worker.cli, coldbench.worker.run
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_wheels_list_names_what_the_service_imports(tmp_path: Path) -> None:
    """A fresh GPU image once failed at `coldbench admin enroll` (no greenlet, no aiosqlite):
    every distribution the service, its Celery worker and the agent load must be a pinned wheel
    of benchmarks/host_e2e_wheels.txt or on the image (its `# image:` line), and every wheel
    there must be used (tzdata only where the system lacks zoneinfo). `# optional:` names what
    a package imports only where it is installed."""
    import importlib.metadata

    text = (REPO_ROOT / "benchmarks" / "host_e2e_wheels.txt").read_text()
    wheels = {_normal(line.split("==")[0]) for line in text.splitlines() if "==" in line}
    listed = {
        key: {_normal(name) for name in line.removeprefix(f"# {key}: ").split()}
        for line in text.splitlines()
        for key in ("image", "optional")
        if line.startswith(f"# {key}: ")
    }
    image, optional = listed["image"], listed["optional"]
    done = subprocess.run(
        [sys.executable, "-c", _SERVICE_IMPORTS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    modules = json.loads(done.stdout.splitlines()[-1])
    owners = importlib.metadata.packages_distributions()
    loaded = {_normal(dist) for module in modules for dist in owners.get(module, [])}
    loaded -= {"coldbench", *optional}
    assert sorted(loaded - wheels - image) == []
    assert sorted(wheels - loaded - {"tzdata"}) == []
