"""Fixtures of the worker tests: small real git repositories made at test time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from coldbench.worker.config import RepositoryConfig, default_recipes

# A build recipe that puts the checkout on the build venv's path with one .pth file, sorted
# before the host-site .pth the build adds (worker/build.py), so the checkout's package wins;
# the build's import check still imports it from the checkout. For tests whose subject is not
# the install: a `pip install -e .` (the default recipe, tested in test_build.py and the
# `coldbench run --repo` tests) costs 5-13 s a build on the shared 2-core machine.
PATH_RECIPE_COMMAND = (
    "{python}",
    "-c",
    "import os, site; open(os.path.join(site.getsitepackages()[0], 'checkout.pth'), 'w')"
    ".write(os.getcwd())",
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=coldbench-tests", "-c", "user.email=t@coldbench.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.fixture
def stub_repo(tmp_path: Path) -> Path:
    """A repository whose package is named `mlx_lm` but holds one stub module.

    Named like the real engine on purpose: the host's environment has a real mlx_lm installed,
    so an install that does not take effect would silently import the host's copy.
    """
    repo = tmp_path / "stub-repo"
    (repo / "mlx_lm").mkdir(parents=True)
    (repo / "mlx_lm" / "__init__.py").write_text('STUB = "main"\n')
    (repo / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "mlx-lm"\nversion = "0.0.1"\n\n'
        '[tool.setuptools.packages.find]\ninclude = ["mlx_lm*"]\n'
    )
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "stub main")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "mlx_lm" / "__init__.py").write_text('STUB = "feature"\n')
    git(repo, "commit", "-q", "-am", "stub feature")
    git(repo, "tag", "v1")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.fixture
def stub_repository(stub_repo: Path) -> RepositoryConfig:
    return RepositoryConfig(
        name="stub", url=str(stub_repo), module="mlx_lm", recipes=default_recipes()
    )
