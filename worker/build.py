"""Isolated builds per (repository, commit, recipe), cached by digest, checked after building.

Each build gets its own venv with `--system-site-packages` plus the host interpreter's own
site-packages (MLX comes from the host; a host that is itself a venv needs the second). The
recipe's argv runs in the checkout with its env (`{python}` replaced by the venv's python,
`{engine_package}` and `{fast_path_package}` by the checkout's engine and fast-path packages; no
shell, no command from the job), its output goes to a log. Then the engine module (and for an
embedded repository its fast-path package) is imported exactly as a variant process will import
it, and the file it came from must lie inside the checkout: seed 002's install-path defect (code
built or loaded from somewhere else) fails the build instead of producing numbers for the wrong
code.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coldbench.engine.adapter_traits import runs_checkout_engine
from coldbench.evidence.contract.canonical import sha256_file, sha256_json
from coldbench.worker.checkout import Checkout, tree_state
from coldbench.worker.config import Recipe, RepositoryConfig
from coldbench.worker.variants import child_env

log = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 1800.0
MARKER = "coldbench-build.json"
NATIVE_SUFFIXES = (".so", ".dylib", ".pyd")
# Packages installed into the build venv must win over the host's copy of the same package
# (a venv's own site-packages always should). Editable installs register meta-path finders that
# Python consults after the path-based finder, so without this line the host's installed
# mlx_lm would shadow the checkout's editable one: the install-path defect, reproduced.
_PRECEDENCE_PTH = (
    "import sys; sys.meta_path.sort(key=lambda f: 0 if str(getattr(f, '__module__', ''))"
    ".startswith('__editable__') else 1)\n"
)


@dataclass(frozen=True)
class EngineLayout:
    """The import names of the embedded engine and its fast-path package in a coldbench tree."""

    engine: str
    fast_paths: str

    @property
    def runner(self) -> str:
        """The variant process's module (`python -m`)."""
        return f"{self.engine}.runner"


# The layouts of a coldbench tree, newest first; an embedded repository's refs may be commits of
# any of them. Since the move to one namespace the folders engine/ and kernels/ are imported as
# `coldbench.engine` and `coldbench.kernels` (coldbench/ links them); before it they were the
# top-level `engine` with `fastpaths`, and before that package's rename with `kernels` (Hugging
# Face's `kernels` distribution, which transformers 5.25 requires, has that top-level name).
LAYOUTS = (
    EngineLayout("coldbench.engine", "coldbench.kernels"),
    EngineLayout("engine", "fastpaths"),
    EngineLayout("engine", "kernels"),
)
# The engine module a repository declared `adapter = "embedded"` names by default, now and in a
# worker.toml written before the move: either means the tree's own (`engine_layout`).
EMBEDDED_ENGINE_MODULES = ("coldbench.engine", "engine")
# The names a variant process reports its fast-path package's file under (`software.files`):
# `kernels` since the move and before the rename, `fastpaths` between them.
FAST_PATH_PACKAGES = ("kernels", "fastpaths")
# The file as the variant sees it: a symlinked folder (coldbench/engine) resolved.
_IMPORT_PROBE = (
    "import importlib, json, os, sys; m = importlib.import_module(sys.argv[1]); "
    "f = getattr(m, '__file__', None); "
    "print(json.dumps({'file': f and os.path.realpath(f), 'executable': sys.executable}))"
)


@dataclass
class Build:
    repository: str
    commit: str
    recipe: str
    command: list[str]
    venv: str
    python: str
    checkout: str
    log_path: str
    log_sha256: str | None
    ok: bool
    reason: str | None
    engine_module_file: str | None = None
    native_modules: dict[str, str] = field(default_factory=dict)
    dirty: bool | None = None
    diff_sha256: str | None = None
    build_s: float | None = None
    cached: bool = False


def build_key(repository: RepositoryConfig, checkout: Checkout, recipe: Recipe) -> str:
    return sha256_json(
        {
            "repository": repository.name,
            "url": repository.url,
            "module": repository.module,
            "commit": checkout.commit,
            "checkout": str(checkout.path),
            "recipe": {"name": recipe.name, "command": list(recipe.command), "env": recipe.env},
            "host_python": sys.executable,
            "python_version": sys.version,
        }
    )


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _host_site_paths() -> list[str]:
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if p and Path(p).is_dir()))


def create_venv(venv: Path) -> Path:
    """A venv that sees the host's packages (MLX), with its own installs taking precedence."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    python = _venv_python(venv)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    site = Path(purelib)
    # `zz`: processed after the venv's own .pth files, so host paths come after the venv's.
    (site / "zz-coldbench-host-site.pth").write_text("\n".join(_host_site_paths()) + "\n")
    (site / "zz-coldbench-precedence.pth").write_text(_PRECEDENCE_PTH)
    return python


def native_modules(root: Path) -> dict[str, str]:
    """sha256 of every native extension under the checkout (what really got built)."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for filename in filenames:
            if filename.endswith(NATIVE_SUFFIXES) or ".so." in filename:
                path = Path(dirpath, filename)
                found[str(path.relative_to(root))] = sha256_file(path)[0]
    return dict(sorted(found.items()))


def engine_layout(tree: Path) -> EngineLayout:
    """The layout of the coldbench tree at `tree`, told by its fast-path package (the newest
    when it has none: the build's check then says that package cannot be imported)."""
    for layout in LAYOUTS:
        if (tree / Path(*layout.fast_paths.split(".")) / "__init__.py").is_file():
            return layout
    return LAYOUTS[0]


def fast_path_package(tree: Path) -> str:
    """The fast-path package of the coldbench tree at `tree` (`engine_layout`)."""
    return engine_layout(tree).fast_paths


def recipe_command(recipe: Recipe, *, python: Path, checkout: Path) -> list[str]:
    """The recipe's argv as it runs: `{python}` is the build venv's interpreter,
    `{engine_package}` and `{fast_path_package}` the checkout's packages (`engine_layout`)."""
    layout = engine_layout(checkout)
    return [
        arg.replace("{python}", str(python))
        .replace("{engine_package}", layout.engine)
        .replace("{fast_path_package}", layout.fast_paths)
        for arg in recipe.command
    ]


def imported_file(python: Path, module: str, *, cwd: Path, first: str | None = None) -> str | None:
    """The file `module` is imported from by `python`, in a variant process's environment
    (`first`: the worktree an embedded repository's variant puts first on its path)."""
    env = child_env(first=first)
    done = subprocess.run(
        [str(python), "-c", _IMPORT_PROBE, module],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["import failed"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])["file"]


def is_inside(path: str | None, root: Path) -> bool:
    if not path:
        return False
    return Path(path).resolve().is_relative_to(root.resolve())


def install_path_problem(module_file: str | None, module: str, checkout: Path) -> str | None:
    if is_inside(module_file, checkout):
        return None
    return (
        f"install-path check failed: {module} was imported from {module_file}, "
        f"not from the checkout {checkout}"
    )


def _run_recipe(recipe: Recipe, *, python: Path, venv: Path, cwd: Path, log_path: Path) -> int:
    command = recipe_command(recipe, python=python, checkout=cwd)
    env = {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        **recipe.env,
    }
    env.pop("PYTHONHOME", None)
    with open(log_path, "ab") as log_file:
        header = {
            "recipe": recipe.name,
            "command": command,
            "cwd": str(cwd),
            "env": recipe.env,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        log_file.write(f"# coldbench build {json.dumps(header, sort_keys=True)}\n".encode())
        log_file.flush()
        try:
            done = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            code = done.returncode
        except FileNotFoundError as error:
            log_file.write(f"# command not found: {error}\n".encode())
            code = 127
        except subprocess.TimeoutExpired:
            log_file.write(f"# build timed out after {BUILD_TIMEOUT_S:.0f} s\n".encode())
            code = 124
        log_file.write(f"# exit code {code}\n".encode())
    return code


def build(
    repository: RepositoryConfig,
    checkout: Checkout,
    recipe: Recipe,
    *,
    state_dir: Path,
    log_path: Path,
) -> Build:
    """Build (or reuse) the venv of (repository, commit, recipe) and check its import path.

    Never raises for a failing build: the result says `ok=False` with the reason and the log.
    """
    key = build_key(repository, checkout, recipe)
    venv = state_dir / "venvs" / key[:32]
    marker = venv / MARKER
    python = _venv_python(venv)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = recipe_command(recipe, python=python, checkout=checkout.path)
    result = Build(
        repository=repository.name,
        commit=checkout.commit,
        recipe=recipe.name,
        command=command,
        venv=str(venv),
        python=str(python),
        checkout=str(checkout.path),
        log_path=str(log_path),
        log_sha256=None,
        ok=False,
        reason=None,
    )
    cached_log = venv / "build.log"
    if marker.exists():
        try:
            cached = Build(**json.loads(marker.read_text()))
        except (TypeError, ValueError):
            cached = None
        if cached is not None and cached.ok:
            # Reuse, but check again: the host's environment may have changed underneath.
            shutil.copyfile(cached_log, log_path)
            with open(log_path, "ab") as log_file:
                log_file.write(f"# reused cached build {venv.name}\n".encode())
            result = cached
            result.cached = True
            result.log_path = str(log_path)
            return _check(result, repository, checkout, log_path)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    started = time.monotonic()
    try:
        python = create_venv(venv)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        with open(log_path, "ab") as log_file:
            log_file.write(f"# creating the venv failed: {error}\n".encode())
        result.reason = f"build failed: could not create the venv ({error})"
        result.log_sha256 = sha256_file(log_path)[0]
        return result
    code = _run_recipe(recipe, python=python, venv=venv, cwd=checkout.path, log_path=log_path)
    result.build_s = round(time.monotonic() - started, 3)
    if code != 0:
        result.reason = f"build failed: recipe {recipe.name} exited with code {code}"
        result.log_sha256 = sha256_file(log_path)[0]
        return result
    result = _check(result, repository, checkout, log_path)
    if result.ok:
        shutil.copyfile(log_path, cached_log)
        marker.write_text(json.dumps(asdict(result), indent=2, sort_keys=True))
    return result


def _check(
    result: Build, repository: RepositoryConfig, checkout: Checkout, log_path: Path
) -> Build:
    python = Path(result.python)
    # An embedded repository's variants run its worktree's engine and fast-path package: both
    # checked.
    embedded = runs_checkout_engine(repository.adapter)
    first = str(checkout.path) if embedded else None
    problem: str | None = None
    module_file: str | None = None
    engine_module = repository.module
    if embedded:
        layout = engine_layout(checkout.path)
        if engine_module in EMBEDDED_ENGINE_MODULES:
            engine_module = layout.engine
        modules = [engine_module, layout.fast_paths]
    else:
        modules = [engine_module]
    for module in modules:
        found: str | None
        why: str | None
        try:
            found = imported_file(python, module, cwd=python.parent, first=first)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as error:
            found, why = None, f"install-path check failed: import {module}: {error}"
        else:
            why = install_path_problem(found, module, checkout.path)
        if module == engine_module:
            module_file = found
        problem = problem or why
    result.engine_module_file = module_file
    result.native_modules = native_modules(checkout.path)
    result.dirty, result.diff_sha256 = tree_state(checkout.path)
    with open(log_path, "ab") as log_file:
        log_file.write(f"# {engine_module} imported from {module_file}\n".encode())
        if problem:
            log_file.write(f"# {problem}\n".encode())
    result.ok = problem is None
    result.reason = problem
    result.log_sha256 = sha256_file(log_path)[0]
    return result
