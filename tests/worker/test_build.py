from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mlx_lm

from coldbench.evidence.contract.canonical import sha256_file
from coldbench.worker.build import (
    EngineLayout,
    build,
    engine_layout,
    fast_path_package,
    recipe_command,
)
from coldbench.worker.checkout import prepare
from coldbench.worker.config import Recipe, RepositoryConfig, default_recipes
from tests.conftest import PRE_MOVE_BRANCH, PRE_RENAME_BRANCH


def test_editable_build_imports_the_checkout_and_is_cached(
    stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    main = prepare(stub_repository, "main", state_dir=state)
    feature = prepare(stub_repository, "feature", state_dir=state)
    recipe = default_recipes()["editable"]
    first = build(stub_repository, main, recipe, state_dir=state, log_path=tmp_path / "main.log")
    assert first.ok, first.reason
    # The host has a real mlx_lm installed; the build must import the checkout's, not that one.
    assert first.engine_module_file == str(main.path / "mlx_lm" / "__init__.py")
    assert first.command[0] == first.python and "{python}" not in " ".join(first.command)
    log = (tmp_path / "main.log").read_text()
    assert "Successfully installed mlx-lm" in log
    assert first.log_sha256 == sha256_file(tmp_path / "main.log")[0]
    assert first.dirty is False and first.cached is False
    stub = subprocess.run(
        [first.python, "-c", "import mlx_lm; print(mlx_lm.STUB)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert stub.stdout.strip() == "main"
    # The venv still sees the host's packages (MLX comes from the host).
    subprocess.run([first.python, "-c", "import mlx.core"], check=True, cwd=tmp_path)

    other = build(stub_repository, feature, recipe, state_dir=state, log_path=tmp_path / "f.log")
    assert other.ok and other.venv != first.venv
    assert other.engine_module_file == str(feature.path / "mlx_lm" / "__init__.py")

    again = build(stub_repository, main, recipe, state_dir=state, log_path=tmp_path / "again.log")
    assert again.ok and again.cached and again.venv == first.venv
    assert "reused cached build" in (tmp_path / "again.log").read_text()


def test_install_path_defect_fails_the_build(
    stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    """A recipe that 'succeeds' without installing the checkout: seed 002's defect."""
    state = tmp_path / "state"
    checkout = prepare(stub_repository, "main", state_dir=state)
    noop = Recipe("noop", ("{python}", "-c", "print('built nothing')"))
    result = build(stub_repository, checkout, noop, state_dir=state, log_path=tmp_path / "b.log")
    assert not result.ok
    host_file = str(Path(mlx_lm.__file__).resolve())
    assert result.engine_module_file == host_file
    assert result.reason == (
        f"install-path check failed: mlx_lm was imported from {host_file}, "
        f"not from the checkout {checkout.path}"
    )
    log = (tmp_path / "b.log").read_text()
    assert "built nothing" in log and "install-path check failed" in log
    # A failed build is not cached.
    assert not (Path(result.venv) / "coldbench-build.json").exists()


def test_failing_recipe_fails_with_its_log(
    stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    checkout = prepare(stub_repository, "main", state_dir=state)
    failing = Recipe(
        "broken", ("{python}", "-c", "import sys; print('compiler exploded'); sys.exit(3)")
    )
    result = build(stub_repository, checkout, failing, state_dir=state, log_path=tmp_path / "x.log")
    assert not result.ok
    assert result.reason == "build failed: recipe broken exited with code 3"
    log = (tmp_path / "x.log").read_text()
    assert "compiler exploded" in log and "# exit code 3" in log
    header = json.loads(log.splitlines()[0].removeprefix("# coldbench build "))
    assert header["recipe"] == "broken"
    missing = Recipe("missing", ("/nonexistent/tool", "build"))
    result = build(stub_repository, checkout, missing, state_dir=state, log_path=tmp_path / "m.log")
    assert not result.ok and "code 127" in (result.reason or "")


def test_recipe_env_is_passed_and_native_modules_are_digested(
    stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    checkout = prepare(stub_repository, "main", state_dir=state)
    # A recipe that installs the checkout and leaves a native-looking artifact behind.
    script = (
        "import os, pathlib, subprocess, sys; "
        "pathlib.Path('mlx_lm/_ext.so').write_bytes(os.environ['FAKE_BYTES'].encode()); "
        "sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--no-deps', "
        "'--no-build-isolation', '-e', '.']))"
    )
    recipe = Recipe("native", ("{python}", "-c", script), env={"FAKE_BYTES": "kernel-v1"})
    result = build(stub_repository, checkout, recipe, state_dir=state, log_path=tmp_path / "n.log")
    assert result.ok, result.reason
    digest = sha256_file(checkout.path / "mlx_lm" / "_ext.so")[0]
    assert result.native_modules == {"mlx_lm/_ext.so": digest}


def test_the_layout_of_a_tree_is_told_by_its_fast_path_package(tmp_path: Path) -> None:
    cases = (
        (["engine", "kernels", "coldbench/engine", "coldbench/kernels"], "coldbench.kernels"),
        (["fastpaths"], "fastpaths"),
        (["kernels"], "kernels"),
        (["fastpaths", "kernels"], "fastpaths"),
        ([], "coldbench.kernels"),  # none: the build's import check says it is missing
    )
    for number, (packages, expected) in enumerate(cases):
        tree = tmp_path / f"tree-{number}"
        tree.mkdir()
        for package in packages:
            (tree / package).mkdir(parents=True)
            (tree / package / "__init__.py").write_text("")
        assert fast_path_package(tree) == expected, packages
    # A folder without __init__.py (a leftover __pycache__) is not the package.
    (tmp_path / "stale" / "fastpaths" / "__pycache__").mkdir(parents=True)
    (tmp_path / "stale" / "kernels").mkdir()
    (tmp_path / "stale" / "kernels" / "__init__.py").write_text("")
    assert fast_path_package(tmp_path / "stale") == "kernels"
    offline = default_recipes("embedded")["offline"]
    python = tmp_path / "venv" / "bin" / "python"
    # tree-2 holds kernels/ only: a tree from before the fastpaths rename
    assert recipe_command(offline, python=python, checkout=tmp_path / "tree-2") == [
        str(python),
        "-c",
        "import engine, kernels",
    ]
    assert engine_layout(tmp_path / "tree-1").runner == "engine.runner"
    assert engine_layout(tmp_path / "tree-0").runner == "coldbench.engine.runner"


def test_embedded_builds_check_the_packages_of_each_layout(
    coldbench_repo: tuple[Path, tuple[str, str]], tmp_path: Path
) -> None:
    """A ref from before the move (its packages top-level, the fast-path one named `fastpaths`
    or before its rename `kernels`) builds and is checked under its own names; a current ref
    under `coldbench.engine` and `coldbench.kernels`. A worker.toml from before the move names
    the module `engine`: it means the tree's own."""
    repo, (main, _) = coldbench_repo
    state = tmp_path / "state"
    cases = (
        (main, "coldbench.engine", "coldbench.kernels"),
        (PRE_MOVE_BRANCH, "engine", "fastpaths"),
        (PRE_RENAME_BRANCH, "engine", "kernels"),
    )
    for module in ("coldbench.engine", "engine"):
        repository = RepositoryConfig(
            name="engine",
            url=str(repo),
            module=module,
            adapter="embedded",
            recipes=default_recipes("embedded"),
        )
        recipe = repository.recipes["offline"]
        for ref, engine, package in cases:
            checkout = prepare(repository, ref, state_dir=state)
            assert engine_layout(checkout.path) == EngineLayout(engine, package)
            log_path = tmp_path / f"{module}-{package}.log"
            result = build(repository, checkout, recipe, state_dir=state, log_path=log_path)
            assert result.ok, (ref, result.reason, log_path.read_text()[-2000:])
            assert result.command[1:] == ["-c", f"import {engine}, {package}"]
            assert result.engine_module_file == str(checkout.path / "engine" / "__init__.py")
            assert f"# {engine} imported from " in log_path.read_text()
    # The check imports the tree's own package: in the pre-rename tree a `kernels` that cannot
    # be imported fails the build under that name (this recipe imports nothing itself).
    (checkout.path / "kernels" / "__init__.py").write_text("raise ImportError('planted')\n")
    noop = Recipe("noop", ("{python}", "-c", "pass"))
    result = build(repository, checkout, noop, state_dir=state, log_path=tmp_path / "planted.log")
    assert not result.ok
    assert result.reason == "install-path check failed: import kernels: ImportError: planted"
