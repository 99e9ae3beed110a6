"""The classic server experiment from `coldbench run`, where the user is the host: one build
(this interpreter's mlx_lm.server), an option on vs off, a fresh server per variant, its cache
folder wiped before each start, the option's proof line counted in the server's own output,
and a planted option (accepted by the server, ignored) caught as a silent no-op."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from coldbench.evidence.contract.records import read_records

# mlx_lm.server behind a wrapper with two flags of its own: `--fast` really changes what runs
# (each request goes through a patched path that says so on stderr); `--fake-fast` is accepted
# and ignored, the planted no-op. It also leaves a block in its cache folder, as an SSD cache.
WRAPPER = textwrap.dedent(
    """
    import os, sys
    from mlx_lm import server

    fast = "--fast" in sys.argv
    sys.argv = [a for a in sys.argv if a not in ("--fast", "--fake-fast")]
    cache = os.environ["WRAPPER_CACHE"]
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, f"block-{os.getpid()}"), "wb") as block:
        block.write(b"kv" * 512)
    if fast:
        generate = server.ResponseGenerator.generate

        def fast_generate(self, *args, **kwargs):
            print("fast path: dispatched", file=sys.stderr, flush=True)
            return generate(self, *args, **kwargs)

        server.ResponseGenerator.generate = fast_generate
    server.main()
    """
)


@pytest.mark.slow
def test_server_option_on_vs_off_with_a_planted_no_op(
    coldbench_cmd: list[str], tmp_path: Path, micro_model_dir: Path
) -> None:
    wrapper = tmp_path / "wrapper_server.py"
    wrapper.write_text(WRAPPER)
    cache = tmp_path / "server-cache"
    cache.mkdir()
    (cache / "stale-block").write_bytes(b"x" * 100)
    env_cache = f'{{type = "bool", env = {{WRAPPER_CACHE = "{cache}"}}}}'
    args = [
        "--adapter", "openai-server",
        "--server-command",
        f"{{python}} {wrapper} --model {{model}} --port {{port}} --prompt-cache-size 0",
        "--option", 'fast={type = "bool", argv = ["--fast"], proof = "fast path: dispatched"}',
        "--option",
        'planted={type = "bool", argv = ["--fake-fast"], proof = "fast path: dispatched"}',
        "--option", f"cache={env_cache}",
        "--wipe", str(cache),
        "--first-token-timeout-s", "60",
        "--variant", "off:cache=1",
        "--variant", "on:cache=1,fast=1",
        "--variant", "planted:cache=1,planted=1",
        "--model", "preset:micro",
        "--contexts", "64",
        "--rounds", "2",
        "--decode-tokens", "2",
        "--out", str(tmp_path / "out"),
        "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    done = subprocess.run(
        [*coldbench_cmd, "run", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    assert verify_bundle(out).is_intact
    # measured cells only: the run's warm canary (round -2) is in records.jsonl too
    records = [r for r in read_records(out / "records.jsonl") if r.round >= 0]
    by_variant: dict[str, list] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)
    assert {v: len(rs) for v, rs in by_variant.items()} == {"off": 2, "on": 2, "planted": 2}
    for record in by_variant["off"]:
        assert record.status == "ok" and record.cached_tokens == 0, record.reason
        assert "fast.dispatched" not in record.counters
    for record in by_variant["on"]:
        assert record.status == "ok", record.reason
        assert record.counters["fast.dispatched"] == 1
        assert record.flags == {"cache": True, "fast": True}
    for record in by_variant["planted"]:
        assert record.status == "invalid" and record.reason == "silent no-op: planted"
        assert record.counters["planted.dispatched"] == 0
    summary_md = (out / "summary.md").read_text()
    assert "2 x silent no-op: planted" in summary_md

    provenance = json.loads((out / "provenance.json").read_text())
    targets = {t["variant"]: t for t in provenance["targets"]}
    for name, target in targets.items():
        ready = target["ready"]
        # A fresh server per variant, started from this interpreter with the host's argv.
        assert ready["server_command"][1] == str(wrapper)
        assert ready["wiped"][0]["path"] == str(cache)
        software = target["software"]
        assert software["files"]["mlx_lm"].endswith("mlx_lm/__init__.py"), name
        assert software["mlx"] and software["files"]["server"] == str(wrapper.resolve())
    # Servers load side by side: the first wipe found the stale block (and maybe a block of a
    # server already up), the others what was left; the stale block never survived a start.
    wiped = [t["ready"]["wiped"][0] for t in targets.values()]
    assert any(w["existed"] and w["bytes"] >= 100 for w in wiped), wiped
    assert not (cache / "stale-block").exists()
    assert targets["on"]["ready"]["server_command"][-1] == "--fast"
    assert targets["planted"]["ready"]["server_command"][-1] == "--fake-fast"
    # Each server's log is in the bundle, with the proof lines of the honest option.
    logs = sorted(p.name for p in out.glob("server-*.log"))
    # Two rounds are two process blocks (rounds // 12, at least 1): a fresh server per block.
    assert logs == [f"server-{v}.{i}.log" for v in ("off", "on", "planted") for i in (1, 2)]
    assert "fast path: dispatched" in (out / "server-on.1.log").read_text()
    assert "fast path: dispatched" not in (out / "server-planted.1.log").read_text()
    # The reproduce command carries the declarations, so the same experiment can be rerun.
    assert "--server-command" in provenance["command"] and "planted=" in provenance["command"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--adapter", "openai-server"], "--adapter openai-server needs --server-command"),
        (["--server-command", "x {port}"], "--server-command: only with --adapter openai-server"),
        (
            ["--adapter", "openai-server", "--server-command", "srv --port 80"],
            "--server-command: must be a non-empty argv naming {port}",
        ),
        (
            [
                "--adapter", "openai-server", "--server-command", "srv {port}",
                "--option", 'n={type = "int", min = 1, max = 8, argv = ["--n", "{value}"]}',
                "--variant", "a:n=9",
            ],
            "variant a: option n=9: allowed 1..8",
        ),
        (
            [
                "--adapter", "openai-server", "--server-command", "srv {port}",
                "--variant", "a:extra_arg=1",
            ],
            "variant a: option extra_arg is not declared by the host (declared: none)",
        ),
        (
            [
                "--adapter", "openai-server", "--server-command", "srv {port}",
                "--option", 'n={type = "int", argv = ["--n", "{value}"]}',
            ],
            "--option n: an int option needs min and max",
        ),
        (
            ["--adapter", "openai-server", "--server-command", "srv {port}", "--wipe", "/"],
            "--wipe: '/' would delete / or the home folder",
        ),
    ],
)  # fmt: skip
def test_server_run_bad_input_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    monkeypatch.chdir(tmp_path)  # where `coldbench run` keeps its state by default
    done = CliRunner().invoke(app, ["run", *args, "--out", str(tmp_path / "out")])
    assert done.exit_code == 2, done.output[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and message in lines[-1], done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_server_that_cannot_start_fails_the_run_with_its_reason_and_log(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    from coldbench.evidence.contract.schemas import HostInfo, JobSpec
    from coldbench.worker.config import RepositoryConfig
    from coldbench.worker.run import execute_run

    repository = RepositoryConfig(
        name="installed-server",
        url=None,
        adapter="openai-server",
        server_command=(
            "{python}",
            "-c",
            "import sys; print('loading weights...'); sys.exit('out of memory on ' + sys.argv[1])",
            "{port}",
        ),
    )
    spec = JobSpec.model_validate(
        {
            "adapter": "openai-server",
            "repository": "installed-server",
            "variants": [{"name": "a"}],
            "contexts": [64],
            "rounds": 1,
            "model": "micro",
        }
    )
    outcome = execute_run(
        spec,
        run_id="r-dead-server",
        workdir=tmp_path / "work",
        state_dir=tmp_path / "state",
        host=HostInfo(backend="cpu"),
        repositories={"installed-server": repository},
        models={"micro": micro_model_dir},
    )
    assert outcome.status == "failed"
    assert outcome.reason is not None and "server exited with code 1 before ready" in outcome.reason
    reason = outcome.files["reason.txt"].decode()
    assert reason == outcome.reason + "\n" and "out of memory on" in reason
    log = outcome.files["server-a.1.log"].decode()
    assert "loading weights..." in log and "out of memory on" in log
