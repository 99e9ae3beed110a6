"""`coldbench demo` end to end (a short variant): every child is real and every child stops."""

from __future__ import annotations

import os
import queue
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _processes_with_state_dir(state_dir: Path) -> list[int]:
    """Pids whose environment names this demo's state directory: the demo's own children."""
    needle = f"COLDBENCH_STATE_DIR={state_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _wait_gone(state_dir: Path, timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_with_state_dir(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_demo_produces_verified_evidence_and_stops_every_child(
    tmp_path: Path, coldbench_cmd: list[str]
) -> None:
    state_dir = tmp_path / "state"
    result = subprocess.run(
        [
            *coldbench_cmd,
            "demo",
            "--dir",
            str(state_dir),
            "--rounds",
            "2",
            "--contexts",
            "128",
            "--decode-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    urls = re.findall(r"(ab|ablation) evidence: (http://127\.0\.0\.1:\d+/e/[0-9a-f]+)", output)
    assert [mode for mode, _ in urls] == ["ab", "ablation"], output[-4000:]
    bundles = sorted((state_dir / "evidence").glob("*.zip"))
    assert len(bundles) == 2
    for bundle in bundles:
        verify = subprocess.run(
            [*coldbench_cmd, "verify", str(bundle)], capture_output=True, text=True, timeout=120
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert bundle.stem in verify.stdout
    assert "| 128 | candidate |" in output  # the A/B verdict table was printed
    # Each job measures until decided, as every job does, within the demo's budget.
    assert re.search(r"submitted ab job \w+ \(until decided, 2 rounds at most\)", output)
    # The terminal prints the PR Markdown: its evidence id linked to the page.
    for _, url in urls:
        evidence_id = url.rsplit("/", 1)[1]
        assert f"Evidence id: [`{evidence_id}`]({url})" in output
    # How to log in, and the command that makes another key for this demo's database.
    hint = re.search(
        r"log in at (http://\S+/login) with the API key (cbk_\S+) \(another key: (.*)\)", output
    )
    assert hint, output[-4000:]
    command = hint.group(3)
    assert command == f"COLDBENCH_STATE_DIR={state_dir} coldbench admin apikey NAME"
    env = {**os.environ, "COLDBENCH_STATE_DIR": str(state_dir)}
    env.pop("COLDBENCH_DATABASE_URL", None)
    made = subprocess.run(
        [*coldbench_cmd, "admin", "apikey", "second"], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(state_dir / "coldbench.db") as database:
        names = {name for (name,) in database.execute("select name from api_keys")}
    assert names == {"demo", "second"}
    # Every step carries its time, and the end says where the time went.
    assert re.search(r"^\s*\d+\.\d s api: http://", output, re.M), output[-4000:]
    breakdown = re.search(r"where the time went: (.*)", output)
    assert breakdown and "database and tokens" in breakdown.group(1)
    assert "ab running" in breakdown.group(1)
    assert _wait_gone(state_dir) == []


def test_ctrl_c_twice_stops_every_child(tmp_path: Path, coldbench_cmd: list[str]) -> None:
    state_dir = tmp_path / "state"
    demo = subprocess.Popen(
        [*coldbench_cmd, "demo", "--dir", str(state_dir), "--rounds", "2", "--contexts", "128"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # as a shell starts a background job (a CI runner, `coldbench demo &`): SIGINT ignored,
        # so Python would install no KeyboardInterrupt handler unless the demo does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # Interrupt as the demo says it submitted its first job: the server, Celery and the
        # agent are all up then, and the jobs' measuring still ahead (seconds at the least).
        deadline = time.monotonic() + 240
        while not any("submitted ab job" in line for line in output):
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "the demo ended before it submitted: " + "".join(output)
            output.append(line)
        assert len(_processes_with_state_dir(state_dir)) >= 4
        demo.send_signal(signal.SIGINT)
        time.sleep(0.5)
        demo.send_signal(signal.SIGINT)  # an impatient second Ctrl-C must not cut clean-up short
        demo.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if demo.poll() is None:
            demo.kill()
    while not lines.empty():  # what the demo printed after the interrupt, up to its end
        line = lines.get_nowait()
        if line is not None:
            output.append(line)
    text = "".join(output)
    assert demo.returncode == 130, text[-3000:]
    assert "stopping every child process" in text
    assert "demo finished" not in text
    assert _wait_gone(state_dir) == []
