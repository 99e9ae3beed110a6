"""Fixtures shared by every test folder.

Services: PostgreSQL and Redis are real (DESIGN.md); their URLs come from the environment with
the local defaults .ci/run makes sure of. Child processes started by tests import this checkout:
PYTHONPATH is set to the repository root for the whole session.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)
POSTGRES_URL = os.environ.get(
    "COLDBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("COLDBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def coldbench_cmd() -> list[str]:
    """The CLI as a child process of this interpreter and checkout."""
    return [sys.executable, "-m", "coldbench"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` preset (llama, 4 layers, width 256, float32, seed 0), written once per session.

    It lies where `engine.checkpoints.resolve_model("preset:tiny", {})` looks: the fixture points
    COLDBENCH_MODEL_DIR (inherited by child processes) at its folder, so `preset:tiny` resolves
    to this same checkpoint instead of writing one under the home directory.
    """
    from engine.checkpoints import create_checkpoint

    root = tmp_path_factory.mktemp("models")
    os.environ["COLDBENCH_MODEL_DIR"] = str(root)
    return create_checkpoint("tiny", root / "tiny-0-float32")
