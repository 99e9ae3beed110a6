"""The mlx-lm adapter drives real checkouts of mlx-lm, and proves which one ran.

`mlx_lm_repo` (tests/conftest.py) is a git repository of the installed mlx_lm with a
`slow-prefill` branch; each branch is checked out into its own worktree and run by its own
variant process. Every adapter import happens in a child process: the adapter rewrites
`sys.path` and `sys.modules`, which the test process must keep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from coldbench.engine.adapters.mlx_lm import MlxLmLoadError, parse_flags
from tests.conftest import IMPORT_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env(*first: Path) -> dict[str, str]:
    """PYTHONPATH with the checkout first, then this repository's `coldbench` and the rest."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [*map(str, first), str(IMPORT_PATH), *rest]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _plan(tmp_path: Path, name: str, model: Path, checkout: Path, **extra: Any) -> Path:
    plan = {
        "run_id": "r-mlx-lm",
        "variant": name,
        "adapter": "mlx-lm",
        "model": str(model),
        "flags": {},
        "decode_tokens": 3,
        "seed": 5,
        "records_path": str(tmp_path / f"{name}.jsonl"),
        "checkout": str(checkout),
        "server_command": None,
        "cells": [
            {"round": 0, "order": 0, "context_tokens": 128},
            {"round": 1, "order": 0, "context_tokens": 128},
        ],
        **extra,
    }
    path = tmp_path / f"{name}.plan.json"
    path.write_text(json.dumps(plan))
    return path


def _start(plan: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, list[dict[str, Any]], str]:
    stdout, stderr = process.communicate(timeout=180)
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return process.returncode, events, stderr


def _worktree(repo: Path, branch: str, path: Path) -> Path:
    subprocess.run(
        ["git", "worktree", "add", "-q", "--detach", str(path), branch],
        cwd=repo,
        check=True,
        capture_output=True,
    )
    return path


def test_only_prefill_step_size_is_accepted() -> None:
    assert parse_flags({"prefill_step_size": 64}).prefill_step_size == 64
    assert parse_flags(None).non_default() == {}
    with pytest.raises(MlxLmLoadError, match="does not support flag.*compile.*prefill_step_size"):
        parse_flags({"compile": True})
    # values are checked by the one rule of coldbench.engine.flags, with its words
    for bad in (0, -4, "x64", True, 1.5):
        with pytest.raises(MlxLmLoadError, match=r"^flag prefill_step_size=.*: expected a"):
            parse_flags({"prefill_step_size": bad})


@pytest.mark.slow
def test_each_branch_runs_its_own_code(
    mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path, tmp_path: Path
) -> None:
    repo, (main, slow) = mlx_lm_repo
    checkouts = {
        "main": _worktree(repo, main, tmp_path / "wt-main"),
        "slow": _worktree(repo, slow, tmp_path / "wt-slow"),
    }
    # A third variant asks the slow branch for 64-token chunks, which it never delivers.
    plans = {
        name: _plan(tmp_path, name, micro_model_dir, checkout)
        for name, checkout in checkouts.items()
    }
    plans["slow-64"] = _plan(
        tmp_path, "slow-64", micro_model_dir, checkouts["slow"], flags={"prefill_step_size": 64}
    )
    # slow-64 runs without the checkout on PYTHONPATH: engine/ imports the host's mlx_lm first,
    # and the adapter must still end up running the worktree's copy.
    envs = {"main": _env(checkouts["main"]), "slow": _env(checkouts["slow"]), "slow-64": _env()}
    processes = {name: _start(plan, envs[name]) for name, plan in plans.items()}
    records: dict[str, list[dict[str, Any]]] = {}
    for name, process in processes.items():
        code, events, stderr = _finish(process)
        assert code == 0, stderr[-2000:]
        target = events[0]["target"]
        checkout = checkouts[name.split("-")[0]].resolve()
        assert target["adapter"] == "mlx-lm"
        assert target["engine_module_file"] == str(checkout / "mlx_lm" / "__init__.py")
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        records[name] = [r for r in map(json.loads, lines) if r["status"] != "warmup"]
        assert len(records[name]) == 2
        for record in records[name]:
            assert record["cached_tokens"] == 0
            assert record["counters"]["engine_module_file"] == target["engine_module_file"]

    # main: stock generate_step, 127 prompt tokens in one chunk and the last token alone.
    for record in records["main"]:
        assert record["status"] == "ok", record["reason"]
        assert record["counters"]["chunks"] == record["counters"]["chunks_stock"] == 2
        assert record["counters"]["chunk_width_max"] == 127
    # slow-prefill: its 32-token cap is visible in the chunks the loop delivered.
    for record in records["slow"]:
        assert record["status"] == "ok", record["reason"]
        assert record["counters"]["chunks"] == 5  # 32 + 32 + 32 + 31, then 1
        assert record["counters"]["chunks_stock"] == 2
        assert record["counters"]["chunk_width_max"] == 32
    # Same weights, same prompts, same greedy ids: only the loop differs.
    assert [r["output_sha256"] for r in records["main"]] == [
        r["output_sha256"] for r in records["slow"]
    ]
    for record in records["slow-64"]:
        # its 32-token chunks are neither what 64 implies nor stock's: said so, not a no-op
        assert record["status"] == "invalid"
        assert record["reason"].startswith("not as requested: prefill_step_size (")
        assert record["counters"]["prefill_step_size.dispatched"] == 0


def test_a_checkout_whose_module_is_not_imported_is_refused(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    # A fork in src/ layout that was never installed: `import mlx_lm` finds the host's copy.
    checkout = tmp_path / "fork"
    (checkout / "src" / "mlx_lm").mkdir(parents=True)
    (checkout / "src" / "mlx_lm" / "__init__.py").write_text("")
    plan = _plan(tmp_path, "fork", micro_model_dir, checkout)
    code, events, _stderr = _finish(_start(plan, _env(IMPORT_PATH)))
    assert code == 2
    assert events[-1]["event"] == "error"
    reason = events[-1]["reason"]
    assert "refusing to run: mlx_lm was imported from" in reason
    assert f"not from inside the checkout {checkout.resolve()}" in reason
    assert not (tmp_path / "fork.jsonl").exists() or not (tmp_path / "fork.jsonl").read_text()


def test_a_reused_prompt_cache_is_invalid(
    mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path
) -> None:
    repo, _branches = mlx_lm_repo
    script = textwrap.dedent(
        f"""
        import json
        from dataclasses import asdict
        from coldbench.engine.adapters.mlx_lm import create
        from coldbench.engine.plan import Plan
        plan = Plan.from_json({{
            "run_id": "r", "variant": "v", "adapter": "mlx-lm", "decode_tokens": 2,
            "model": {str(micro_model_dir)!r}, "checkout": {str(repo)!r}, "records_path": "-",
        }})
        adapter = create(plan)
        adapter.load()
        cache = adapter.make_prompt_cache(adapter.model)
        ids = list(range(40, 104))
        first = adapter.measure(ids, context_tokens=64, prompt_cache=cache)
        again = adapter.measure(ids, context_tokens=64, prompt_cache=cache)
        print(json.dumps([asdict(first), asdict(again)]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(repo), timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, again = json.loads(done.stdout.splitlines()[-1])
    assert first["status"] == "ok" and first["cached_tokens"] == 0
    # 64 prompt tokens plus both generated ones: generate_step feeds each token it yields
    # back into the cache before yielding it.
    assert again["cached_tokens"] == 66
    assert again["status"] == "invalid"
    assert again["reason"] == "cached_tokens=66: the KV cache was not fresh"


_NOT_64 = (
    "not as requested: prefill_step_size (the request implies chunks of 64, stock chunks of "
    "2048; observed 32x3+31+1)"
)
# Each case: (branch, requested prefill_step_size, context) ->
# (status, reason, inert flags, chunk widths delivered, prefill_step_size.dispatched).
_STEP_CASES = {
    # The planted no-op delivers stock chunks whatever is asked: invalid at every step size,
    # including 1, where the final one-token step (which stock takes too) is no dispatch.
    ("noop-step", 1, 64): ("invalid", "silent no-op: prefill_step_size", None, "63+1", 0),
    ("noop-step", 64, 128): ("invalid", "silent no-op: prefill_step_size", None, "127+1", 0),
    # An honest build: step 1 is 64 one-token chunks; 64 at 128 tokens is 64 + 63 + 1.
    ("main", 1, 64): ("ok", None, None, "1x64", 63),
    ("main", 64, 128): ("ok", None, None, "64+63+1", 1),
    # A step wider than the prompt is what stock 2048 does at 128 tokens: ok, and inert.
    ("main", 4096, 128): ("ok", None, "prefill_step_size", "127+1", 0),
    # The planted no-op at such a step is indistinguishable from stock, and so is the request.
    ("noop-step", 4096, 128): ("ok", None, "prefill_step_size", "127+1", 0),
    # The older layout (the remainder goes with the first token) obeys the step: ok, not a no-op.
    ("old-layout", 64, 128): ("ok", None, None, "64x2", 1),
    ("old-layout", 64, 256): ("ok", None, None, "64x4", 3),
    ("old-layout", 1, 64): ("ok", None, None, "1x64", 63),
    ("old-layout", 4096, 128): ("ok", None, "prefill_step_size", "128", 0),
    # 32-token chunks when 64 are asked: neither the request nor stock, and said so.
    ("slow", 64, 128): ("invalid", _NOT_64, None, "32x3+31+1", 0),
}


def test_prefill_step_size_is_judged_by_the_chunk_widths_delivered(
    mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path, tmp_path: Path
) -> None:
    from tests.conftest import NOOP_STEP_BRANCH, OLD_LAYOUT_BRANCH

    repo, (main, slow) = mlx_lm_repo
    branches = {
        "main": main,
        "noop-step": NOOP_STEP_BRANCH,
        "old-layout": OLD_LAYOUT_BRANCH,
        "slow": slow,
    }
    for name, branch in branches.items():
        checkout = _worktree(repo, branch, tmp_path / f"wt-{name}")
        cases = [(step, n) for (b, step, n) in _STEP_CASES if b == name]
        script = textwrap.dedent(
            f"""
            import json
            from dataclasses import asdict
            from coldbench.engine.adapters.mlx_lm import create
            from coldbench.engine.plan import Plan
            out = []
            for step, n in {cases!r}:
                adapter = create(Plan.from_json({{
                    "run_id": "r", "variant": "v", "adapter": "mlx-lm", "decode_tokens": 2,
                    "model": {str(micro_model_dir)!r}, "checkout": {str(checkout)!r},
                    "records_path": "-", "flags": {{"prefill_step_size": step}},
                }}))
                adapter.load()
                out.append(asdict(adapter.measure(list(range(40, 40 + n)), context_tokens=n)))
            print(json.dumps(out))
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=_env(checkout),
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results = json.loads(done.stdout.splitlines()[-1])
        for (step, n), result in zip(cases, results, strict=True):
            status, reason, inert, widths, dispatched = _STEP_CASES[(name, step, n)]
            counters = result["counters"]
            where = f"{name} at prefill_step_size={step}, {n} tokens: {counters}"
            assert (result["status"], result["reason"]) == (status, reason), where
            assert counters.get("inert") == inert, where
            assert counters["chunk_widths"] == widths, where
            assert counters["prefill_step_size.dispatched"] == dispatched, where


def test_a_checkout_whose_loader_predates_return_config_runs(
    mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path, tmp_path: Path
) -> None:
    """mlx-lm before 0.28.3 (v0.26.4, v0.28.2, ...): `load()` takes no return_config."""
    from tests.conftest import LOADER_028_BRANCH

    repo, _branches = mlx_lm_repo
    checkout = _worktree(repo, LOADER_028_BRANCH, tmp_path / "wt-loader")
    plan = _plan(tmp_path, "old-loader", micro_model_dir, checkout)
    code, events, stderr = _finish(_start(plan, _env(checkout)))
    assert code == 0, stderr[-2000:]
    assert events[0]["target"]["engine_module_file"] == str(
        checkout.resolve() / "mlx_lm/__init__.py"
    )
    records = [
        json.loads(line) for line in (tmp_path / "old-loader.jsonl").read_text().splitlines()
    ]
    measured = [r for r in records if r["status"] != "warmup"]
    assert [r["status"] for r in measured] == ["ok", "ok"], measured[0]["reason"]


def test_generate_step_is_found_where_each_release_kept_it() -> None:
    from types import SimpleNamespace

    from coldbench.engine.adapters.mlx_lm import find_generate_step

    def current(prompt, model, *, max_tokens=256, prompt_cache=None, prefill_step_size=2048):
        yield from ()

    def no_step(prompt, model, *, prompt_cache=None):
        yield from ()

    # since 0.23 in mlx_lm.generate; before, mlx_lm.generate was the CLI and utils had it
    generate, utils = SimpleNamespace(generate_step=current), SimpleNamespace()
    assert find_generate_step(generate, utils, "0.30") is current
    assert find_generate_step(utils, generate, "0.22") is current
    with pytest.raises(MlxLmLoadError, match=r"fork: generate_step takes no prefill_step_size"):
        find_generate_step(SimpleNamespace(generate_step=no_step), utils, "fork")
    with pytest.raises(MlxLmLoadError, match="has no generate_step"):
        find_generate_step(utils, utils, None)


@pytest.mark.slow
@pytest.mark.parametrize("blind", [False, True])
def test_the_warm_canary_on_the_checkouts_own_cache(
    mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path, tmp_path: Path, blind: bool
) -> None:
    """engine/canary.py through the mlx-lm adapter: caught by the checkout's own cache
    accounting, passed as cold only when the cold check is made blind on purpose."""
    repo, (main, _) = mlx_lm_repo
    checkout = _worktree(repo, main, tmp_path / "wt-main")
    plan = _plan(tmp_path, "main", micro_model_dir, checkout, warmup_contexts=[128])
    env = {**_env(checkout), "COLDBENCH_CANARY": "1"}
    if blind:
        env["COLDBENCH_BLIND_COLD_CHECK"] = "1"
    code, events, stderr = _finish(_start(plan, env))
    assert code == 0, stderr[-2000:]
    canary = events[0]["canary"]
    assert canary["round"] == -2 and canary["context_tokens"] == 128
    if blind:
        assert canary["status"] == "ok" and canary["cached_tokens"] == 0
    else:
        assert canary["status"] == "invalid" and canary["cached_tokens"] == 64
        assert "cached_tokens=64" in canary["reason"]
