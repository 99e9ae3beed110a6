"""The openai-server adapter against real server processes on loopback ports.

mlx_lm.server serving the tiny checkpoint shows the two halves of the cold-cache guarantee: the
harness prevents warm cells (fresh prompts per round: every cell reports cached_tokens == 0)
and detects them (the same cell sent twice is invalid, with the server's cached count in the
reason). A small stdlib server stands in for a server that does not report cached tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.adapters.openai_server import (
    OpenAIServerAdapter,
    ServerLoadError,
    fit_prompt_text,
    server_argv,
)
from engine.plan import Plan

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


def test_engine_flags_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = _plan(tiny_model_dir, MLX_LM_SERVER, tmp_path, flags={"clear_cache": False})
    with pytest.raises(ServerLoadError, match="takes no engine flags.*clear_cache"):
        OpenAIServerAdapter(plan)


def test_a_server_that_dies_is_reported_with_its_stderr(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    command = ["{python}", "-c", "import sys; sys.exit('no such model: ' + sys.argv[1])", "{port}"]
    adapter = OpenAIServerAdapter(_plan(tiny_model_dir, command, tmp_path))
    with pytest.raises(ServerLoadError, match=r"exited with code 1 before ready: no such model"):
        adapter.load()
    assert adapter.process is None


def test_a_server_that_never_answers_times_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    command = ["{python}", "-c", "import time; print('listening?', flush=True); time.sleep(60)"]
    adapter = OpenAIServerAdapter(
        _plan(tiny_model_dir, [*command, "{port}"], tmp_path), ready_timeout_s=1
    )
    with pytest.raises(ServerLoadError, match=r"not ready after 1 s on port \d+: listening\?"):
        adapter.load()
    assert adapter.process is None  # the sleeping server was ended, not left behind


def test_prompt_text_reencodes_to_exactly_n_tokens(tiny_model_dir: Path) -> None:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    ids = tokenizer.encode("the cold prefill of one prompt " * 40, add_special_tokens=False)
    # Cut mid-word on both sides, as a corpus window does.
    window = ids[3:131]
    text, seen = fit_prompt_text(tokenizer, window)
    assert len(seen) == len(window) == 128
    assert list(tokenizer.encode(text)) == seen


def test_server_without_cached_token_accounting_makes_cells_invalid(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "silent_server.py"
    script.write_text(SILENT_SERVER)
    adapter = OpenAIServerAdapter(
        _plan(tiny_model_dir, ["{python}", str(script), "{port}", "64"], tmp_path)
    )
    adapter.load()
    process = adapter.process
    try:
        cell = adapter.run_cell(0, 0, 64)
    finally:
        adapter.close()
    assert cell["status"] == "invalid"
    assert cell["reason"] == "the server does not report cached tokens (cached_tokens unknown)"
    assert cell["cached_tokens"] is None  # unknown, never assumed 0
    assert cell["decode_tokens"] == 4
    assert cell["prefill_s"] is not None and cell["prefill_s"] > 0
    assert process is not None and process.poll() is not None  # close() ended it


@pytest.mark.slow
def test_mlx_lm_server_cells_are_cold_and_a_repeat_is_caught(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Through the variant process: fresh prompts per round are cold; a repeated cell is warm."""
    records_path = tmp_path / "records.jsonl"
    plan = {
        "run_id": "r-server",
        "variant": "server",
        "adapter": "openai-server",
        "model": str(tiny_model_dir),
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
        [sys.executable, "-m", "engine.runner", "--plan", str(plan_path)],
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
    assert repeat["reason"] == "cached_tokens=127: the server reused its prompt cache"


def test_a_context_the_model_cannot_serve_stops_the_server_too(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A marker argument finds this test's server among the machine's processes.
    marker = ["--prompt-cache-size", "7031"]
    plan = {
        "run_id": "r-server",
        "variant": "server",
        "adapter": "openai-server",
        "model": str(tiny_model_dir),
        "records_path": str(tmp_path / "records.jsonl"),
        "server_command": [*MLX_LM_SERVER, *marker],
        "cells": [{"round": 0, "order": 0, "context_tokens": 100_000}],
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "engine.runner", "--plan", str(plan_path)],
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
