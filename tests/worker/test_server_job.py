"""The server experiment through the service: a host declares a server repository in
worker.toml (its server command, a cache folder wiped before every start, an option whose proof
line the server prints, a planted option it accepts and ignores); a submitter asks for option
off / on / planted on the job form; the host's agent runs it, and the evidence shows the proof
counted, the planted option caught as a silent no-op, the wipe and each server's log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.stack import Stack, stop_process
from tests.worker.test_server_experiment import WRAPPER

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _csrf(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF field in the page"
    return match.group(1)


def test_a_server_experiment_submitted_on_the_form_runs_on_a_host(
    mlx_lm_repo: tuple[Path, tuple[str, str]],
    micro_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    service: Stack,
) -> None:
    repo, _ = mlx_lm_repo
    root = tmp_path_factory.mktemp("server-host")
    wrapper = root / "wrapper_server.py"
    wrapper.write_text(WRAPPER)
    cache = root / "server-cache"
    cache.mkdir()
    (cache / "stale-block").write_bytes(b"x" * 100)
    server_command = [
        "{python}", str(wrapper), "--model", "{model}", "--port", "{port}",
        "--prompt-cache-size", "0",
    ]  # fmt: skip
    config = root / "worker.toml"
    config.write_text(
        'name = "host-s"\nstate_dir = "state"\nallow_presets = ["micro"]\n'
        f'[repositories.srv]\nurl = "{repo}"\nadapter = "openai-server"\n'
        f"server_command = {json.dumps(server_command)}\n"
        f"wipe = {json.dumps([str(cache)])}\nfirst_token_timeout_s = 60\n"
        "[repositories.srv.recipes.editable]\n"
        'command = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", '
        '"-e", "."]\n'
        '[repositories.srv.options.fast]\ntype = "bool"\nargv = ["--fast"]\n'
        'proof = "fast path: dispatched"\n'
        '[repositories.srv.options.planted]\ntype = "bool"\nargv = ["--fake-fast"]\n'
        'proof = "fast path: dispatched"\n'
        '[repositories.srv.options.cache]\ntype = "bool"\n'
        f"env = {{WRAPPER_CACHE = {json.dumps(str(cache))}}}\n"
    )
    log = root / "agent.log"
    agent = service.start_agent(config, token=service.enrollment_token(), log=log)
    try:
        service.wait_hosts({"host-s"}, [(agent, log)])

        # The submitter logs in and submits the form, as a browser would.
        with httpx.Client(base_url=service.url, timeout=30) as browser:
            page = browser.get("/login")
            login = browser.post(
                "/login",
                data={"api_key": service.api_key, "csrf_token": _csrf(page.text), "next": "/"},
            )
            assert login.status_code == 303, login.text
            form = browser.get("/")
            assert '<option value="srv"' in form.text, form.text
            rows = [
                ("off", "cache=1"),
                ("on", "cache=1, fast=1"),
                ("planted", "cache=1, planted=1"),
            ]
            fields: dict[str, str] = {
                "csrf_token": _csrf(form.text),
                "repository": "srv",
                "adapter": "openai-server",
                "recipe": "editable",
                "mode": "ab",
                "custom_contexts": "64",
                "rounds": "2",
                "decode_tokens": "2",
                "model": "preset:micro",
                "hosts": "1",
                "precision": "0.05",
                "seed": "0",
            }
            for index, (name, flags) in enumerate(rows):
                fields[f"variant-{index}-name"] = name
                fields[f"variant-{index}-ref"] = "main"
                fields[f"variant-{index}-flags"] = flags
            submitted = browser.post("/", data=fields)
            assert submitted.status_code == 303, submitted.text[-3000:]
            job_id = submitted.headers["location"].removeprefix("/jobs/")

        job = service.wait_jobs([job_id], timeout_s=500, done=("completed", "processed", "failed"))
        (run,) = job[job_id]["runs"]
        assert run["state"] in ("completed", "processed"), (run, log.read_text()[-3000:])
        lines = service.artifact(run["id"], "records.jsonl").decode().splitlines()
        # the measured cells: not the warm-ups (round -1) nor the run's warm canary (round -2)
        records = [r for r in map(json.loads, lines) if r["round"] >= 0]
        by_variant: dict[str, list[dict]] = {}
        for record in records:
            by_variant.setdefault(record["variant"], []).append(record)
        assert {v: len(rs) for v, rs in by_variant.items()} == {
            "off": 2,
            "on": 2,
            "planted": 2,
        }
        for record in by_variant["off"]:
            assert record["status"] == "ok", record["reason"]
            assert "fast.dispatched" not in record["counters"]
        for record in by_variant["on"]:
            assert record["status"] == "ok", record["reason"]
            assert record["counters"]["fast.dispatched"] > 0
        for record in by_variant["planted"]:
            assert record["status"] == "invalid"
            assert record["reason"] == "silent no-op: planted"
            assert record["counters"]["planted.dispatched"] == 0
        summary_md = service.artifact(run["id"], "summary.md").decode()
        assert "2 x silent no-op: planted" in summary_md

        provenance = json.loads(service.artifact(run["id"], "provenance.json"))
        targets = {t["variant"]: t for t in provenance.get("runs", [provenance])[0]["targets"]}
        for target in targets.values():
            ready = target["ready"]
            assert ready["server_command"][1] == str(wrapper)
            assert ready["wiped"][0]["path"] == str(cache)
        assert targets["on"]["ready"]["server_command"][-1] == "--fast"
        assert not (cache / "stale-block").exists()
        on_log = service.artifact(run["id"], "server-on.1.log").decode()
        planted_log = service.artifact(run["id"], "server-planted.1.log").decode()
        assert "fast path: dispatched" in on_log
        assert "fast path: dispatched" not in planted_log
    finally:
        stop_process(agent)
