"""The `openai-server` adapter: a server command started fresh per variant, measured over HTTP.

The command comes from the plan's `server_command` (in production from the host's config, never
from a submitter). `{port}`, `{model}` and `{python}` in its arguments are replaced by a free
loopback port, the model path and this interpreter. The adapter waits for `/v1/models` (or
`/health`) to answer, then streams one `/v1/completions` request per cell (`temperature` 0,
`max_tokens` = decode tokens, `stream_options.include_usage`), and kills the server's process
group in `close()`.

Cold or not is the server's own accounting: `usage.prompt_tokens_details.cached_tokens`. A cell
with cached tokens is `invalid` with the count in its reason; a server that does not report the
count gets `cached_tokens = None` and an invalid cell, never an assumed 0. Prefill time is the
time to the first streamed token (request sent to first data event with text); decode time runs
from there to the last token event.

Prompts travel as text: mlx_lm.server (0.32) takes `prompt` only as a string and runs
`tokenizer.encode` on it. The ids are decoded with the checkpoint's tokenizer and re-encoded the
way the server encodes a prompt, adjusting until the server will see exactly the cell's N
tokens; the digest recorded is of those ids. The stdlib HTTP client is enough here and keeps
engine/ free of HTTP packages.

What mlx_lm.server reports: with `stream_options.include_usage` its last event carries
`usage.prompt_tokens_details.cached_tokens`, the length of the prefix it reused from its LRU
prompt cache (keyed by prompt + generated ids). A repeated prompt reuses all but its last token
(N-1); two different prompts that merely start with the same token reuse 1, which is why
`engine.prompts` gives every round a different first token.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import checkpoints
from engine.adapters import measure_prompt
from engine.backend import describe_backend
from engine.judge import judge_cell
from engine.plan import Plan
from engine.prompts import PromptSource, ids_sha256

logger = logging.getLogger(__name__)

NAME = "openai-server"
READY_TIMEOUT_S = float(os.environ.get("COLDBENCH_SERVER_READY_TIMEOUT_S", "180"))
REQUEST_TIMEOUT_S = float(os.environ.get("COLDBENCH_SERVER_REQUEST_TIMEOUT_S", "1800"))
READY_PATHS = ("/v1/models", "/health")
STDERR_TAIL_CHARS = 2000
PROMPT_FIT_ATTEMPTS = 8


class ServerLoadError(ValueError):
    """The server command is unusable or the server never became ready: the variant cannot run."""


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(command: Sequence[str], *, port: int, model: str) -> list[str]:
    """The command with its placeholders filled; it must name `{port}` so the port is ours."""
    if (
        not isinstance(command, list | tuple)
        or not command
        or not all(isinstance(arg, str) for arg in command)
    ):
        raise ServerLoadError("server_command must be a non-empty list of strings")
    if not any("{port}" in arg for arg in command):
        raise ServerLoadError("server_command must contain {port} (the adapter picks the port)")
    values = {"{port}": str(port), "{model}": model, "{python}": sys.executable}
    argv = []
    for arg in command:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        argv.append(arg)
    return argv


def fit_prompt_text(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[int]]:
    """Text whose encoding (as the server encodes a prompt) has exactly len(ids) tokens.

    Decoding and re-encoding can merge or split tokens at the edges, and the server may add
    special tokens; trim or pad (with the prompt's own ids) until the count is right. Returns
    the text and the ids the server will see; their count differs only if no fit was found.
    """
    target = len(ids)
    content = [int(i) for i in ids]
    text, seen = "", []
    for _ in range(PROMPT_FIT_ATTEMPTS):
        text = tokenizer.decode(content)
        seen = list(tokenizer.encode(text))
        if len(seen) == target:
            break
        plain = list(tokenizer.encode(text, add_special_tokens=False))
        specials = len(seen) - len(plain)
        want = target - specials
        content = plain[:want] if len(plain) > want else plain + content[: want - len(plain)]
    return text, seen


class OpenAIServerAdapter:
    """A server process for one variant; `run_cell` streams one completion per cell."""

    name = NAME

    def __init__(self, plan: Plan, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        if plan.flags:
            raise ServerLoadError(
                f"openai-server adapter takes no engine flags (configure the server command); "
                f"got {', '.join(sorted(plan.flags))}"
            )
        if plan.server_command is None:
            raise ServerLoadError("openai-server adapter needs the plan's server_command")
        self.plan = plan
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.prompts: PromptSource | None = None
        self.port = free_loopback_port()
        self.ready_path: str | None = None
        self._log: Any = None
        self.log_path: Path | None = None
        # Checked before anything starts: a bad command is a load error, not a stray process.
        self.argv = server_argv(plan.server_command, port=self.port, model="{model}")

    def load(self) -> None:
        if self.plan.model.startswith("preset:"):
            model_path = checkpoints.resolve_model(self.plan.model, {})
        else:
            model_path = Path(self.plan.model)
        self.argv = server_argv(
            self.plan.server_command or [], port=self.port, model=str(model_path)
        )
        tokenizer = _load_tokenizer(model_path)
        self.tokenizer = tokenizer
        config = json.loads((model_path / "config.json").read_text())
        self.prompts = PromptSource.from_tokenizer(
            tokenizer, max_tokens=config.get("max_position_embeddings")
        )
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the server
            prefix="coldbench-server-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)
        logger.info("starting server: %s", " ".join(self.argv))
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_own_session_dying_with_parent,
            )
        except OSError as exc:
            self.close()
            raise ServerLoadError(f"cannot start server command {self.argv[0]!r}: {exc}") from exc
        # The runner returns without close() when loading fails after this point (e.g. a
        # context check): ending the server at interpreter exit covers that on every platform.
        atexit.register(self.close)
        try:
            self.ready_path = self._wait_ready(self.ready_timeout_s)
        except BaseException:
            self.close()
            raise

    def check_context(self, context_tokens: int) -> None:
        assert self.prompts is not None, "load() first"
        self.prompts.check_context(context_tokens)

    # -- lifecycle -----------------------------------------------------------------------

    def stderr_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text[-STDERR_TAIL_CHARS:].strip().splitlines())

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise ServerLoadError(
                    f"server exited with code {code} before ready: {self.stderr_tail()}"
                )
            for path in READY_PATHS:
                with contextlib.suppress(OSError, http.client.HTTPException):
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                    try:
                        conn.request("GET", path)
                        if conn.getresponse().status == 200:
                            return path
                    finally:
                        conn.close()
            time.sleep(0.2)
        raise ServerLoadError(
            f"server not ready after {timeout_s:.0f} s on port {self.port}: {self.stderr_tail()}"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "variant": self.plan.variant,
            "adapter": NAME,
            "server_command": self.argv,
            "port": self.port,
            "ready_path": self.ready_path,
            # The engine runs in the server's process, out of sight: no import path to check.
            "engine_module_file": None,
            "flags": {},
            "python": sys.version.split()[0],
            **describe_backend(),
        }

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    # -- cells -------------------------------------------------------------------------------

    def run_cell(self, round: int, order: int, context_tokens: int) -> dict[str, Any]:
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.cell_prompt(self.plan.seed, round, context_tokens)
        return measure_prompt(self.measure, prompt, context_tokens)

    def measure(self, prompt_ids: Sequence[int], *, context_tokens: int) -> dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"server is not running: {self.stderr_tail()}")
        decode_tokens = self.plan.decode_tokens
        text, server_ids = fit_prompt_text(self.tokenizer, prompt_ids)
        body = {
            "prompt": text,
            "max_tokens": max(decode_tokens, 1),  # the first token ends the prefill
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        stream = _stream_completion(self.port, body)
        usage = stream["usage"] or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        cached_tokens = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
        reported = usage.get("prompt_tokens")
        prompt_tokens = reported if isinstance(reported, int) else None
        completion = usage.get("completion_tokens")
        decoded = completion if isinstance(completion, int) else None
        prefill_s, decode_s = stream["prefill_s"], stream["decode_s"]
        n = len(server_ids)
        judgement = judge_cell(
            context_tokens=context_tokens,
            decode_tokens=decode_tokens,
            cached_tokens=cached_tokens,
            prompt_tokens=prompt_tokens,
            prefilled_tokens=None,
            prefill_observed=False,  # the server's prefill loop is out of sight
            # max_tokens is at least 1: a prefill-only cell still streams one token.
            decoded_tokens=None if decoded is None else min(decoded, decode_tokens),
            cache="the server",
            reuse="the server reused its prompt cache",
        )
        status: str = judgement.status  # the judge's ok/invalid, or error below
        reason = judgement.reason
        if stream["error"]:
            status, reason = "error", stream["error"]
        elif prefill_s is None:
            status, reason = "error", "server streamed no token"
        decode_steps = (decoded or 0) - 1
        return {
            "prompt_tokens": prompt_tokens,
            "prompt_sha256": ids_sha256(server_ids),
            "cached_tokens": cached_tokens,
            "prefill_s": prefill_s,
            "prefill_tps": n / prefill_s if prefill_s else None,
            "decode_tokens": decoded,
            "decode_s": decode_s if decode_steps > 0 else None,
            "decode_tps": decode_steps / decode_s if decode_steps > 0 and decode_s else None,
            # The stream carries text, not ids: no output ids are known, only the text's digest.
            "output_sha256": None,
            "output_head": None,
            "peak_memory_bytes": None,
            "counters": {
                "stream_events": stream["events"],
                "prompt_ids_refit": list(server_ids) != [int(i) for i in prompt_ids],
                "output_text_sha256": hashlib.sha256(stream["text"].encode()).hexdigest(),
            },
            "status": status,
            "reason": reason,
        }


def create(plan: Plan) -> OpenAIServerAdapter:
    return OpenAIServerAdapter(plan)


def _own_session_dying_with_parent() -> None:
    """In the server's child before exec: its own process group (close() ends all of it) and,
    on Linux, SIGTERM when the variant process dies without reaching close()."""
    os.setsid()
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _load_tokenizer(path: Path) -> Any:
    """The checkpoint's tokenizer, loaded the way mlx_lm.server loads it."""
    from mlx_lm.utils import load_tokenizer

    if not (path / "config.json").is_file():
        raise ServerLoadError(f"model checkpoint not found (no config.json): {path}")
    try:
        return load_tokenizer(path)
    except Exception as exc:
        raise ServerLoadError(f"cannot load the tokenizer of {path}: {exc}") from exc


def _stream_completion(port: int, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/completions with stream=True; time the first and last token events."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    result: dict[str, Any] = {
        "prefill_s": None,
        "decode_s": None,
        "usage": None,
        "text": "",
        "events": 0,
        "error": None,
    }
    try:
        conn.connect()
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        started = time.perf_counter()
        conn.request("POST", "/v1/completions", body=payload, headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(500).decode(errors="replace")
            result["error"] = f"server answered HTTP {response.status}: {detail}"
            return result
        first_at = last_at = None
        for raw in response:
            line = raw.decode(errors="replace").strip()
            # SSE comments (": keepalive ...") and blank separators carry no tokens.
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            result["events"] += 1
            if event.get("usage"):
                result["usage"] = event["usage"]
            for choice in event.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece or choice.get("finish_reason"):
                    now = time.perf_counter()
                    first_at = now if first_at is None else first_at
                    last_at = now
                    result["text"] += piece
        if first_at is not None and last_at is not None:
            result["prefill_s"] = first_at - started
            result["decode_s"] = last_at - first_at
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        result["error"] = f"stream failed: {type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return result
