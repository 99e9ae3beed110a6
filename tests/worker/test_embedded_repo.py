"""Branches of coldbench's own engine: a repository declared `adapter = "embedded"`.

`coldbench_repo` (tests/conftest.py) is a small git copy of this repository's engine/,
kernels/ and evidence/ whose `step-64` commit changes one engine flag's default (and whose
`fastpaths-name` and `kernels-name` commits are trees from before the move, whose packages
are top-level `engine` with `fastpaths`, or with `kernels` before that package's rename). Each
variant's ref is checked out in its own worktree and installed into its own venv, and its
process must run that worktree's engine/ and fast-path package, not the orchestrator's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from coldbench.evidence.contract.records import read_records
from coldbench.worker.config import ConfigError, local_repository, parse_host_config
from tests.conftest import PRE_MOVE_BRANCH, PRE_RENAME_BRANCH, SWIGLU_ON_BRANCH
from tests.stack import Stack, stop_process

pytestmark = pytest.mark.slow


def _commit(repo: Path, ref: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", ref], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_two_commits_run_as_variants_each_attributed_to_its_commit_and_files(
    coldbench_cmd: list[str],
    coldbench_repo: tuple[Path, tuple[str, str]],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    repo, (main, step64) = coldbench_repo
    out = tmp_path / "embedded"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--adapter", "embedded"),
            *("--variant", f"main:ref={main}", "--variant", f"step:ref={step64}"),
            *(
                "--model",
                "preset:micro",
                "--contexts",
                "128",
                "--rounds",
                "2",
                "--decode-tokens",
                "2",
            ),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert verify_bundle(out).is_intact
    provenance = json.loads((out / "provenance.json").read_text())
    run = provenance.get("runs", [provenance])[0]
    assert "--adapter embedded" in run["command"]
    targets = {t["variant"]: t for t in run["targets"]}
    commits = {"main": _commit(repo, main), "step": _commit(repo, step64)}
    checkouts = set()
    for name, target in targets.items():
        assert target["adapter"] == "embedded"
        assert target["commit"] == commits[name]
        checkout = Path(target["checkout"]).resolve()
        checkouts.add(checkout)
        assert not checkout.is_relative_to(Path(__file__).resolve().parents[2])
        # the variant's own process imported the worktree's engine/ and kernels/
        assert target["engine_module_file"] == str(checkout / "engine" / "__init__.py")
        files = target["software"]["files"]
        assert files["engine"] == str(checkout / "engine" / "__init__.py")
        assert files["kernels"] == str(checkout / "kernels" / "__init__.py")
        assert target["ready"]["checkout"] == str(checkout)
        assert target["build_module_file"] == target["engine_module_file"]
    assert len(checkouts) == 2
    # the flag difference is in the counters: stock 2048 takes 128 tokens in one chunk, the
    # branch's default of 64 in two
    records = [r for r in read_records(out / "records.jsonl") if r.round >= 0]
    assert len(records) == 4 and all(r.status == "ok" for r in records), records
    widths = {r.variant: r.counters["chunk_widths"] for r in records}
    assert widths == {"main": "128", "step": "64x2"}
    summary_md = (out / "summary.md").read_text()
    assert commits["step"][:12] in summary_md and "step-64" in summary_md


def test_refs_from_before_the_move_run_their_own_top_level_packages(
    coldbench_cmd: list[str],
    coldbench_repo: tuple[Path, tuple[str, str]],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    """Commits from before the move to one namespace (top-level `engine` with `fastpaths`, and
    before that package's rename with `kernels`) build with the default editable recipe beside
    a current one (`coldbench.engine`, `coldbench.kernels`; also where Hugging Face's `kernels`,
    which transformers 5.25 requires, is installed), and each variant's process runs and
    reports its own worktree's packages under its own names."""
    repo, (main, _) = coldbench_repo
    out = tmp_path / "renamed"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--adapter", "embedded"),
            *("--variant", f"main:ref={main}", "--variant", f"moved:ref={PRE_MOVE_BRANCH}"),
            *("--variant", f"old:ref={PRE_RENAME_BRANCH}"),
            *("--model", "preset:micro", "--contexts", "128", "--rounds", "1"),
            *("--decode-tokens", "2"),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert verify_bundle(out).is_intact
    provenance = json.loads((out / "provenance.json").read_text())
    targets = {t["variant"]: t for t in provenance.get("runs", [provenance])[0]["targets"]}
    for name, ref, package, other, namespace in (
        ("main", main, "kernels", "fastpaths", True),
        ("moved", PRE_MOVE_BRANCH, "fastpaths", "kernels", False),
        ("old", PRE_RENAME_BRANCH, "kernels", "fastpaths", False),
    ):
        target = targets[name]
        assert target["commit"] == _commit(repo, ref)
        checkout = Path(target["checkout"]).resolve()
        assert (checkout / package / "__init__.py").is_file()
        assert not (checkout / other).exists()
        assert (checkout / "coldbench" / "engine").is_symlink() == namespace
        files = target["software"]["files"]
        assert files[package] == str(checkout / package / "__init__.py")
        assert other not in files
        assert target["build_module_file"] == str(checkout / "engine" / "__init__.py")
        assert target["engine_module_file"] == str(checkout / "engine" / "__init__.py")
    records = [r for r in read_records(out / "records.jsonl") if r.round >= 0]
    assert {r.variant for r in records} == {"main", "moved", "old"}
    assert all(r.status == "ok" for r in records), records


def test_a_variant_whose_engine_is_not_the_checkouts_refuses_to_run(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    # A checkout that holds an engine/ that is never imported: this checkout's comes first.
    checkout = tmp_path / "other"
    (checkout / "engine").mkdir(parents=True)
    (checkout / "engine" / "__init__.py").write_text("")
    plan = {
        "run_id": "r",
        "variant": "v",
        "adapter": "embedded",
        "model": str(micro_model_dir),
        "records_path": str(tmp_path / "v.jsonl"),
        "checkout": str(checkout),
        "cells": [{"round": 0, "order": 0, "context_tokens": 64}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
        check=False,
    )
    assert done.returncode == 2
    event = json.loads(done.stdout.splitlines()[-1])
    assert event["event"] == "error"
    assert event["reason"].startswith("refusing to run: coldbench.engine was imported from")
    assert f"not from inside the checkout {checkout.resolve()}" in event["reason"]


def test_embedded_repositories_in_worker_toml(tmp_path: Path) -> None:
    raw = {
        "name": "h200",
        "repositories": {
            "coldbench": {
                "url": str(tmp_path),
                "adapter": "embedded",
                "recipes": {"editable": {"command": ["{python}", "-m", "pip", "install", "."]}},
            }
        },
    }
    repository = parse_host_config(raw, base=tmp_path).repositories["coldbench"]
    assert (repository.adapter, repository.module) == ("embedded", "coldbench.engine")
    (tmp_path / ".git").mkdir()
    assert local_repository(tmp_path, adapter="embedded").module == "coldbench.engine"
    assert local_repository(tmp_path).module == "mlx_lm"
    with pytest.raises(ConfigError, match="--adapter 'vllm': choose one of embedded"):
        local_repository(tmp_path, adapter="vllm")


@pytest.mark.postgres
def test_a_host_runs_a_submitted_job_on_two_commits_of_its_embedded_repository(
    coldbench_repo: tuple[Path, tuple[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
    service: Stack,
) -> None:
    """Through the service: worker.toml declares the repository `adapter = "embedded"`, a job
    asks for it by name, and each variant is attributed to its commit and its worktree's files."""
    repo, (main, step64) = coldbench_repo
    root = tmp_path_factory.mktemp("embedded-host")
    config = root / "worker.toml"
    config.write_text(
        'name = "host-e"\nstate_dir = "state"\nallow_presets = ["micro"]\n'
        f'[repositories.engine]\nurl = "{repo}"\nadapter = "embedded"\n'
        "[repositories.engine.recipes.editable]\n"
        'command = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", '
        '"-e", "."]\n'
    )
    log = root / "agent.log"
    agent = service.start_agent(config, token=service.enrollment_token(), log=log)
    try:
        service.wait_hosts({"host-e"}, [(agent, log)])
        created = service.submit(
            {
                "adapter": "embedded",
                "repository": "engine",
                "variants": [{"name": "main", "ref": main}, {"name": "step", "ref": step64}],
                "contexts": [128],
                "rounds": 2,
                "decode_tokens": 1,
                "model": "preset:micro",
            }
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        job = service.wait_jobs([job_id], timeout_s=400, done=("completed", "processed", "failed"))
        (run,) = job[job_id]["runs"]
        agent_log = log.read_text() if log.exists() else ""
        assert run["state"] in ("completed", "processed"), (run, agent_log[-3000:])
        provenance = json.loads(service.artifact(run["id"], "provenance.json"))
        targets = {t["variant"]: t for t in provenance.get("runs", [provenance])[0]["targets"]}
        for name, ref in (("main", main), ("step", step64)):
            target = targets[name]
            assert target["commit"] == _commit(repo, ref)
            checkout = root / "state" / "worktrees" / "engine" / target["commit"]
            assert target["engine_module_file"] == str(checkout / "engine" / "__init__.py")
            files = target["software"]["files"]
            assert files["kernels"] == str(checkout / "kernels" / "__init__.py")
        lines = service.artifact(run["id"], "records.jsonl").decode().splitlines()
        measured = [r for r in map(json.loads, lines) if r["round"] >= 0]
        widths = {r["variant"]: r["counters"]["chunk_widths"] for r in measured}
        assert widths == {"main": "128", "step": "64x2"}
    finally:
        stop_process(agent)


def test_offline_recipe_runs_branches_without_a_package_index(
    coldbench_cmd: list[str],
    coldbench_repo: tuple[Path, tuple[str, str]],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    """`--recipe offline` installs nothing (a GPU host with no registry): pip pointed at a dead
    index proves it is never asked, the variants still run their worktrees, and a fast path
    requested on this CPU is recorded as not exercised, never as the fast path's time."""
    repo, (main, step64) = coldbench_repo
    out = tmp_path / "offline"
    env = {
        **os.environ,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
    }
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--adapter", "embedded", "--recipe", "offline"),
            *("--variant", f"main:ref={main}"),
            *("--variant", f"fast:ref={step64},fused_swiglu=true"),
            *("--variant", f"branch:ref={SWIGLU_ON_BRANCH}"),
            *(
                "--model",
                "preset:micro",
                "--contexts",
                "128",
                "--rounds",
                "1",
                "--decode-tokens",
                "2",
            ),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert verify_bundle(out).is_intact
    provenance = json.loads((out / "provenance.json").read_text())
    run = provenance.get("runs", [provenance])[0]
    targets = {t["variant"]: t for t in run["targets"]}
    for name, ref in (("main", main), ("fast", step64)):
        target = targets[name]
        assert target["commit"] == _commit(repo, ref)
        assert target["recipe"] == "offline"
        checkout = Path(target["checkout"]).resolve()
        fast_paths_file = target["software"]["files"]["kernels"]
        assert fast_paths_file == str(checkout / "kernels" / "__init__.py")
        assert target["build_module_file"] == str(checkout / "engine" / "__init__.py")
    records = [r for r in read_records(out / "records.jsonl") if r.round >= 0]
    assert {r.status for r in records if r.variant == "main"} == {"ok"}
    fast = [r for r in records if r.variant == "fast"]
    assert fast and all(r.status == "invalid" for r in fast)
    not_exercised = "not exercised: fused_swiglu (needs metal or cuda; this host runs MLX on cpu)"
    assert {r.reason for r in fast} == {not_exercised}
    # A branch whose default turns the fast path on is judged like a request for it: its
    # reference path's time is never reported as the kernel's.
    branch = [r for r in records if r.variant == "branch"]
    assert branch and {(r.status, r.reason) for r in branch} == {("invalid", not_exercised)}
