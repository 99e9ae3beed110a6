"""Fixtures shared by every test folder.

Services: PostgreSQL and Redis are real (DESIGN.md); their URLs come from the environment with
the local defaults .ci/run makes sure of. Child processes started by tests import this checkout:
PYTHONPATH is set for the whole session to a folder of links to its `coldbench` and `tests`
(and `benchmarks`), not to the repository root, whose kernels/ (`coldbench.kernels`) would
shadow Hugging Face's `kernels` in every child (setuptools builds fail through its entry point).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.stack import Stack

REPO_ROOT = Path(__file__).resolve().parent.parent
IMPORT_PATH = Path(tempfile.mkdtemp(prefix="coldbench-import-path-"))
for _package in ("coldbench", "tests", "benchmarks"):
    (IMPORT_PATH / _package).symlink_to(REPO_ROOT / _package)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(IMPORT_PATH), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)
POSTGRES_URL = os.environ.get(
    "COLDBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("COLDBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


# Tests on the API's databases (the `db_url` fixture of tests/api/conftest.py) run on
# PostgreSQL, what a deployment runs; those marked `both_dialects` run on SQLite too.
DIALECTS = ("sqlite", "postgresql")
DEFAULT_DIALECT = "postgresql"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_url" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_dialects") is not None
        dialects = DIALECTS if both else (DEFAULT_DIALECT,)
        metafunc.parametrize("db_url", dialects, indirect=True, scope="session")


# Fixtures that reach the test PostgreSQL server (the shared service stack included).
_POSTGRES_FIXTURES = {"postgres_url", "postgres_migrated", "live_db", "shared_stack", "service"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers from what a test uses: `postgres` where it reaches the PostgreSQL server (its
    database tests' dialect, or a fixture on it), `slow` where it runs on the shared stack."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("db_url") == "postgresql"
        if on_postgres or names & _POSTGRES_FIXTURES:
            item.add_marker(pytest.mark.postgres)
        if names & {"shared_stack", "service"}:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _session_host_lock(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Agents started without `--host-lock` (the demo's) take a lock file of this test session,
    not the host's /tmp/coldbench-host.lock: the workers of `pytest -n` (the Makefile's test
    target) and other test sessions on this machine would otherwise queue on each other's
    agents. Inherited by child processes; the lock itself is tested in test_config.py."""
    os.environ["COLDBENCH_HOST_LOCK"] = str(tmp_path_factory.mktemp("host-lock") / "host.lock")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One service for the session's end-to-end tests (tests/stack.py): PostgreSQL, `coldbench
    server` and an API key, started the first time a test asks for it. Leases of 10 s (an
    agent heartbeats every second) and a 0.2 s long-poll look-up. Take turns with
    `shared_stack.scope()` or through `service`."""
    from tests.stack import running_stack

    settings = {"COLDBENCH_LEASE_TTL_S": "10", "COLDBENCH_LEASE_POLL_S": "0.2"}
    with running_stack(tmp_path_factory.mktemp("shared-stack"), settings=settings) as stack:
        yield stack


@pytest.fixture
def service(shared_stack: Stack) -> Iterator[Stack]:
    """The shared service for one test: the agents and other processes the test starts on it
    are stopped, and the jobs it leaves unfinished cancelled, when it ends."""
    with shared_stack.scope():
        yield shared_stack


@pytest.fixture(scope="session")
def coldbench_cmd() -> list[str]:
    """The CLI as a child process of this interpreter and checkout."""
    return [sys.executable, "-m", "coldbench"]


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of synthetic checkpoints, where
    `coldbench.engine.checkpoints.resolve_model` looks for `preset:NAME`: COLDBENCH_MODEL_DIR
    (inherited by child processes) points at it, so a preset resolves to the checkpoint a fixture
    wrote instead of one under the home folder."""
    root = tmp_path_factory.mktemp("models")
    os.environ["COLDBENCH_MODEL_DIR"] = str(root)
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(model_root: Path) -> Path:
    """The `tiny` preset (llama, 4 layers, width 256, float32, seed 0), written once per session,
    resolved by `preset:tiny`. For tests whose subject is the model: checkpoint digests, goldens,
    memory estimates, this CPU's arithmetic, the `timing` tests."""
    return _session_preset("tiny", model_root)


@pytest.fixture(scope="session")
def micro_model_dir(model_root: Path) -> Path:
    """The `micro` preset (llama, 2 layers, width 64, float32, seed 0), resolved by
    `preset:micro`. For end-to-end tests whose subject is the service path, the scheduling, the
    evidence or a planted wait: on this CPU its 256-token prefill takes 25-60 ms where `tiny`'s
    takes 0.6-1.6 s, so cells and warm-ups cost 20-50x less and a planted wait stands further
    above what load does to the compute."""
    return _session_preset("micro", model_root)


def _session_preset(preset: str, model_root: Path) -> Path:
    """The preset's checkpoint in the session's folder, resolved as `preset:NAME` is everywhere:
    written on first use, reused when a test's child process (an ablation, a demo) wrote it
    first."""
    from coldbench.engine.checkpoints import resolve_model

    path = resolve_model(f"preset:{preset}", {})
    assert path.parent == model_root, path
    return path


# The `slow-prefill` branch of `mlx_lm_repo`: the stock prefill loop with its chunks capped at
# 32 tokens and a device sync after each one. Chunk widths are what the adapter's counters see,
# so the change is visible in records, not only in timings.
SLOW_PREFILL_OLD = "            n_to_process = min(prefill_step_size, remaining)\n"
SLOW_PREFILL_NEW = (
    "            # coldbench test branch: deliberately slow (32-token chunks, extra sync).\n"
    "            n_to_process = min(prefill_step_size, remaining, 32)\n"
)
SLOW_PREFILL_SYNC_OLD = "            mx.eval([c.state for c in prompt_cache])\n"
SLOW_PREFILL_SYNC_NEW = SLOW_PREFILL_SYNC_OLD + "            mx.synchronize()\n"
# The `noop-step` branch of `mlx_lm_repo`: generate_step accepts prefill_step_size and ignores it
# (a planted no-op: stock 2048-token chunks whatever the caller asks).
NOOP_STEP_BRANCH = "noop-step"
NOOP_STEP_OLD = "    prompt_progress_callback = prompt_progress_callback or (lambda *_: None)\n"
NOOP_STEP_NEW = (
    NOOP_STEP_OLD + "    prefill_step_size = 2048  # coldbench test branch: argument ignored\n"
)

# The `old-layout` branch of `mlx_lm_repo`: generate_step's prefill as mlx-lm shipped it before
# the last token was split off (`while y.size > prefill_step_size`): full chunks of the step, then
# the remainder (1 to step tokens) together with the step that yields the first token, so 128
# tokens at step 64 are 64x2 and 256 are 64x4. An honest step, in another layout.
OLD_LAYOUT_BRANCH = "old-layout"
OLD_LAYOUT_LOOP_OLD = (
    "        while total_prompt_tokens - prompt_processed_tokens > 1:\n"
    "            remaining = (total_prompt_tokens - prompt_processed_tokens) - 1\n"
    "            n_to_process = min(prefill_step_size, remaining)\n"
)
OLD_LAYOUT_LOOP_NEW = (
    "        while total_prompt_tokens - prompt_processed_tokens > prefill_step_size:\n"
    "            n_to_process = prefill_step_size  # coldbench test branch: the older layout\n"
)

# The `loader-0.28` branch of `mlx_lm_repo`: `mlx_lm.utils.load` as every release before 0.28.3
# shipped it, without `return_config` (it returns the model and the tokenizer only).
LOADER_028_BRANCH = "loader-0.28"
LOADER_RETURN_CONFIG = "    lazy: bool = False,\n    return_config: bool = False,\n"
LOADER_RETURNS = (
    "    if return_config:\n        return model, tokenizer, config\n"
    "    else:\n        return model, tokenizer\n"
)


def _load_without_return_config(text: str) -> str:
    """mlx_lm/utils.py with `load` (only) as before 0.28.3."""
    head, body = text.split("\ndef load(", 1)
    load, rest = body.split("\ndef ", 1)
    assert load.count(LOADER_RETURN_CONFIG) == 1, "mlx_lm.utils.load's return_config not found"
    assert load.count(LOADER_RETURNS) == 1, "mlx_lm.utils.load's returns not found"
    load = load.replace(LOADER_RETURN_CONFIG, "    lazy: bool = False,\n")
    load = load.replace(LOADER_RETURNS, "    return model, tokenizer\n")
    return f"{head}\ndef load({load}\ndef {rest}"


@pytest.fixture(scope="session")
def mlx_lm_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, str]]:
    """A local git repository of the installed mlx_lm package, as a fork would look.

    Branch `main` holds the installed package files verbatim (plus a minimal pyproject.toml so
    `pip install -e .` works); branch `slow-prefill` changes the prefill loop of
    `mlx_lm/generate.py` (see SLOW_PREFILL_*); branch `noop-step` (NOOP_STEP_BRANCH) ignores
    `prefill_step_size`; branch `old-layout` (OLD_LAYOUT_BRANCH) cuts the prompt the older way;
    branch `loader-0.28` (LOADER_028_BRANCH) has the loader of releases before 0.28.3.
    Returns (repository path, (main, slow-prefill)).
    """
    import shutil
    import subprocess

    import mlx_lm

    source = Path(mlx_lm.__file__).resolve().parent
    repo = tmp_path_factory.mktemp("mlx-lm-repo")
    shutil.copytree(source, repo / "mlx_lm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools>=68"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        'name = "mlx-lm"\n'
        f'version = "{mlx_lm.__version__}"\n'
        'requires-python = ">=3.11"\n\n'
        "[tool.setuptools.packages.find]\n"
        'include = ["mlx_lm*"]\n\n'
        "[tool.setuptools.package-data]\n"
        '"*" = ["*"]\n'
    )

    def git(*args: str) -> None:
        subprocess.run(
            [
                "git",
                "-c",
                "user.name=coldbench-tests",
                "-c",
                "user.email=tests@coldbench.invalid",
                *args,
            ],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        )

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", f"mlx_lm {mlx_lm.__version__} as installed")
    git("checkout", "-q", "-b", "slow-prefill")
    generate_py = repo / "mlx_lm" / "generate.py"
    text = generate_py.read_text()
    # Exactly one hit each, or the installed mlx_lm changed and this fixture must follow it.
    assert text.count(SLOW_PREFILL_OLD) == 1, "mlx_lm.generate prefill loop not found"
    assert text.count(SLOW_PREFILL_SYNC_OLD) == 1, "mlx_lm.generate prefill eval not found"
    text = text.replace(SLOW_PREFILL_OLD, SLOW_PREFILL_NEW)
    text = text.replace(SLOW_PREFILL_SYNC_OLD, SLOW_PREFILL_SYNC_NEW)
    generate_py.write_text(text)
    git("commit", "-q", "-am", "Deliberately slow prefill: 32-token chunks and a sync per chunk")
    git("checkout", "-q", "-b", NOOP_STEP_BRANCH, "main")
    text = generate_py.read_text()
    assert text.count(NOOP_STEP_OLD) == 1, "mlx_lm.generate_step's callback default not found"
    generate_py.write_text(text.replace(NOOP_STEP_OLD, NOOP_STEP_NEW))
    git("commit", "-q", "-am", "Planted no-op: generate_step ignores prefill_step_size")
    git("checkout", "-q", "-b", OLD_LAYOUT_BRANCH, "main")
    text = generate_py.read_text()
    assert text.count(OLD_LAYOUT_LOOP_OLD) == 1, "mlx_lm.generate_step's prefill loop not found"
    generate_py.write_text(text.replace(OLD_LAYOUT_LOOP_OLD, OLD_LAYOUT_LOOP_NEW))
    git("commit", "-q", "-am", "The older prefill layout: the remainder goes with the first token")
    git("checkout", "-q", "-b", LOADER_028_BRANCH, "main")
    utils_py = repo / "mlx_lm" / "utils.py"
    utils_py.write_text(_load_without_return_config(utils_py.read_text()))
    git("commit", "-q", "-am", "mlx_lm.utils.load without return_config, as before 0.28.3")
    git("checkout", "-q", "main")
    return repo, ("main", "slow-prefill")


# The `step-64` commit of `coldbench_repo`: the embedded engine's default prefill step changed.
ENGINE_STEP_OLD = "    prefill_step_size: int = 2048\n"
ENGINE_STEP_NEW = "    prefill_step_size: int = 64  # coldbench test branch\n"
SWIGLU_ON_BRANCH = "fused-swiglu-on"
SWIGLU_OLD = "    fused_swiglu: bool = False\n"
SWIGLU_NEW = "    fused_swiglu: bool = True  # coldbench test branch\n"
# Commits as this repository was before the move to one namespace: the same engine as the
# top-level packages `engine` and `fastpaths` (PRE_MOVE_BRANCH), and before that package's
# rename as `engine` and `kernels` (PRE_RENAME_BRANCH); `coldbench.engine.fastpaths`, a module
# of the engine, kept its name throughout.
PRE_MOVE_BRANCH = "fastpaths-name"
PRE_RENAME_BRANCH = "kernels-name"
# The namespace's imports as a tree from before the move wrote them.
_NAMESPACE_IMPORT = re.compile(r"(?<![\w.])coldbench\.(engine|kernels|evidence)\b")
_NAMESPACE_FROM_IMPORT = re.compile(r"(?m)^(\s*)from coldbench import ")
# `kernels` as a module reference (not the word in prose), for the `fastpaths` of PRE_MOVE_BRANCH.
_FAST_PATH_MODULE = re.compile(r"(?<![\w./`'\"])kernels\b(?=[.,)\n]|\s+import\b)")
_COPIED = ("engine", "kernels", "evidence")


@pytest.fixture(scope="session")
def coldbench_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, str]]:
    """A small git copy of this repository's engine, as a branch of it would look.

    `engine/`, `kernels/` and `evidence/` of this checkout, `coldbench/` linking them as this
    repository does, and a minimal pyproject.toml (`pip install -e .` works) on branch `main`;
    branch `step-64` changes one engine flag's default (`Flags.prefill_step_size` 2048 -> 64, see
    ENGINE_STEP_*); branch `fused-swiglu-on` turns a fast path on by default; branch
    `fastpaths-name` (PRE_MOVE_BRANCH) is the tree before the move, top-level `engine` and
    `fastpaths`, and branch `kernels-name` (PRE_RENAME_BRANCH) the tree before that package's
    rename, top-level `engine` and `kernels`. Returns (repository path, (main, step-64)).
    """
    import shutil
    import subprocess

    repo = tmp_path_factory.mktemp("coldbench-repo")
    for package in _COPIED:
        shutil.copytree(
            REPO_ROOT / package,
            repo / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    (repo / "coldbench").mkdir()
    (repo / "coldbench" / "__init__.py").write_text('"""A copy of coldbench\'s engine."""\n')
    for package in _COPIED:
        (repo / "coldbench" / package).symlink_to(f"../{package}")

    def pyproject(*include: str) -> None:
        (repo / "pyproject.toml").write_text(
            "[build-system]\n"
            'requires = ["setuptools>=68"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            "[project]\n"
            'name = "coldbench-engine-copy"\n'
            'version = "0.0.1"\n'
            'requires-python = ">=3.11"\n\n'
            "[tool.setuptools.packages.find]\n"
            f"include = {list(include)!r}\n\n".replace("'", '"')
            + "[tool.setuptools.package-data]\n"
            '"*" = ["*.j2", "*.json"]\n'
        )

    pyproject("coldbench*")

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=coldbench-tests", "-c", "user.email=tests@coldbench.invalid"]
            + list(args),
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        )

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "coldbench engine as in this checkout")
    git("checkout", "-q", "-b", "step-64")
    flags_py = repo / "engine" / "flags.py"
    text = flags_py.read_text()
    assert text.count(ENGINE_STEP_OLD) == 1, "engine.flags default step not found"
    flags_py.write_text(text.replace(ENGINE_STEP_OLD, ENGINE_STEP_NEW))
    git("commit", "-q", "-am", "Embedded engine: 64-token prefill chunks by default")
    # A fast-path branch as a keep/drop run judges it: the kernel on by default, not by request.
    git("checkout", "-q", "-b", SWIGLU_ON_BRANCH, "main")
    text = flags_py.read_text()
    assert text.count(SWIGLU_OLD) == 1, "engine.flags default fused_swiglu not found"
    flags_py.write_text(text.replace(SWIGLU_OLD, SWIGLU_NEW))
    git("commit", "-q", "-am", "Embedded engine: fused_swiglu on by default")
    # Before the move: no coldbench/, the packages imported by their top-level names.
    git("checkout", "-q", "-b", PRE_RENAME_BRANCH, "main")
    git("rm", "-q", "-r", "coldbench")
    renamed = 0
    for package in _COPIED:
        for source in (repo / package).rglob("*.py"):
            text = source.read_text()
            old_text = _NAMESPACE_FROM_IMPORT.sub(r"\1import ", _NAMESPACE_IMPORT.sub(r"\1", text))
            renamed += old_text != text
            source.write_text(old_text)
    assert renamed, "no import of the coldbench namespace found to undo"
    pyproject("engine*", "kernels*", "evidence*")
    git("add", "-A")
    git("commit", "-q", "-m", "The engine as it was before the move: top-level engine/, kernels/")
    git("checkout", "-q", "-b", PRE_MOVE_BRANCH)
    git("mv", "kernels", "fastpaths")
    renamed = 0
    for source in [*(repo / "engine").rglob("*.py"), *(repo / "fastpaths").rglob("*.py")]:
        text = source.read_text()
        old_text = _FAST_PATH_MODULE.sub("fastpaths", text)
        # the name its process reported the package's file under (`software.files`)
        old_text = old_text.replace('"kernels": fastpaths', '"fastpaths": fastpaths')
        renamed += old_text != text
        source.write_text(old_text)
    assert renamed, "no import of kernels found to rename"
    pyproject("engine*", "fastpaths*", "evidence*")
    git("commit", "-q", "-am", "The fast-path package as it was named before the move: fastpaths/")
    git("checkout", "-q", "main")
    return repo, ("main", "step-64")
