"""The agent against the real service: PostgreSQL, `coldbench server`, agents as processes."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from tests.worker.service import running_service, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def write_config(
    path: Path,
    *,
    name: str,
    repositories: dict[str, tuple[str, list[str]]] | None = None,
    labels: tuple[str, ...] = (),
) -> Path:
    """A worker.toml: repositories maps name -> (url, recipe names, all `pip install -e .`)."""
    lines = [f'name = "{name}"', f"labels = {json.dumps(list(labels))}", 'state_dir = "state"']
    for repo, (url, recipes) in (repositories or {}).items():
        lines += [f"[repositories.{repo}]", f'url = "{url}"', 'module = "mlx_lm"']
        for recipe in recipes:
            lines += [
                f"[repositories.{repo}.recipes.{recipe}]",
                'command = ["{python}", "-m", "pip", "install", "--no-deps", '
                '"--no-build-isolation", "-e", "."]',
            ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_enrollment_and_refusals(tmp_path: Path) -> None:
    """Secret kept 0600; a job outside the allow-list never reaches the host; a recipe the host
    lacks (its worker.toml changed after enrollment) is refused by the worker itself."""
    # A short lease: a long-poll of the stopped agent may still claim the job for nobody (the
    # server cannot know the client left); that lease must expire quickly.
    with running_service(tmp_path, lease_ttl_s=5) as service:
        config = write_config(
            tmp_path / "host-a" / "worker.toml",
            name="host-a",
            repositories={"forked": (str(tmp_path / "nowhere"), ["editable", "fast"])},
        )
        agent_log = tmp_path / "agent-a.log"
        agent = service.start_agent(
            config, token=service.enrollment_token("lab:test"), log=agent_log
        )
        secret_path = config.with_name("worker.secret")
        deadline = time.monotonic() + 60
        while not secret_path.exists():
            assert agent.poll() is None, _log(agent_log)
            assert time.monotonic() < deadline, _log(agent_log)
            time.sleep(0.2)
        assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
        assert json.loads(secret_path.read_text())["secret"].startswith("cbw_")

        # Outside the allow-list: the server refuses it at submission; no host ever sees it.
        outside = service.submit(
            {
                "adapter": "mlx-lm",
                "repository": "evil",
                "variants": [{"name": "x", "ref": "main"}],
                "contexts": [64],
            }
        )
        assert outside.status_code == 422, outside.text
        assert "does not allow repository 'evil'" in outside.text

        # The host owner drops the `fast` recipe and restarts the agent (already enrolled).
        stop_process(agent)
        write_config(
            config,
            name="host-a",
            repositories={"forked": (str(tmp_path / "nowhere"), ["editable"])},
        )
        agent = service.start_agent(config, token=None, log=agent_log)
        created = service.submit(
            {
                "adapter": "mlx-lm",
                "repository": "forked",
                "variants": [{"name": "x", "ref": "main", "recipe": "fast"}],
                "contexts": [64],
                "rounds": 1,
            }
        )
        assert created.status_code == 201, created.text
        job = service.wait_jobs([created.json()["id"]], timeout_s=60, done=("failed",))
        run = job[created.json()["id"]]["runs"][0]
        assert "refused by host host-a" in run["reason"]
        assert "recipe 'fast' is not defined for forked" in run["reason"]
        # Refused before anything was cloned or built.
        assert not (config.parent / "state" / "mirrors").exists()
        assert not (config.parent / "state" / "venvs").exists()
        assert b"refused" in service.artifact(run["id"], "reason.txt")
        assert agent.poll() is None
        assert stop_process(agent) == 0, _log(agent_log)
