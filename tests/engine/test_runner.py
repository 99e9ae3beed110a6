from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coldbench.evidence.contract.schemas import Record

REPO = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, model: Path | str, **overrides: Any) -> Path:
    plan = {
        "run_id": "r-1",
        "variant": "base",
        "adapter": "embedded",
        "model": str(model),
        "flags": {"prefill_step_size": 32},
        "decode_tokens": 3,
        "seed": 0,
        "records_path": str(tmp_path / "records.jsonl"),
        "checkout": None,
        "server_command": None,
        "cells": None,
        "warmup_tokens": 32,
    } | overrides
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _start(plan: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )


def _send(process: subprocess.Popen[str], message: dict[str, Any] | str) -> None:
    assert process.stdin is not None
    process.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    process.stdin.flush()


def _read(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.stderr else "no output"
    return json.loads(line)


def _batch(plan: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """The runner in batch mode (or failing to start): it runs the plan's cells and exits."""
    return subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_serve_mode_records_match_stdout(tiny_model_dir: Path, tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "binary_add.ptx").write_text("cached")
    process = _start(_plan(tmp_path, tiny_model_dir), {"MLX_PTX_CACHE_DIR": str(kernels)})
    try:
        ready = _read(process)
        assert ready["event"] == "ready"
        target = ready["target"]
        assert target["engine_module_file"] == str(REPO / "engine" / "__init__.py")
        assert target["adapter"] == "embedded" and target["backend"] == "cpu"
        assert target["flags"] == {
            "prefill_step_size": 32,
            "clear_cache": True,
            "compile": False,
            "fused_swiglu": False,
            "fused_add_rms_norm": False,
        }
        assert target["model"]["weights_sha256"] and target["mlx"] and target["mlx_lm"]
        assert ready["warmup"]["status"] == "warmup" and ready["warmup"]["round"] == -1
        # the CPU compiles no CUDA kernels: the cache folder the test gives stays as it was
        assert ready["kernels_compiled"] == 0
        _send(process, {"round": 0, "order": 1, "context_tokens": 64})
        first = _read(process)["record"]
        _send(process, "{oops")
        assert _read(process) == {
            "event": "error",
            "reason": "bad cell request: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        }
        _send(process, {"round": 1, "order": 0, "context_tokens": 9000})
        too_long = _read(process)["record"]
        _send(process, {"op": "exit"})
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    assert first["status"] == "ok" and first["counters"]["chunks"] == 2
    assert too_long["status"] == "error"
    assert too_long["reason"] == (
        "context 9000 tokens exceeds the model's maximum of 8192 (max_position_embeddings)"
    )
    on_disk = _records(tmp_path / "records.jsonl")
    assert on_disk == [ready["warmup"], first, too_long]
    for record in on_disk:
        Record.model_validate(record)
    assert ready["warmup"]["prompt_sha256"] != first["prompt_sha256"]


def test_batch_mode_runs_the_cells_and_exits(tiny_model_dir: Path, tmp_path: Path) -> None:
    cells = [
        {"round": 0, "order": 0, "context_tokens": 64},
        {"round": 1, "order": 0, "context_tokens": 64},
    ]
    plan = _plan(tmp_path, "preset:tiny", cells=cells, warmup_tokens=None, flags={})
    done = _batch(plan)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["event"] for e in events] == ["ready", "record", "record"]
    assert events[0]["target"]["model"]["path"] == str(tiny_model_dir)  # preset:tiny resolved
    records = _records(tmp_path / "records.jsonl")
    assert records[1:] == [e["record"] for e in events[1:]]
    assert records[0]["context_tokens"] == 64  # warm-up at the smallest batch context
    assert [r["status"] for r in records] == ["warmup", "ok", "ok"]
    assert records[1]["prompt_sha256"] != records[2]["prompt_sha256"]


def test_every_context_of_the_plan_is_warmed_once_before_ready(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, tiny_model_dir, warmup_contexts=[64, 32, 64], flags={})
    process = _start(plan)
    try:
        ready = _read(process)
        _send(process, {"op": "exit"})
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
    assert ready["event"] == "ready"
    warmups = ready["warmups"]
    assert [w["context_tokens"] for w in warmups] == [32, 64]
    assert all(w["status"] == "warmup" and w["round"] == -1 for w in warmups)
    assert ready["warmup"] == warmups[0]
    assert _records(tmp_path / "records.jsonl") == warmups
    assert warmups[0]["prompt_sha256"] != warmups[1]["prompt_sha256"]


@pytest.mark.parametrize(
    "flags", [{"prefill_step_size": 32}, {"prefill_step_size": 32, "compile": True}]
)
def test_the_warm_ups_run_every_shape_the_timed_cells_run(
    tiny_model_dir: Path, tmp_path: Path, flags: dict[str, Any]
) -> None:
    """Kernels compile (and `mx.compile` traces) per shape, so a timed cell whose chunk
    widths, decode steps or dispatch counts no warm-up ran would pay for them: each timed
    cell must run exactly what its context's warm-up ran. 100 tokens in chunks of 32 end in a
    4-token tail that 64 tokens never run."""
    cells = [{"round": r, "order": 0, "context_tokens": c} for r in range(2) for c in (64, 100)]
    plan = _plan(
        tmp_path, tiny_model_dir, cells=cells, warmup_tokens=None, warmup_contexts=[64, 100]
    )
    plan.write_text(json.dumps(json.loads(plan.read_text()) | {"flags": flags}))
    done = _batch(plan)
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "records.jsonl")
    warmups = {r["context_tokens"]: r for r in records if r["status"] == "warmup"}
    timed = [r for r in records if r["round"] >= 0]
    assert sorted(warmups) == [64, 100] and len(timed) == 4
    assert all(r["status"] == "ok" for r in timed)
    shape_keys = ("chunk_widths", "chunks", "lm_head_rows", "compile.dispatched")
    for cell in timed:
        warmup = warmups[cell["context_tokens"]]
        assert {k: cell["counters"][k] for k in shape_keys} == {
            k: warmup["counters"][k] for k in shape_keys
        }
        assert (cell["prompt_tokens"], cell["decode_tokens"]) == (
            warmup["prompt_tokens"],
            warmup["decode_tokens"],
        )
    # the distinct chunk widths the timed cells ran are all among the warm-ups'
    widths = {r["context_tokens"]: r["counters"]["chunk_widths"] for r in timed}
    assert widths == {64: "32x2", 100: "32x3+4"}
    if flags.get("compile"):
        assert all(r["counters"]["compile.dispatched"] > 0 for r in timed)


def test_a_crash_loses_at_most_the_cell_in_flight(tiny_model_dir: Path, tmp_path: Path) -> None:
    process = _start(_plan(tmp_path, tiny_model_dir, flags={}))
    try:
        assert _read(process)["event"] == "ready"
        _send(process, {"round": 0, "order": 0, "context_tokens": 64})
        kept = _read(process)["record"]
        _send(process, {"round": 1, "order": 0, "context_tokens": 4096})  # seconds on a CPU
        time.sleep(0.5)
        process.kill()
        process.wait(timeout=30)
    finally:
        process.kill()
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [-1, 0]
    assert json.loads(lines[-1]) == kept


def test_load_failure_in_a_child_process_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "/nonexistent/ckpt")
    done = _batch(plan, timeout_s=60)
    assert done.returncode == 2
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {
            "event": "error",
            "reason": "checkpoint /nonexistent/ckpt does not exist or is not a directory",
        }
    ]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"flags": {"turbo": True}}, "unknown engine flag 'turbo'"),
        ({"adapter": "vllm"}, "unknown adapter 'vllm'; known: embedded, mlx-lm, openai-server"),
        ({"model": "preset:huge"}, "unknown model 'preset:huge'"),
        ({"decode_tokens": -1}, "plan decode_tokens must be an integer >= 0"),
        ({"extra": 1}, "unknown plan field(s): extra"),
        ({"warmup_contexts": [64, 0]}, "plan warmup_contexts must be a non-empty list"),
        ({"warmup_contexts": []}, "plan warmup_contexts must be a non-empty list"),
        ({"cells": [{"round": 0, "order": -1, "context_tokens": 64}]}, "cell order must be"),
        (
            {"model": "preset:tiny", "cells": [{"round": 0, "order": 0, "context_tokens": 9000}]},
            "context 9000 tokens exceeds the model's maximum of 8192",
        ),
    ],
)
def test_bad_plan_is_one_error_event_and_exit_2(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overrides: dict[str, Any],
    reason: str,
) -> None:
    from coldbench.engine import runner

    overrides = dict(overrides)
    plan = _plan(tmp_path, overrides.pop("model", str(tmp_path)), **overrides)
    assert runner.main(["--plan", str(plan)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "error" and reason in event["reason"], event
    records = tmp_path / "records.jsonl"
    assert not records.exists() or records.read_text() == ""  # no cell ran, no warm-up either


def _start_gated(plan: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "COLDBENCH_LOAD_GATE": "1", "COLDBENCH_WARMUP_GATE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_the_gates_hold_the_runner_before_the_load_and_before_the_warm_ups(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The orchestrator starts processes ahead of their block: after its imports a runner must
    wait (nothing loaded, no device touched) until told to load, then again until told to warm
    up; each warm-up reports, so the orchestrator can bound it by the cell timeout."""
    process = _start_gated(_plan(tmp_path, tiny_model_dir, warmup_contexts=[32, 64], flags={}))
    try:
        imported = _read(process)
        assert imported["event"] == "imported" and imported["import_s"] > 0
        # a synthetic checkpoint under the embedded engine: mlx-lm without transformers
        assert imported["lean"] is True
        time.sleep(0.5)
        assert not (tmp_path / "records.jsonl").read_text()  # nothing ran while it waited
        _send(process, {"op": "load"})
        loaded = _read(process)
        assert loaded["event"] == "loaded" and loaded["load_s"] >= 0
        _send(process, {"op": "warmup"})
        warmed = [_read(process), _read(process)]
        assert [(w["event"], w["context_tokens"]) for w in warmed] == [
            ("warmed", 32),
            ("warmed", 64),
        ]
        ready = _read(process)
        assert ready["event"] == "ready" and len(ready["warmups"]) == 2
        _send(process, {"round": 0, "order": 0, "context_tokens": 64})
        record = _read(process)["record"]
        assert record["status"] == "ok" and record["prompt_tokens"] == 64
        _send(process, {"op": "exit"})
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


def test_exit_at_the_load_gate_ends_the_runner_without_loading(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    process = _start_gated(_plan(tmp_path, tiny_model_dir))
    try:
        assert _read(process)["event"] == "imported"
        _send(process, {"op": "exit"})
        assert process.wait(timeout=60) == 0
        assert process.stdout is not None and process.stdout.read() == ""
    finally:
        process.kill()


def test_the_lean_runner_cuts_the_same_prompts_as_mlx_lms_tokenizer(
    tiny_model_dir: Path, tmp_path: Path, tiny_prompts: Any
) -> None:
    """coldbench.engine.lean reads tokenizer.json without transformers: the prompt ids must be the
    ones mlx-lm's own tokenizer gives (pairing across commits depends on it)."""
    process = _start_gated(_plan(tmp_path, tiny_model_dir, warmup_contexts=[128], flags={}))
    try:
        assert _read(process)["lean"] is True
        _send(process, {"op": "load"})
        assert _read(process)["event"] == "loaded"
        _send(process, {"op": "warmup"})
        while (event := _read(process))["event"] != "ready":
            pass
        for round_ in (0, 1):
            _send(process, {"round": round_, "order": 0, "context_tokens": 128})
            record = _read(process)["record"]
            assert record["prompt_sha256"] == tiny_prompts.prompt(0, round_, 128).sha256
        assert event["warmup"]["prompt_sha256"] == tiny_prompts.warmup_prompt(0, 128).sha256
        _send(process, {"op": "exit"})
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()


_LEAN_CELL = """
import json, sys
from engine import lean
assert lean.install()
from coldbench.engine.adapters.embedded import EmbeddedAdapter
from coldbench.engine.plan import Plan
adapter = EmbeddedAdapter(Plan(**json.loads(sys.argv[1])))
adapter.load()
measured = adapter.run_cell(0, 0, 64)
heavy = ("huggingface_hub", "transformers", "httpx2", "numpy", "scipy")
loaded = sorted(m for m in heavy if m in sys.modules)
import huggingface_hub  # a later import in the process gets the real package
print(loaded, hasattr(huggingface_hub, "HfApi"), measured.status)
"""


def test_a_lean_variant_process_imports_no_hub_client_transformers_or_numpy(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """mlx_lm.utils binds huggingface_hub's snapshot_download at import; a lean process loads a
    local checkpoint, so the hub client (and its HTTP stack) stays out of it, and its prompts
    and cells need no numpy: each of a run's many process starts pays none of them."""
    plan = json.loads(_plan(tmp_path, tiny_model_dir, warmup_contexts=[64]).read_text())
    done = subprocess.run(
        [sys.executable, "-c", _LEAN_CELL, json.dumps(plan)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "ok"]


_ORPHANING_PARENT = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-m", "coldbench.engine.runner", "--plan", sys.argv[1]],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
)
print(child.pid, flush=True)
time.sleep(float(sys.argv[2]))  # long enough to be past its imports and load
print("up", flush=True)
time.sleep(3600)
"""


def test_a_runner_whose_orchestrator_was_killed_exits_by_itself(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A killed orchestrator (SIGKILL: no cleanup) must not leave its variant process running:
    the runner notices its parent is gone, here in the middle of a long warm-up."""
    plan = _plan(tmp_path, tiny_model_dir, warmup_contexts=[8192], flags={})
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHANING_PARENT, str(plan), "6"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert parent.stdout is not None
    runner_pid = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "up"
        # no gates: it loaded at once and warms 8,192 tokens (a minute or more on this CPU)
        assert _alive(runner_pid) and not (tmp_path / "records.jsonl").read_text()
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(runner_pid):
            time.sleep(0.2)
        assert not _alive(runner_pid), "the runner outlived its orchestrator"
    finally:
        parent.kill()
        if _alive(runner_pid):
            os.kill(runner_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
