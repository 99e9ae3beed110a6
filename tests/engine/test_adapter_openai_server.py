"""The openai-server adapter against real server processes on loopback ports.

mlx_lm.server serving the micro checkpoint shows the two halves of the cold-cache guarantee: the
harness prevents warm cells (fresh prompts per round: every cell reports cached_tokens == 0)
and detects them (the same cell sent twice is invalid, with the server's cached count in the
reason). A small stdlib server stands in for a server that does not report cached tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coldbench.engine.adapters.openai_server import (
    CANARY_MIN_TOKENS,
    CANARY_MIN_TWIN_PREFILL_S,
    OpenAIServerAdapter,
    ServerLoadError,
    canary_timing,
    fit_prompt_text,
    server_argv,
    wipe_path,
)
from coldbench.engine.canary import CANARY_ENV
from coldbench.engine.judge import judge_cell
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import PromptSource
from coldbench.engine.record import Measurement
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import CANARY_ROUND, Record
from coldbench.evidence.rendering.headline import caveats
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html

MLX_LM_SERVER = ["{python}", "-m", "mlx_lm", "server", "--model", "{model}", "--port", "{port}"]

# An OpenAI-style server that streams completions but never says how many tokens were cached.
SILENT_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(body["max_tokens"]):
                event = {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(event)}\\n\\n".encode())
            usage = {"prompt_tokens": int(sys.argv[2]), "completion_tokens": body["max_tokens"]}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\\n\\n".encode())
            self.wfile.write(b"data: [DONE]\\n\\n")

    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


# A cold OpenAI-style server with the behaviours the fail-fast and option tests need:
# `server.py PORT PROMPT_TOKENS MODE [--fast] [--fake-fast]`. MODE `ok` streams; `hang`
# answers with headers and then never streams a token (a dead generation thread); `exit`
# dies on the first completion. `--fast` prints a proof line per request (an honest option);
# `--fake-fast` is accepted and ignored (a planted no-op). FAST_ENV=1 prints its own line.
BEHAVING_SERVER = textwrap.dedent(
    """
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port, prompt_tokens, mode, flags = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    print("serving with", " ".join(flags) or "no flags", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if mode == "exit":
                print("fatal: the generation thread crashed", file=sys.stderr, flush=True)
                os._exit(3)
            if "--fast" in flags:
                print(f"fast path: dispatched {prompt_tokens} tokens", file=sys.stderr)
            if os.environ.get("FAST_ENV") == "1":
                print("env fast path on")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b": keepalive 0/1\\n\\n")
            self.wfile.flush()
            if mode == "hang":
                print("generation thread died", file=sys.stderr)
                time.sleep(3600)
            for i in range(body["max_tokens"]):
                event = {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(event)}\\n\\n".encode())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": body["max_tokens"],
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\\n\\n".encode())
            self.wfile.write(b"data: [DONE]\\n\\n")

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)

FAST = {"value": True, "argv": ["--fast"], "env": {}, "proof": r"fast path: dispatched \d+"}
FAKE_FAST = {"value": True, "argv": ["--fake-fast"], "env": {}, "proof": r"fast path: dispatched"}
ENV_FAST = {"value": True, "argv": [], "env": {"FAST_ENV": "1"}, "proof": "env fast path on"}


def _behaving(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "behaving_server.py"
    script.write_text(BEHAVING_SERVER)
    return ["{python}", str(script), "{port}", "64", mode]


def _plan(model: Path, command: list[str], tmp_path: Path, **extra: object) -> Plan:
    return Plan.from_json(
        {
            "run_id": "r-server",
            "variant": "server",
            "adapter": "openai-server",
            "model": str(model),
            "records_path": str(tmp_path / "records.jsonl"),
            "server_command": command,
            "decode_tokens": 4,
            **extra,
        }
    )


def test_server_command_must_leave_the_port_to_the_adapter() -> None:
    with pytest.raises(ServerLoadError, match=r"must contain \{port\}"):
        server_argv(["mlx_lm.server", "--port", "8080"], port=1234, model="/m")
    with pytest.raises(ServerLoadError, match="non-empty list of strings"):
        server_argv("mlx_lm.server --port {port}", port=1234, model="/m")  # type: ignore[arg-type]


def test_placeholders_are_filled() -> None:
    argv = server_argv(["{python}", "-m", "srv", "--model={model}", "{port}"], port=4, model="/m")
    assert argv == [sys.executable, "-m", "srv", "--model=/m", "4"]


def test_engine_flags_are_refused(micro_model_dir: Path, tmp_path: Path) -> None:
    plan = _plan(micro_model_dir, MLX_LM_SERVER, tmp_path, flags={"clear_cache": False})
    with pytest.raises(
        ServerLoadError, match="takes no engine flags.*not a server option here: clear_cache"
    ):
        OpenAIServerAdapter(plan)


def test_a_server_that_dies_is_reported_with_its_stderr(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    command = ["{python}", "-c", "import sys; sys.exit('no such model: ' + sys.argv[1])", "{port}"]
    adapter = OpenAIServerAdapter(_plan(micro_model_dir, command, tmp_path))
    with pytest.raises(ServerLoadError, match=r"exited with code 1 before ready: no such model"):
        adapter.load()
    assert adapter.process is None


def test_a_server_that_never_answers_times_out(micro_model_dir: Path, tmp_path: Path) -> None:
    command = ["{python}", "-c", "import time; print('listening?', flush=True); time.sleep(60)"]
    adapter = OpenAIServerAdapter(
        _plan(micro_model_dir, [*command, "{port}"], tmp_path), ready_timeout_s=1
    )
    with pytest.raises(ServerLoadError, match=r"not ready after 1 s on port \d+: listening\?"):
        adapter.load()
    assert adapter.process is None  # the sleeping server was ended, not left behind


def test_prompt_text_reencodes_to_exactly_n_tokens(micro_model_dir: Path) -> None:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(micro_model_dir)
    ids = tokenizer.encode("the cold prefill of one prompt " * 40, add_special_tokens=False)
    # Cut mid-word on both sides, as a corpus window does.
    window = ids[3:131]
    text, seen = fit_prompt_text(tokenizer, window)
    assert len(seen) == len(window) == 128
    assert list(tokenizer.encode(text)) == seen


def test_server_without_cached_token_accounting_makes_cells_invalid(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "silent_server.py"
    script.write_text(SILENT_SERVER)
    adapter = OpenAIServerAdapter(
        _plan(micro_model_dir, ["{python}", str(script), "{port}", "64"], tmp_path)
    )
    adapter.load()
    process = adapter.process
    try:
        cell = adapter.run_cell(0, 0, 64)
    finally:
        adapter.close()
    assert cell.status == "invalid"
    assert cell.reason == "the server does not report cached tokens (cached_tokens unknown)"
    assert cell.cached_tokens is None  # unknown, never assumed 0
    assert cell.decode_tokens == 4
    assert cell.prefill_s is not None and cell.prefill_s > 0
    assert process is not None and process.poll() is not None  # close() ended it


@pytest.mark.slow
def test_mlx_lm_server_cells_are_cold_and_a_repeat_is_caught(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    """Through the variant process: fresh prompts per round are cold; a repeated cell is warm."""
    records_path = tmp_path / "records.jsonl"
    plan = {
        "run_id": "r-server",
        "variant": "server",
        "adapter": "openai-server",
        "model": str(micro_model_dir),
        "flags": {},
        "decode_tokens": 4,
        "seed": 3,
        "records_path": str(records_path),
        "checkout": None,
        "server_command": MLX_LM_SERVER,
        "cells": None,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    cells = [
        {"round": 0, "order": 0, "context_tokens": 96},
        {"round": 1, "order": 0, "context_tokens": 96},
        {"round": 2, "order": 0, "context_tokens": 128},
        # The forced repeat: round 2 at 128 tokens again, so the server has its prompt cached.
        {"round": 2, "order": 1, "context_tokens": 128},
    ]
    stdin = "".join(json.dumps(c) + "\n" for c in cells) + json.dumps({"op": "exit"}) + "\n"
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events[0]["event"] == "ready"
    assert events[0]["target"]["adapter"] == "openai-server"
    records = [json.loads(line) for line in records_path.read_text().splitlines()]
    measured = [r for r in records if r["status"] != "warmup"]
    assert len(measured) == 4
    cold, repeat = measured[:3], measured[3]
    for record in cold:
        assert record["status"] == "ok", record["reason"]
        assert record["cached_tokens"] == 0
        assert record["prompt_tokens"] == record["context_tokens"]
        assert record["prefill_s"] > 0 and record["decode_tokens"] == 4
    assert len({r["prompt_sha256"] for r in cold}) == 3
    assert repeat["prompt_sha256"] == cold[2]["prompt_sha256"]
    assert repeat["status"] == "invalid"
    assert repeat["cached_tokens"] == 127  # everything but the last prompt token
    assert repeat["reason"] == (
        "cached_tokens=127: the server reused its prompt cache; start it with its prompt cache "
        "off (mlx_lm.server: --prompt-cache-size 0)"
    )


def test_a_context_the_model_cannot_serve_stops_the_server_too(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    # A marker argument finds this test's server among the machine's processes.
    marker = ["--prompt-cache-size", "7031"]
    plan = {
        "run_id": "r-server",
        "variant": "server",
        "adapter": "openai-server",
        "model": str(micro_model_dir),
        "records_path": str(tmp_path / "records.jsonl"),
        "server_command": [*MLX_LM_SERVER, *marker],
        "cells": [{"round": 0, "order": 0, "context_tokens": 100_000}],
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    event = json.loads(done.stdout.splitlines()[-1])
    assert event["event"] == "error"
    assert "context 100000 tokens exceeds the model's maximum" in event["reason"]
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert " ".join(marker) not in processes


def test_a_server_that_never_streams_is_an_error_within_seconds(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    plan = _plan(micro_model_dir, _behaving(tmp_path, "hang"), tmp_path, first_token_timeout_s=1.5)
    adapter = OpenAIServerAdapter(plan)
    adapter.load()
    try:
        started = time.monotonic()
        cell = adapter.run_cell(0, 0, 64)
        took = time.monotonic() - started
    finally:
        adapter.close()
    assert cell.status == "error"
    assert "no token 1.5 s after the request (first_token_timeout_s)" in cell.reason
    assert "server log: " in cell.reason and "generation thread died" in cell.reason
    assert took < 10


def test_a_server_that_exits_mid_cell_is_an_error_with_its_log(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    plan = _plan(micro_model_dir, _behaving(tmp_path, "exit"), tmp_path)
    adapter = OpenAIServerAdapter(plan)
    adapter.load()
    try:
        started = time.monotonic()
        cell = adapter.run_cell(0, 0, 64)
        took = time.monotonic() - started
        with pytest.raises(RuntimeError, match=r"not running \(exit code 3\): .*thread crashed"):
            adapter.run_cell(1, 0, 64)
    finally:
        adapter.close()
    assert cell.status == "error" and took < 10
    assert cell.reason.startswith("server exited with code 3 during the cell; server log: ")
    assert "the generation thread crashed" in cell.reason
    # The log stays beside the records for the run's bundle.
    assert "the generation thread crashed" in adapter.log_path.read_text()


def test_options_reach_the_server_and_their_proof_lines_are_counted(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "server-cache"
    (cache / "kv").mkdir(parents=True)
    (cache / "kv" / "block").write_bytes(b"x" * 1000)
    plan = _plan(
        micro_model_dir,
        _behaving(tmp_path, "ok"),
        tmp_path,
        flags={"fast": True, "env_fast": True},
        server_options={"fast": FAST, "env_fast": ENV_FAST},
        wipe=[str(cache), str(tmp_path / "never-there")],
    )
    adapter = OpenAIServerAdapter(plan)
    adapter.load()
    try:
        cells = [adapter.run_cell(r, 0, 64) for r in range(2)]
        target = adapter.describe()
    finally:
        adapter.close()
    for cell in cells:
        assert cell.status == "ok", cell.reason
        assert cell.counters["fast.dispatched"] == 1
        assert cell.counters["env_fast.dispatched"] == 1
    assert not cache.exists()
    assert target["wiped"] == [
        {"path": str(cache), "existed": True, "bytes": 1000},
        {"path": str(tmp_path / "never-there"), "existed": False, "bytes": 0},
    ]
    assert target["server_command"][-1] == "--fast" and target["server_env"] == {"FAST_ENV": "1"}
    assert target["server_options"] == {"fast": True, "env_fast": True}
    # What the server's interpreter imports, asked of that interpreter.
    software = target["software"]
    assert software["python_executable"] == sys.executable
    assert software["files"]["mlx_lm"].endswith("mlx_lm/__init__.py") and software["mlx"]
    assert software["files"]["server"].endswith("behaving_server.py")


def test_an_option_the_server_ignores_is_a_silent_no_op(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    plan = _plan(
        micro_model_dir,
        _behaving(tmp_path, "ok"),
        tmp_path,
        flags={"fast": True},
        server_options={"fast": FAKE_FAST},
    )
    adapter = OpenAIServerAdapter(plan)
    adapter.load()
    try:
        cell = adapter.run_cell(0, 0, 64)
    finally:
        adapter.close()
    assert "--fake-fast" in adapter.argv
    assert cell.status == "invalid"
    assert cell.reason == "silent no-op: fast"
    assert cell.counters["fast.dispatched"] == 0


def test_wipe_refuses_root_and_home(tmp_path: Path) -> None:
    for path in ("/", str(Path.home()), "relative/cache"):
        with pytest.raises(ServerLoadError, match="refusing to wipe"):
            wipe_path(path)


def _bos_checkpoint(source: Path, out: Path) -> Path:
    """A copy of the micro checkpoint whose tokenizer adds BOS, as real checkpoints do (a
    post-processor in tokenizer.json); the preset's own files are left as they are."""
    import shutil

    shutil.copytree(source, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    bos = "<|bos|>"
    bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == bos)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out


@pytest.mark.slow
def test_a_bos_adding_tokenizer_needs_the_prompt_cache_off(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    """Every prompt starts with BOS: mlx_lm.server's default prompt cache reuses that one
    token in every cell after the first, and the reason says how to start it instead; with
    `--prompt-cache-size 0` (the documented command) every cell is cold."""
    from mlx_lm.utils import load_tokenizer

    model = _bos_checkpoint(micro_model_dir, tmp_path / "micro-bos")
    tokenizer = load_tokenizer(model)
    assert tokenizer.encode("hello")[0] == tokenizer.bos_token_id  # really adds BOS

    def cells(command: list[str], name: str) -> list[Measurement]:
        records = tmp_path / f"{name}.jsonl"
        adapter = OpenAIServerAdapter(
            Plan.from_json(
                {
                    "run_id": "r-bos",
                    "variant": name,
                    "adapter": "openai-server",
                    "model": str(model),
                    "records_path": str(records),
                    "server_command": command,
                    "decode_tokens": 2,
                }
            )
        )
        adapter.load()
        try:
            return [adapter.run_cell(r, 0, 64) for r in range(3)]
        finally:
            adapter.close()

    default = cells(MLX_LM_SERVER, "default")
    assert [c.cached_tokens for c in default[1:]] == [1, 1]
    assert default[1].status == "invalid"
    assert default[1].reason == (
        "cached_tokens=1: the server reused its prompt cache; start it with its prompt cache "
        "off (mlx_lm.server: --prompt-cache-size 0)"
    )
    cache_off = cells([*MLX_LM_SERVER, "--prompt-cache-size", "0"], "cache-off")
    for cell in cache_off:
        assert cell.status == "ok", cell.reason
        assert cell.cached_tokens == 0 and cell.prompt_tokens == 64


def test_wipes_of_one_folder_side_by_side_all_succeed(tmp_path: Path) -> None:
    """A block's servers load at the same time and wipe the same cache folder: a file a peer
    removed first is gone, as wanted, not an error (it failed a CI run: `cannot wipe ...:
    No such file or directory`)."""
    import threading

    def wipe(path: Path, start: threading.Barrier, results: list[dict | Exception]) -> None:
        start.wait()
        try:
            results.append(wipe_path(str(path)))
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            results.append(error)

    cache = tmp_path / "cache"
    for attempt in range(8):
        for folder in range(16):
            (cache / f"f{folder}").mkdir(parents=True)
            for block in range(24):
                (cache / f"f{folder}" / f"block-{block}").write_bytes(b"kv")
        start = threading.Barrier(3)
        results: list[dict | Exception] = []
        threads = [threading.Thread(target=wipe, args=(cache, start, results)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not [r for r in results if isinstance(r, Exception)], (attempt, results)
        assert not cache.exists()
        assert any(r["existed"] for r in results if isinstance(r, dict))


def _step_option(value: int, *, stock: int | None = 2048) -> dict[str, object]:
    """A prefill-step option as worker/run.py resolves it from the documented declaration."""
    template = "Prompt processing progress: {value}/"
    return {
        "value": value,
        "argv": ["--prefill-step-size", str(value)],
        "env": {},
        "proof": template.replace("{value}", str(value)),
        "stock": stock,
        "prefill_step": True,
        "proof_template": template,
    }


def _progress(*done: int, total: int) -> list[str]:
    return [
        f"2026-12-02 10:00:00,000 - INFO - Prompt processing progress: {d}/{total}" for d in done
    ]


def _option_verdict(tmp_path: Path, option: dict[str, object], lines: list[str], n: int) -> tuple:
    plan = _plan(
        Path("/m"), MLX_LM_SERVER, tmp_path, flags={"step": 0}, server_options={"step": option}
    )
    judged = OpenAIServerAdapter(plan).option_execution("step", lines, n)
    assert judged is not None
    judgement = judge_cell(
        context_tokens=n,
        decode_tokens=1,
        cached_tokens=0,
        prompt_tokens=n,
        prefilled_tokens=None,
        prefill_observed=False,
        decoded_tokens=1,
        execution=[judged],
    )
    return judgement.status, judgement.reason, judgement.inert, judged[1].observed


def test_a_prefill_step_option_is_judged_by_what_it_implies(tmp_path: Path) -> None:
    stock_lines = _progress(127, 128, total=128)  # what mlx_lm.server prints at 2048
    # asked 128 at 128 tokens: the same cut as stock (127 then 1); stock's 128/128 line is no proof
    assert _option_verdict(tmp_path, _step_option(128), stock_lines, 128) == (
        "ok",
        None,
        ("step",),
        0,
    )
    # a step wider than the prompt: inert, with or without a line (it printed stock's)
    assert _option_verdict(tmp_path, _step_option(4096), stock_lines, 128)[:3] == (
        "ok",
        None,
        ("step",),
    )
    # 64 at 128 tokens: its own boundary line proves it; a server that ignored it did not print it
    honest = _progress(64, 127, 128, total=128)
    assert _option_verdict(tmp_path, _step_option(64), honest, 128) == ("ok", None, (), 1)
    assert _option_verdict(tmp_path, _step_option(64), stock_lines, 128)[:2] == (
        "invalid",
        "silent no-op: step",
    )
    # at 5000 tokens stock reaches 2048 and 4096: a request of 4096 cuts 4096+903+1, stock
    # 2048x2+903+1, and the only proof line, 4096/5000, is one stock prints too
    status, reason, _, _ = _option_verdict(
        tmp_path, _step_option(4096), _progress(4096, 4999, 5000, total=5000), 5000
    )
    assert (status, reason) == (
        "invalid",
        "not provable: step (its proof line at 5000 tokens is one the stock server prints too)",
    )
    # an int option set to the server's own value is inert whatever its lines
    plain = {**_step_option(2048), "prefill_step": False}
    assert _option_verdict(tmp_path, plain, [], 128)[:3] == ("ok", None, ("step",))


def test_mlx_lm_server_step_proven_only_by_lines_stock_cannot_print(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    """The documented option on the real mlx_lm.server: at 128 tokens a step of 128 cuts the
    prompt as stock does (its `128/128` line is stock's too): inert, no proof counted; at 256
    tokens its `128/256` boundary is its own. The server is probed on /health (its /v1/models
    logs a CacheNotFound traceback without a Hugging Face cache) and the server module recorded
    is mlx_lm/server.py, not the package's __init__."""
    plan = _plan(
        micro_model_dir,
        [*MLX_LM_SERVER, "--prompt-cache-size", "0"],
        tmp_path,
        flags={"step": 128},
        server_options={"step": _step_option(128)},
    )
    adapter = OpenAIServerAdapter(plan)
    adapter.load()
    try:
        same_cut, own_cut = adapter.run_cell(0, 0, 128), adapter.run_cell(1, 0, 256)
        target = adapter.describe()
    finally:
        adapter.close()
    assert (same_cut.status, same_cut.counters.get("inert")) == ("ok", "step"), same_cut.reason
    assert same_cut.counters["step.dispatched"] == 0
    assert own_cut.status == "ok" and "inert" not in own_cut.counters, own_cut.reason
    assert own_cut.counters["step.dispatched"] == 1
    log = adapter.log_path.read_text()
    assert "Prompt processing progress: 128/256" in log and "CacheNotFound" not in log
    assert target["ready_path"] == "/health"
    assert target["software"]["files"]["server"].endswith("mlx_lm/server.py")


def test_a_server_refusing_its_arguments_says_so_at_the_end_of_its_reason(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    """argparse prints a long usage and then the error: the variant's load error keeps the end
    of the log tail, where `unrecognized arguments` is."""
    plan_path = tmp_path / "plan.json"
    plan = {
        "run_id": "r-args",
        "variant": "bogus",
        "adapter": "openai-server",
        "model": str(micro_model_dir),
        "records_path": str(tmp_path / "records.jsonl"),
        "server_command": [*MLX_LM_SERVER, "--no-such-option"],
        "decode_tokens": 1,
        "cells": [{"round": 0, "order": 0, "context_tokens": 64}],
    }
    plan_path.write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2
    event = json.loads(done.stdout.splitlines()[-1])
    assert event["event"] == "error"
    assert event["reason"].startswith("server exited with code 2 before ready: usage:")
    assert event["reason"].endswith("unrecognized arguments: --no-such-option")


def _server_canary_run(
    model: Path, tmp_path: Path, command: list[str], name: str, **env: str
) -> list[Record]:
    """One batch run of a real mlx_lm.server with the run's warm canary (engine/canary.py).
    Its cells and warm-up are 64 tokens; the canary is the adapter's minimum, 1024: large
    enough on the micro checkpoint (a 0.2-0.5 s cold prefill here) that a repeat the server
    holds is timed well apart from a cold twin above the HTTP round trip."""
    records_path = tmp_path / f"{name}.jsonl"
    plan = {
        "run_id": f"r-{name}",
        "variant": "server",
        "adapter": "openai-server",
        "model": str(model),
        "flags": {},
        "decode_tokens": 2,
        "seed": 5,
        "records_path": str(records_path),
        "server_command": command,
        "cells": [{"round": r, "order": 0, "context_tokens": 64} for r in range(2)],
        "warmup_contexts": [64],
    }
    plan_path = tmp_path / f"{name}.plan.json"
    plan_path.write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, CANARY_ENV: "1", **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ready = json.loads(done.stdout.splitlines()[0])
    assert ready["event"] == "ready" and ready["canary"]["round"] == CANARY_ROUND
    lines = records_path.read_text().splitlines()
    return [Record.model_validate(json.loads(line)) for line in lines]


@pytest.mark.slow
def test_the_warm_canary_on_a_real_server_caught_passed_and_unwarmed(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    """The server's canary (a repeat of the warm-up prompt, timed against cold twins):
    caught by the server's count with its prompt cache on; with the cache left on and the
    count read blind (the planted fault), it passes as cold, its timing says why, and the
    run's evidence is invalid in summary.json, summary.md and the report; with the cache off
    the canary cannot be warm, which is a caveat and not an invalid run."""
    caught = _server_canary_run(micro_model_dir, tmp_path, MLX_LM_SERVER, "on")
    (canary,) = [r for r in caught if r.round == CANARY_ROUND]
    assert canary.status == "invalid" and canary.cached_tokens == 1023
    assert canary.context_tokens == canary.prompt_tokens == CANARY_MIN_TOKENS  # not the 64 warmed
    assert canary.reason is not None and canary.reason.startswith("warm canary (its prompt sent")
    assert canary.counters["canary.prefill_ratio"] is not None
    summary = summarize(caught, baseline="server")
    assert summary.canary is not None and summary.canary.runs[0].result == "caught"
    assert summary.evidence_invalid is None
    assert [r.status for r in caught if r.round >= 0] == ["ok", "ok"]  # cells stay cold

    blind = _server_canary_run(
        micro_model_dir, tmp_path, MLX_LM_SERVER, "blind", COLDBENCH_BLIND_COLD_CHECK="1"
    )
    (canary,) = [r for r in blind if r.round == CANARY_ROUND]
    assert canary.status == "ok" and canary.cached_tokens == 0
    assert canary.context_tokens == 1024 and "canary.under_min_tokens" not in canary.counters
    assert canary.counters["canary.timing_could_tell"] is True, canary.counters
    assert canary.counters["canary.warm_by_timing"] is True, canary.counters
    assert canary.reason is not None and "without saying so" in canary.reason
    summary = summarize(blind, baseline="server")
    assert summary.canary is not None and summary.canary.runs[0].result == "passed"
    assert summary.evidence_invalid and "without saying so" in summary.evidence_invalid[0]
    markdown = render_summary_md(summary, [], evidence_id="cd" * 8, page_url="/e/cdcd")
    assert "**Evidence invalid:** Run r-blind's warm canary" in markdown
    assert "PASSED AS COLD" in markdown and "without saying so" in markdown
    html = render_report_html(summary, blind, [], None, plotly_js_src="plotly.js")
    assert 'id="evidence-invalid"' in html and "without saying so" in html

    cache_off = [*MLX_LM_SERVER, "--prompt-cache-size", "0"]
    unwarmed = _server_canary_run(micro_model_dir, tmp_path, cache_off, "off")
    (canary,) = [r for r in unwarmed if r.round == CANARY_ROUND]
    assert canary.status == "ok" and canary.cached_tokens == 0
    assert canary.counters["canary.warm_by_timing"] is False, canary.counters
    summary = summarize(unwarmed, baseline="server")
    assert summary.canary is not None and summary.canary.runs[0].result == "unwarmed"
    assert summary.evidence_invalid is None
    assert any("could not be made warm" in c for c in caveats(summary))


def _counted(cached: int) -> Measurement:
    """The canary's last repeat as the cell judge left it, for a server count of `cached`."""
    result = Measurement(prompt_tokens=512, cached_tokens=cached, prefill_s=0.01)
    result.status = "ok" if cached == 0 else "invalid"
    result.reason = None if cached == 0 else f"cached_tokens={cached}: the KV cache was not fresh"
    return result


def test_the_server_canary_timing_tells_warm_from_cold_above_its_floor() -> None:
    warm = canary_timing(_counted(0), [0.25, 0.2, 0.3], [0.03, 0.02, 0.04])
    assert warm.counters["canary.timing_could_tell"] is True
    assert warm.counters["canary.warm_by_timing"] is True
    assert warm.counters["canary.prefill_ratio"] == 0.1  # fastest repeat over fastest twin
    assert warm.status == "ok" and warm.reason is not None and "without saying so" in warm.reason

    cold = canary_timing(_counted(0), [0.2, 0.21, 0.22], [0.19, None, 0.2])
    assert cold.counters["canary.warm_by_timing"] is False
    assert cold.reason is not None and cold.reason.startswith("not warm: the repeat prefilled")


def test_a_cold_twin_under_the_floor_leaves_the_timing_untold() -> None:
    """A twin of 12 ms (64 tokens on the micro checkpoint): a ratio of 0.4 there is noise, so
    neither warm nor cold; the reason names the twin's time."""
    untold = canary_timing(_counted(0), [0.012, 0.015, None], [0.005, 0.008, 0.006])
    assert untold.counters["canary.timing_could_tell"] is False
    assert untold.counters["canary.warm_by_timing"] is None
    assert untold.counters["canary.cold_twin_prefill_s"] == 0.012
    assert untold.status == "ok" and untold.reason is not None
    assert untold.reason.startswith("timing could not tell: cold twin took 12 ms, under the 50 ms")
    # just at the floor the timing counts
    at_floor = canary_timing(_counted(0), [CANARY_MIN_TWIN_PREFILL_S], [0.045])
    assert at_floor.counters["canary.timing_could_tell"] is True

    # a count that saw the cache is caught whatever the timing: its reason stays the judge's
    caught = canary_timing(_counted(511), [0.012], [0.011])
    assert (
        caught.status == "invalid"
        and caught.reason == "cached_tokens=511: the KV cache was not fresh"
    )
    assert caught.counters["canary.timing_could_tell"] is False

    # without a timed twin the record proves nothing by timing: left as the judge made it
    untimed = canary_timing(_counted(0), [None, None], [0.01])
    assert untimed.reason is None and "canary.warm_by_timing" not in untimed.counters


def test_the_server_canary_has_a_minimum_size_within_the_model_and_memory(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(micro_model_dir)
    adapter = OpenAIServerAdapter(_plan(micro_model_dir, MLX_LM_SERVER, tmp_path))
    adapter.prompts = PromptSource.from_tokenizer(tokenizer, max_tokens=4096)
    assert adapter.canary_tokens(64) == CANARY_MIN_TOKENS == 1024
    assert adapter.canary_tokens(2048) == 2048 and adapter.canary_small is None

    adapter.prompts = PromptSource.from_tokenizer(tokenizer, max_tokens=600)
    assert adapter.canary_tokens(64) == 600
    assert adapter.canary_small == "the model takes at most 600 tokens (max_position_embeddings)"

    def memory_guard(context_tokens: int) -> None:
        if context_tokens > 128:
            raise ValueError(f"context {context_tokens} tokens needs more memory\nthan this host")

    adapter.prompts = PromptSource.from_tokenizer(tokenizer, checks=[memory_guard])
    assert adapter.canary_tokens(64) == 64  # the warm-up's context, which the guard passed
    assert adapter.canary_small == "context 1024 tokens needs more memory than this host"
