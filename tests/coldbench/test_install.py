"""What each install needs: a benchmark host with `coldbench[worker]` measures without one
package of the server's, and `coldbench --help` loads no subcommand's module.

The host's install is simulated in this environment (which has every extra): an import hook in
every Python process of the test (a `sitecustomize` on PYTHONPATH, inherited by the variant
processes) refuses each third-party module outside the distributions that `coldbench[worker]`
(and the platform's MLX extra) brings, read from the installed metadata, as a missing package
would (a library probing for an optional package sees it absent); and the project's own
packages other than the worker's.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import IMPORT_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]
# The project's one top-level package; of its subpackages api, web and migrations are the
# server's (a host runs evidence, engine, kernels and worker).
WORKER_PACKAGES = {"coldbench"}
SERVER_PACKAGES = ("coldbench.api", "coldbench.web", "coldbench.migrations")
GUARD = """
import importlib.machinery
import os
import sys

_ALLOWED = set(os.environ["COLDBENCH_TEST_ALLOWED_MODULES"].split(","))
_SERVER = tuple(os.environ["COLDBENCH_TEST_SERVER_PACKAGES"].split(","))
_find_spec = importlib.machinery.PathFinder.find_spec.__func__


def _only_the_extra(cls, name, path=None, target=None):
    # A top-level module outside the extra is not found, as if its package were not installed
    # (so a library probing for an optional package sees it absent, as on a worker host).
    if (
        path is None
        and name not in _ALLOWED
        and name not in sys.stdlib_module_names
        and not name.startswith("_")  # the interpreter's own (_sysconfigdata_*) and finders'
    ):
        return None
    return _find_spec(cls, name, path, target)


class _NotTheServer:
    # The server's packages of this project come from the checkout (an editable install's own
    # finder): refused outright.
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in _SERVER or name.startswith(tuple(s + "." for s in _SERVER)):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


importlib.machinery.PathFinder.find_spec = classmethod(_only_the_extra)
sys.meta_path.insert(0, _NotTheServer())
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions(name: str, extras: set[str]) -> set[str]:
    """`name` with `extras` and everything it requires on this platform, as installed."""
    found: set[str] = set()
    todo = [(name, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        current, wanted = todo.pop()
        key = (_canonical(current), wanted)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.requires(current) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform (its marker was true, yet nothing installed it)
        found.add(_canonical(current))
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in wanted or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def _worker_modules() -> set[str]:
    mlx_extra = {"cpu"} if sys.platform != "darwin" else set()
    wanted = _distributions("coldbench", {"worker", *mlx_extra})
    modules = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_canonical(dist) in wanted for dist in dists)
    }
    # The project's own packages other than the worker's are refused like any other module.
    return modules | WORKER_PACKAGES


def _guarded_env(tmp_path: Path) -> dict[str, str]:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(guard), str(IMPORT_PATH)]),
        "COLDBENCH_TEST_ALLOWED_MODULES": ",".join(sorted(_worker_modules())),
        "COLDBENCH_TEST_SERVER_PACKAGES": ",".join(SERVER_PACKAGES),
    }


def test_the_guard_refuses_what_the_worker_extra_lacks(tmp_path: Path) -> None:
    env = _guarded_env(tmp_path)
    allowed = set(env["COLDBENCH_TEST_ALLOWED_MODULES"].split(","))
    assert {"mlx", "mlx_lm", "numpy", "httpx", "pydantic"} <= allowed
    assert not {"sqlalchemy", "fastapi", "celery", "api", "boto3"} & allowed
    # an old top-level name, and the server's subpackages
    for module, missing in (
        ("sqlalchemy", "sqlalchemy"),
        ("api", "api"),
        ("fastapi", "fastapi"),
        ("coldbench.api.app", "coldbench.api"),
        ("coldbench.web", "coldbench.web"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 1, done.stderr
        assert f"ModuleNotFoundError: No module named '{missing}'" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_worker_install_measures_without_the_server_packages(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Every worker module imports, and `coldbench run` measures a job end to end (its variant
    processes under the same guard)."""
    env = _guarded_env(tmp_path)
    imports = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pkgutil, importlib\n"
            "from coldbench import worker, engine, kernels\n"
            "for package in (worker, engine, kernels):\n"
            "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
            "        importlib.import_module(info.name)\n",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imports.returncode == 0, imports.stderr[-3000:]
    for command in (["worker", "--help"], ["calibrate", "--help"], ["model", "--help"]):
        helped = subprocess.run(
            [sys.executable, "-m", "coldbench", *command], env=env, capture_output=True, text=True
        )
        assert helped.returncode == 0, (command, helped.stderr[-2000:])
    out = tmp_path / "out"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "coldbench", "run", "--variant", "a"),
            *("--variant", "b:prefill_step_size=32", "--contexts", "64", "--rounds", "1"),
            *("--decode-tokens", "1", "--out", str(out), "--state-dir", str(tmp_path / "s")),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in records if r["status"] == "ok"} == {"a", "b"}


def test_help_loads_no_subcommand() -> None:
    probe = (
        "import sys, io, contextlib\n"
        "from coldbench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['--help'])\n"
        "heavy = [m for m in ('numpy', 'pydantic', 'typer', 'worker', 'api') if m in sys.modules]\n"
        "print(heavy, 'run' in out.getvalue() and 'history' not in out.getvalue())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split("]")[0] + "]" == "[]", done.stdout
