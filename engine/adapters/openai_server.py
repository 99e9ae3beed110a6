"""The `openai-server` adapter: a server command started fresh per variant, measured over HTTP.

The command comes from the plan's `server_command` (in production from the host's config, never
from a submitter). `{port}`, `{model}` and `{python}` in its arguments are replaced by a free
loopback port, the model path and this interpreter. The adapter waits for `/health` (or
`/v1/models`) to answer, then streams one `/v1/completions` request per cell (`temperature` 0,
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
`coldbench.engine.prompts` gives every round a different first token. A checkpoint whose tokenizer
adds BOS starts every prompt with the same token, so every cell after the first reuses 1 token:
such servers are started with their prompt cache off (`--prompt-cache-size 0` for
mlx_lm.server), which the reason of such a cell says.

Host-owned options (plan `server_options`, resolved by the worker from worker.toml): their argv
pieces are appended to the command and their env set for the server; nothing else of a variant
reaches the command line. An option's `proof` is a regular expression over the server's own
output lines (stdout and stderr, unbuffered, in `<records>.server.log`) written during a cell:
its matches are the counter `<option>.dispatched`, and `coldbench.engine.judge` calls a requested
option whose proof never matched a `silent no-op`. `wipe` paths (the server's on-disk caches) are
deleted before the server starts, and the describe() target says what was removed.

Fail fast: while a cell streams, a watchdog ends it when the server process exits or when no
token has arrived `first_token_timeout_s` after the request (a dead generation thread), and the
cell is an `error` whose reason carries the tail of the server's log.

Provenance of what ran: the server's own interpreter (the command's `{python}`, or a script's
`#!` interpreter) is asked, with the server's environment, which mlx and mlx_lm it imports
(versions and files) and where the server module comes from: describe()'s `software`.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coldbench.engine import checkpoints
from coldbench.engine.adapters import measure_prompt
from coldbench.engine.backend import describe_backend
from coldbench.engine.canary import cold_check_blind
from coldbench.engine.judge import (
    AtLeast,
    Expectation,
    Observation,
    generate_step_widths,
    judge_cell,
)
from coldbench.engine.memory import MemoryGuard
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import PromptSource, ids_sha256
from coldbench.engine.record import Measurement

logger = logging.getLogger(__name__)

NAME = "openai-server"
READY_TIMEOUT_S = float(os.environ.get("COLDBENCH_SERVER_READY_TIMEOUT_S", "180"))
REQUEST_TIMEOUT_S = float(os.environ.get("COLDBENCH_SERVER_REQUEST_TIMEOUT_S", "1800"))
# /health first: mlx_lm.server answers /v1/models by scanning the Hugging Face cache, which logs
# a CacheNotFound traceback into the server's log on a host without one.
READY_PATHS = ("/health", "/v1/models")
VALUE_PLACEHOLDER = "{value}"
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
STDERR_TAIL_CHARS = 2000
PROMPT_FIT_ATTEMPTS = 8
WATCH_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 120.0
# What a cell with cached tokens means, and the usual fix, in the reason a reviewer reads.
PROMPT_CACHE_REUSE = (
    "the server reused its prompt cache; start it with its prompt cache off "
    "(mlx_lm.server: --prompt-cache-size 0)"
)
# The warm canary (engine/canary.py) on a server: cold twins and repeats, the fastest of each.
CANARY_REPEATS = 3
# A server with its prompt cache on prefills a repeat of a prompt it holds in about one token's
# time, one with it off in a whole prefill's: a repeat faster than this share of the fastest
# cold twin was warm, whatever the server's count says.
WARM_BY_TIMING_RATIO = 0.5
# The server canary's smallest prompt, whatever the job's smallest context. Measured with
# benchmarks/server_canary.py on the micro checkpoint (docs/ENGINE.md): at 256 and 64 tokens (a
# cold twin of 8-40 ms) a held prompt read 0.59-0.65 of a twin and a cache-off run 0.67; at 512
# the twin took 46-400 ms, at times within 1.1 of the floor below; at 1024 0.24-0.52 s, every
# setting 0.35 or more from the threshold.
# (benchmarks/server_canary.py lowers it to measure smaller canaries).
CANARY_MIN_TOKENS = int(os.environ.get("COLDBENCH_SERVER_CANARY_MIN_TOKENS", "1024"))
# A cold twin faster than this is too close to the HTTP round trip and the first decode step
# (a held prompt's repeat took 6-18 ms) for the ratio to mean anything: unreliable at 40 ms and
# less, reliable from 46 ms. The record then says the timing could not tell instead of calling
# the server cold.
CANARY_MIN_TWIN_PREFILL_S = 0.05
CANARY_REASON = "warm canary (its prompt sent again: a prompt cache left on holds it)"
# Run by the server's own interpreter, with the server's environment: what it imports.
# Same shape as coldbench.engine.adapters.process_software (provenance reads both alike).
SOFTWARE_PROBE = """
import importlib, importlib.util, json, os, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "python_executable": sys.executable, "files": {}}
for key, name, dist in (("mlx", "mlx.core", "mlx"), ("mlx_lm", "mlx_lm", "mlx-lm")):
    try:
        module = importlib.import_module(name)
        out[key] = getattr(module, "__version__", None) or metadata.version(dist)
        out["files"][key] = os.path.realpath(module.__file__)
    except Exception as error:
        out[key] = None
        out.setdefault("errors", {})[key] = type(error).__name__ + ": " + str(error)[:200]
try:
    out["coldbench"] = metadata.version("coldbench")
except Exception:
    out["coldbench"] = None
target = sys.argv[1] if len(sys.argv) > 1 else ""
if target.startswith("-m:"):
    # `-m pkg sub`: pkg's __main__ dispatches to pkg.sub when there is one (mlx_lm server)
    module, _, sub = target[3:].partition(":")
    for name in ([module + "." + sub] if sub else []) + [module + ".__main__", module]:
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            spec = None
        if spec is not None and spec.origin and spec.origin != "built-in":
            out["files"]["server"] = os.path.realpath(spec.origin)
            break
elif target:
    out["files"]["server"] = os.path.realpath(target)
print(json.dumps(out))
"""


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
        self.options: dict[str, dict[str, Any]] = dict(plan.server_options or {})
        not_options = sorted(set(plan.flags) - set(self.options))
        if not_options:
            raise ServerLoadError(
                "openai-server adapter takes no engine flags, only the server options the host "
                f"declares; not a server option here: {', '.join(not_options)}"
            )
        if plan.server_command is None:
            raise ServerLoadError("openai-server adapter needs the plan's server_command")
        self.plan = plan
        self.ready_timeout_s = ready_timeout_s
        self.first_token_timeout_s = plan.first_token_timeout_s or DEFAULT_FIRST_TOKEN_TIMEOUT_S
        self.process: subprocess.Popen[bytes] | None = None
        self.prompts: PromptSource | None = None
        self.port = free_loopback_port()
        self.ready_path: str | None = None
        self._log: Any = None
        # Beside the variant's records, kept after the server ends: the run bundles it.
        records = Path(plan.records_path)
        self.log_path: Path = records.with_name(records.stem + ".server.log")
        self.wiped: list[dict[str, Any]] = []
        self.canary_small: str | None = None  # why the canary is under its minimum size
        self.software: dict[str, Any] | None = None
        self._probe: subprocess.Popen[str] | None = None
        self.proofs = {
            name: re.compile(option["proof"])
            for name, option in sorted(self.options.items())
            if option.get("proof")
        }
        # Checked before anything starts: a bad command is a load error, not a stray process.
        self.argv = self._argv(model="{model}")

    def _argv(self, *, model: str) -> list[str]:
        """The host's command with its placeholders filled, then each requested option's argv
        pieces (already rendered from validated values by the worker), in option-name order."""
        argv = server_argv(self.plan.server_command or [], port=self.port, model=model)
        for name in sorted(self.options):
            argv += list(self.options[name]["argv"])
        return argv

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"  # proof lines reach the log as they are printed
        for name in sorted(self.options):
            env.update(self.options[name]["env"])
        return env

    def load(self) -> None:
        if self.plan.model.startswith("preset:"):
            model_path = checkpoints.resolve_model(self.plan.model, {})
        else:
            model_path = Path(self.plan.model)
        self.argv = self._argv(model=str(model_path))
        tokenizer = _load_tokenizer(model_path)
        self.tokenizer = tokenizer
        config = json.loads((model_path / "config.json").read_text())
        # the server holds the model on this host's device: the same estimate applies
        memory = MemoryGuard.for_plan(self.plan, model_path)
        memory.check(min(self.plan.warmup_shapes()))
        self.prompts = PromptSource.for_plan(self.plan, tokenizer, config, checks=[memory.check])
        self.wiped = [wipe_path(path) for path in self.plan.wipe]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the server
        logger.info("starting server: %s", " ".join(self.argv))
        env = self._env()
        self._start_probe(env)
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
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
        self.software = self._finish_probe()

    def _start_probe(self, env: dict[str, str]) -> None:
        """Ask the server's interpreter what it imports, while the server loads."""
        interpreter, target = server_interpreter(self.plan.server_command or [], self.argv)
        if interpreter is None:
            self.software = {"probe": "the server command is not a Python interpreter or script"}
            return
        try:
            self._probe = subprocess.Popen(
                [interpreter, "-c", SOFTWARE_PROBE, target],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        except OSError as exc:
            self.software = {"probe": f"cannot run {interpreter}: {exc}"}

    def _finish_probe(self) -> dict[str, Any] | None:
        probe, self._probe = self._probe, None
        if probe is None:
            return self.software
        try:
            out, err = probe.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.communicate()
            return {"probe": f"no answer after {PROBE_TIMEOUT_S:.0f} s"}
        try:
            found = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"probe": f"exit {probe.returncode}: {' '.join(err.split())[-300:]}"}
        return found if isinstance(found, dict) else None

    def check_context(self, context_tokens: int) -> None:
        assert self.prompts is not None, "load() first"
        self.prompts.check_context(context_tokens)

    # -- lifecycle -----------------------------------------------------------------------

    def stderr_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        """The end of the server's log as one line (its lines joined by ` | `)."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(max(0, self.log_path.stat().st_size - chars))
                text = handle.read().decode(errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.strip().splitlines() if line.strip())

    def _log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> list[str]:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace").splitlines()
        except OSError:
            return []

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
            "server_env": {
                key: value
                for name in sorted(self.options)
                for key, value in self.options[name]["env"].items()
            },
            "server_options": {name: option["value"] for name, option in self.options.items()},
            "proofs": {name: pattern.pattern for name, pattern in self.proofs.items()},
            "wiped": self.wiped,
            "first_token_timeout_s": self.first_token_timeout_s,
            "server_log": self.log_path.name,
            "port": self.port,
            "ready_path": self.ready_path,
            # The engine runs in the server's process, out of sight: no import path to check
            # here; `software` is what the server's interpreter imports (see the probe).
            "engine_module_file": None,
            "software": self.software,
            "flags": dict(self.plan.flags),
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
        if self._probe is not None and self._probe.poll() is None:
            self._probe.kill()
            self._probe.communicate()
        self._probe = None
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- cells -------------------------------------------------------------------------------

    def option_execution(
        self, name: str, lines: Sequence[str], context_tokens: int
    ) -> tuple[Expectation, Observation] | None:
        """What a requested option implies at this context and what the server's own lines
        of the cell show (coldbench.engine.judge), or None for an option with nothing to judge.

        A proof line is the option's own word that it ran, at least one per cell, counted only
        where stock could not have printed it: with the option's `stock` value, a line its
        proof would match for stock (for a `prefill_step` option, for any chunk boundary stock
        reaches at this context) counts for nothing. The request is inert where it implies
        stock's work: the stock value itself, or a prefill step that cuts this prompt as
        stock's does."""
        option = self.options[name]
        value, stock = option["value"], option.get("stock")
        stock_values: set[Any] = set()
        inert = False
        if stock is not None and option.get("prefill_step"):
            layout = generate_step_widths(context_tokens, stock)
            inert = generate_step_widths(context_tokens, value) == layout
            boundaries = [0]
            for width, count in layout:
                boundaries += [boundaries[-1] + width * (i + 1) for i in range(count)]
            stock_values = set(boundaries)
        elif stock is not None:
            inert = value == stock
            stock_values = {stock}
        proof = self.proofs.get(name)
        if proof is None:
            return (
                (Expectation(name, None, None, same_as_stock=True), Observation(name, None))
                if inert
                else None
            )
        template = option.get("proof_template") or ""
        stock_lines = (
            [re.compile(_render_proof(template, v)) for v in sorted(stock_values)]
            if VALUE_PLACEHOLDER in template
            else []
        )
        count = sum(
            1
            for line in lines
            if proof.search(line) and not any(pattern.search(line) for pattern in stock_lines)
        )
        unprovable = None
        if stock_lines and value in stock_values:
            unprovable = (
                f"its proof line at {context_tokens} tokens is one the stock server prints too"
            )
        return (
            Expectation(name, AtLeast(1), 0, same_as_stock=inert),
            Observation(name, count, unprovable=unprovable),
        )

    def run_cell(self, round: int, order: int, context_tokens: int) -> Measurement:
        assert self.prompts is not None, "load() first"
        prompt = self.prompts.cell_prompt(self.plan.seed, round, context_tokens)
        return measure_prompt(self.measure, prompt, context_tokens)

    canary_reason = CANARY_REASON

    def canary_tokens(self, context_tokens: int) -> int:
        """The canary's prompt size for a run whose smallest warmed context is
        `context_tokens` (engine/runner.py asks before the canary): at least
        `CANARY_MIN_TOKENS`, since a smaller prompt's cold prefill is too short to time, within
        the model's positions and the memory guard. Where the minimum is refused it stays
        `context_tokens` (which the warm-up ran) and `canary_small` says why."""
        assert self.prompts is not None, "load() first"
        size = max(context_tokens, CANARY_MIN_TOKENS)
        limit = self.prompts.max_tokens
        if limit is not None and size > limit:
            size = max(context_tokens, limit)
        self.canary_small = None
        if size > context_tokens:
            try:
                self.prompts.check_context(size)
            except ValueError as refused:
                self.canary_small = " ".join(str(refused).split())
                return context_tokens
        if size < CANARY_MIN_TOKENS:
            self.canary_small = f"the model takes at most {limit} tokens (max_position_embeddings)"
        return size

    def canary_cell(self, context_tokens: int) -> Measurement:
        """The run's warm canary on the server (engine/canary.py): a warm-up-class prompt of
        `context_tokens` (sized by `canary_tokens`), sent once and then again `CANARY_REPEATS`
        times.

        A server cannot be handed a warm cache, and its count is the cold check; so the canary
        is also timed against cold twins (the prompt's first token, then its other tokens
        rotated: new to the server but for that one token, in the warm-up's own token class, so
        no measured prompt shares their start). The record is the last repeat, judged by the
        same rule as every cell, with `canary.*` counters (`canary_timing`): the fastest twin's
        and repeat's prefill, their ratio and `canary.warm_by_timing`."""
        assert self.prompts is not None, "load() first"
        size = context_tokens
        prompt = self.prompts.warmup_prompt(self.plan.seed, size)
        ids = [int(i) for i in prompt.ids]
        twins = [[ids[0], *ids[1 + k :], *ids[1 : 1 + k]] for k in range(1, CANARY_REPEATS + 1)]
        self.measure(ids, context_tokens=size)  # held now if the cache is on
        twin_s, repeats = [], []
        for twin in twins:  # interleaved: a load that comes and goes slows both alike
            twin_s.append(self.measure(twin, context_tokens=size).prefill_s)
            repeats.append(measure_prompt(self.measure, prompt, size))
        result = repeats[-1]
        if size < CANARY_MIN_TOKENS:  # the timing is unlikely to tell (canary_timing)
            result.counters["canary.under_min_tokens"] = self.canary_small or (
                f"asked for {size} tokens"
            )
        return canary_timing(result, twin_s, [r.prefill_s for r in repeats])

    def measure(self, prompt_ids: Sequence[int], *, context_tokens: int) -> Measurement:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.poll()
            # The runner keeps 500 characters of an exception: the log's last lines fit.
            raise RuntimeError(f"server is not running (exit code {code}): {self.stderr_tail(400)}")
        decode_tokens = self.plan.decode_tokens
        text, server_ids = fit_prompt_text(self.tokenizer, prompt_ids)
        body = {
            "prompt": text,
            "max_tokens": max(decode_tokens, 1),  # the first token ends the prefill
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        offset = self._log_offset()
        stream = _stream_completion(
            self.port,
            body,
            process=self.process,
            first_token_timeout_s=self.first_token_timeout_s,
        )
        lines = self._log_since(offset)
        execution = [
            judged
            for name in sorted(self.options)
            if (judged := self.option_execution(name, lines, context_tokens)) is not None
        ]
        dispatched = {
            name: observation.observed
            for _, observation in execution
            if (name := observation.flag) in self.proofs
        }
        usage = stream["usage"] or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        cached_tokens = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
        if cached_tokens is not None and cold_check_blind():  # the planted fault (canary)
            cached_tokens = 0
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
            execution=execution,
            cache="the server",
            reuse=PROMPT_CACHE_REUSE,
        )
        decode_steps = (decoded or 0) - 1
        result = Measurement(
            prompt_tokens=prompt_tokens,
            prompt_sha256=ids_sha256(server_ids),
            cached_tokens=cached_tokens,
            prefill_s=prefill_s,
            prefill_tps=n / prefill_s if prefill_s else None,
            decode_tokens=decoded,
            decode_s=decode_s if decode_steps > 0 else None,
            decode_tps=decode_steps / decode_s if decode_steps > 0 and decode_s else None,
            # The stream carries text, not ids: no output ids are known, only the text's digest.
            counters={
                "stream_events": stream["events"],
                "prompt_ids_refit": list(server_ids) != [int(i) for i in prompt_ids],
                "output_text_sha256": hashlib.sha256(stream["text"].encode()).hexdigest(),
                **{f"{name}.dispatched": count for name, count in dispatched.items()},
            },
        )
        judgement.record(result)
        if stream["error"]:
            result.status = "error"
            result.reason = f"{stream['error']}; server log: {self.stderr_tail()}"
        elif prefill_s is None:
            result.status = "error"
            result.reason = f"server streamed no token; server log: {self.stderr_tail()}"
        return result


def canary_timing(
    result: Measurement, twin_s: Sequence[float | None], repeat_s: Sequence[float | None]
) -> Measurement:
    """The server canary's verdict by timing, added to its judged record (the last repeat).

    Counters: `canary.cold_twin_prefill_s` and `canary.repeat_prefill_s` (the fastest of each),
    `canary.prefill_ratio`, `canary.timing_could_tell` (the fastest twin took at least
    `CANARY_MIN_TWIN_PREFILL_S`) and `canary.warm_by_timing` (the ratio below
    `WARM_BY_TIMING_RATIO`; None where the timing could not tell). With the server's count at
    0 (status `ok`), the reason says which: warm by timing is a blind count (evidence/analysis/
    canary.py: `passed`); not warm is a server that keeps no prompt cache (`unwarmed`); a twin
    too fast to time leaves the count unverified (`unverified`). A count that saw the cache
    (`invalid`) is caught whatever the timing. Without a timed twin and repeat the record is
    left as it is (an error record: the canary proved nothing)."""
    cold = [t for t in twin_s if t]
    warm = [t for t in repeat_s if t]
    if not cold or not warm:
        return result
    ratio = min(warm) / min(cold)
    could_tell = min(cold) >= CANARY_MIN_TWIN_PREFILL_S
    is_warm = ratio < WARM_BY_TIMING_RATIO if could_tell else None
    result.counters.update(
        {
            "canary.cold_twin_prefill_s": round(min(cold), 6),
            "canary.repeat_prefill_s": round(min(warm), 6),
            "canary.prefill_ratio": round(ratio, 4),
            "canary.timing_could_tell": could_tell,
            "canary.warm_by_timing": is_warm,
        }
    )
    if result.status != "ok":
        return result
    if not could_tell:
        result.reason = (
            f"timing could not tell: cold twin took {min(cold) * 1000:.0f} ms, under the "
            f"{CANARY_MIN_TWIN_PREFILL_S * 1000:.0f} ms a cold prefill needs to be timed apart "
            f"from a held prompt's repeat ({ratio:.2f} of it); the server counted 0 cached "
            "tokens, as a blind count would"
        )
    elif is_warm:
        result.reason = (
            f"the server counted 0 cached tokens but prefilled the repeat in {ratio:.2f} "
            "of a cold twin's time: it reused its prompt cache without saying so"
        )
    else:
        result.reason = (
            f"not warm: the repeat prefilled in {ratio:.2f} of a cold twin's time, so the "
            "server keeps no prompt cache"
        )
    return result


def _render_proof(template: str, value: Any) -> str:
    """The proof with `{value}` filled, as coldbench.evidence.spec.options renders it (escaped)."""
    text = ("1" if value else "0") if isinstance(value, bool) else str(int(value))
    return template.replace(VALUE_PLACEHOLDER, re.escape(text))


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


def wipe_path(path: str) -> dict[str, Any]:
    """Delete one of the server's cache folders (or files) before it starts; say what went.

    The worker validated the path (absolute, not /, not the home folder); this re-checks the
    two that would be disasters, since a plan file is only JSON. A block's servers load at the
    same time and wipe the same folder, so a file or folder a peer removed first is gone, as
    wanted, and not an error."""
    target = Path(path)
    if not target.is_absolute() or target == Path(target.anchor) or target == Path.home():
        raise ServerLoadError(f"refusing to wipe {path!r}: name the server's cache folder")
    if not target.exists() and not target.is_symlink():
        return {"path": path, "existed": False, "bytes": 0}
    size = 0
    if target.is_dir() and not target.is_symlink():
        for root, _dirs, files in os.walk(target):
            for name in files:
                with contextlib.suppress(OSError):
                    size += (Path(root) / name).lstat().st_size
        # a peer's server that is up already may write its block while this removes the
        # folder (rmdir: not empty): another pass removes that too
        for passes_left in (2, 1, 0):
            try:
                if sys.version_info >= (3, 12):
                    shutil.rmtree(target, onexc=_gone_already_or_raise)
                else:
                    shutil.rmtree(target, onerror=_gone_already_or_raise)
                break
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY and passes_left:
                    continue
                raise ServerLoadError(f"cannot wipe {path}: {exc}") from exc
    else:
        try:
            size = target.lstat().st_size
            target.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ServerLoadError(f"cannot wipe {path}: {exc}") from exc
    return {"path": path, "existed": True, "bytes": size}


def _gone_already_or_raise(_function: Any, _path: str, error: Any) -> None:
    """rmtree's error handler (`onexc` gets the exception, `onerror` before 3.12 its
    exc_info): a peer's wipe removed this entry first; anything else raises."""
    exc = error if isinstance(error, BaseException) else error[1]
    if not isinstance(exc, FileNotFoundError):
        raise exc


def server_interpreter(command: Sequence[str], argv: Sequence[str]) -> tuple[str | None, str]:
    """(the Python interpreter that runs the server, what it runs: `-m:module`, with
    `:subcommand` when a word follows the module, or a script).

    `{python}` first in the host's command is this interpreter; a script whose `#!` line names
    python runs under that interpreter. Anything else is not asked (None)."""
    if not argv:
        return None, ""
    interpreter: str | None = None
    rest = list(argv[1:])
    if command and command[0] == "{python}":
        interpreter = argv[0]
    else:
        with contextlib.suppress(OSError):
            first = Path(argv[0]).read_bytes()[:200].split(b"\n")[0].decode(errors="replace")
            if first.startswith("#!") and "python" in first:
                words = first[2:].split()
                if Path(words[0]).name == "env" and len(words) > 1:
                    interpreter = shutil.which(words[1])
                else:
                    interpreter = words[0]
                rest = [argv[0], *rest]
    if interpreter is None:
        return None, ""
    target = ""
    if len(rest) >= 2 and rest[0] == "-m":
        sub = rest[2] if len(rest) > 2 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rest[2]) else ""
        target = f"-m:{rest[1]}" + (f":{sub}" if sub else "")
    elif rest and not rest[0].startswith("-"):
        target = str(Path(rest[0]).resolve())
    return interpreter, target


def _stream_completion(
    port: int,
    body: dict[str, Any],
    *,
    process: subprocess.Popen[bytes] | None = None,
    first_token_timeout_s: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S,
) -> dict[str, Any]:
    """POST /v1/completions with stream=True; time the first and last token events.

    A watchdog thread ends the request early when the server process exits or when no token
    has arrived `first_token_timeout_s` after the request was sent: it shuts the socket, the
    read below fails, and `error` says which of the two happened."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    result: dict[str, Any] = {
        "prefill_s": None,
        "decode_s": None,
        "usage": None,
        "text": "",
        "events": 0,
        "error": None,
    }
    done = threading.Event()
    first_token = threading.Event()
    ended: list[str] = []
    # The socket itself: a response that closes the connection takes it over from `conn`.
    sockets: list[socket.socket] = []

    def watch(started: float) -> None:
        while not done.wait(WATCH_INTERVAL_S):
            why = None
            code = process.poll() if process is not None else None
            if code is not None:
                why = f"server exited with code {code} during the cell"
            elif not first_token.is_set() and time.monotonic() - started > first_token_timeout_s:
                why = (
                    f"no token {first_token_timeout_s:g} s after the request "
                    "(first_token_timeout_s): the server's generation looks dead"
                )
            if why is not None:
                ended.append(why)
                for sock in sockets:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return

    watchdog: threading.Thread | None = None
    try:
        conn.connect()
        if conn.sock is not None:
            sockets.append(conn.sock)
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        started = time.perf_counter()
        watchdog = threading.Thread(target=watch, args=(time.monotonic(),), daemon=True)
        watchdog.start()
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
                    first_token.set()
                    last_at = now
                    result["text"] += piece
        if first_at is not None and last_at is not None:
            result["prefill_s"] = first_at - started
            result["decode_s"] = last_at - first_at
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        result["error"] = f"stream failed: {type(exc).__name__}: {exc}"
    finally:
        done.set()
        if watchdog is not None:
            watchdog.join()
        conn.close()
    if not ended and result["error"] and process is not None:
        # A server that died mid-request closes the connection a moment before it is reaped.
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = process.wait(timeout=1)
            ended.append(f"server exited with code {code} during the cell")
    if ended:
        # The watchdog's reason is the cause; the read error it provoked is only the symptom.
        result["error"] = ended[0]
    return result
