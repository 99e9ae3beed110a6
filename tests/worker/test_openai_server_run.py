"""A job driven through the openai-server adapter: the server command comes from the host's
config (never from the job), runs from the variant's own build, and every cell is cold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coldbench.evidence.contract.records import parse_records
from coldbench.evidence.contract.schemas import HostInfo, JobSpec
from coldbench.worker.config import ConfigError, parse_host_config
from coldbench.worker.run import RunRefused, check_job, execute_run

pytestmark = pytest.mark.slow

SERVER_COMMAND = ["{python}", "-m", "mlx_lm.server", "--model", "{model}", "--port", "{port}"]


def _config(repo: Path, **repository: object) -> dict[str, object]:
    return {
        "name": "server-host",
        "repositories": {
            "mlx-lm-server": {
                "url": str(repo),
                "adapter": "openai-server",
                "recipes": {
                    "editable": {
                        "command": [
                            "{python}",
                            "-m",
                            "pip",
                            "install",
                            "--no-deps",
                            "--no-build-isolation",
                            "-e",
                            ".",
                        ]
                    }
                },
                **repository,
            }
        },
    }


def test_server_command_is_required_and_host_owned(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="server_command is required"):
        parse_host_config(_config(tmp_path), base=tmp_path)
    with pytest.raises(ConfigError, match="naming \\{port\\}"):
        parse_host_config(_config(tmp_path, server_command=["{python}", "-m", "x"]), base=tmp_path)
    config = parse_host_config(_config(tmp_path, server_command=SERVER_COMMAND), base=tmp_path)
    spec = JobSpec.model_validate(
        {
            "adapter": "mlx-lm",
            "repository": "mlx-lm-server",
            "variants": [{"name": "a", "ref": "main"}],
            "contexts": [64],
            "rounds": 3,
        }
    )
    with pytest.raises(RunRefused, match="openai-server adapter on this host, not mlx-lm"):
        check_job(spec, config.repositories)


def test_openai_server_job_runs_cold_cells_from_the_checkouts_build(
    tmp_path: Path, mlx_lm_repo: tuple[Path, tuple[str, str]], micro_model_dir: Path
) -> None:
    repo, (main, _slow) = mlx_lm_repo
    config = parse_host_config(_config(repo, server_command=SERVER_COMMAND), base=tmp_path)
    spec = JobSpec.model_validate(
        {
            "adapter": "openai-server",
            "repository": "mlx-lm-server",
            "variants": [{"name": "a", "ref": main}, {"name": "b", "ref": main}],
            "contexts": [64],
            "rounds": 2,
            "decode_tokens": 2,
            "model": "micro",
        }
    )
    outcome = execute_run(
        spec,
        run_id="r-server",
        workdir=tmp_path / "work",
        state_dir=tmp_path / "state",
        host=HostInfo(backend="cpu"),
        repositories=config.repositories,
        models={"micro": micro_model_dir},
    )
    assert outcome.status == "succeeded", outcome.reason
    parsed, problems = parse_records(outcome.files["records.jsonl"])
    assert problems == []
    # the measured cells: not the warm-ups (round -1) nor the run's warm canary (round -2)
    records = [r for r in parsed if r.round >= 0]
    assert len(records) == 4
    assert all(r.status == "ok" and r.cached_tokens == 0 for r in records), [
        (r.status, r.reason) for r in records
    ]
    provenance = json.loads(outcome.files["provenance.json"])
    assert {t["adapter"] for t in provenance["targets"]} == {"openai-server"}
    for target in provenance["targets"]:
        # The host's argv, started with the variant's own build (its venv's interpreter).
        argv = target["ready"]["server_command"]
        assert argv[0] == target["build_python"] and argv[1:3] == ["-m", "mlx_lm.server"]
        assert target["build_module_file"].startswith(target["checkout"])
