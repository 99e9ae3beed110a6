"""The service as child processes of the `coldbench` CLI: started, watched and stopped.

What `coldbench demo` runs its server, Celery and agent with, and what the test suite's service
harness (tests/stack.py) builds on. Every child runs in its own session, so one signal to its
process group reaches everything it started (Celery's pool, variant processes); its output goes
to a log file whose tail is quoted when it dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How often a wait looks again: a server that became healthy is seen at most this late.
POLL_S = 0.2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop_process(
    process: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, grace_s: float = 20.0
) -> int:
    """Signal a child's group, wait up to `grace_s`, then kill what is left of the group.

    The group is killed even after the child exited: its children (Celery's pool, variant
    processes after the child itself was killed) may outlive it. Returns the exit code.
    """
    if process.poll() is None:
        signal_group(process, sig)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait(timeout=5)
    signal_group(process, signal.SIGKILL)
    return process.returncode


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self, tail: int = 3000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-tail:]


@dataclass
class Children:
    """`coldbench` child processes sharing an environment, each logging to its own file."""

    log_dir: Path
    env: dict[str, str]
    cwd: Path | None = None
    started: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> Child:
        """`coldbench ARGS` with this environment updated by `env`, logging to `log_path`
        (appended; `<log_dir>/<name>.log` when not given)."""
        log_path = log_path or self.log_dir / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "coldbench", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env, **(env or {})},
                cwd=self.cwd,
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        self.started.append(child)
        return child

    def check_alive(self) -> None:
        for child in self.started:
            if child.process.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with code {child.process.returncode}; "
                    f"its log ({child.log_path}) ends:\n{child.log(2000)}"
                )

    def stop(self, child: Child, *, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> int:
        """Stop one child (and its group); it is no longer watched."""
        code = stop_process(child.process, sig=sig, grace_s=grace_s)
        if child in self.started:
            self.started.remove(child)
        return code

    def stop_all(self, grace_s: float = 15.0) -> None:
        # A second Ctrl-C (or SIGTERM from a supervisor) must not cut the clean-up short and
        # leave children behind: signals are ignored until every child is gone.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
        try:
            self._stop_all(grace_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_all(self, grace_s: float) -> None:
        # Agents first (they finish the cell in flight), then the services behind them: the
        # reverse of the order they were started in, all signalled before any is waited for.
        for child in reversed(self.started):
            signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.started):
            stop_process(child.process, grace_s=max(0.1, deadline - time.monotonic()))
        self.started.clear()


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float = 300.0, cwd: Path | None = None
) -> str:
    """`coldbench ARGS` to completion; its stdout, or RuntimeError with its error output."""
    result = subprocess.run(
        [sys.executable, "-m", "coldbench", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"`coldbench {' '.join(args)}` failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return result.stdout


def wait_healthy(base_url: str, children: Children, timeout_s: float = 120.0) -> None:
    """Until `base_url/healthz` answers 200; a child that exits meanwhile fails the wait."""
    import httpx

    deadline = time.monotonic() + timeout_s
    # One client for the whole wait: each httpx client loads the CA bundle (a quarter of a
    # second of CPU on a 2-core machine), and the wait polls every POLL_S.
    with httpx.Client(base_url=base_url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            children.check_alive()
            with suppress(httpx.HTTPError):
                if client.get("/healthz").status_code == 200:
                    return
            time.sleep(POLL_S)
    raise RuntimeError(f"the API at {base_url} did not become healthy in {timeout_s:.0f} s")
