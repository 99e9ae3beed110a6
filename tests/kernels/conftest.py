"""Fast-path test fixtures: the `gpu` marker's skip, and counters reset around every test.

Tests marked `gpu` need a Metal or CUDA backend: they are skipped with the reason
"needs Metal or CUDA" only where `coldbench.kernels.detect_backend()` says `cpu`, and run everywhere
else (`pytest -m gpu tests/kernels` on the H200 or a Mac).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coldbench.kernels import COUNTERS, detect_backend


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if detect_backend() != "cpu":
        return
    skip = pytest.mark.skip(reason="needs Metal or CUDA (this host runs MLX on cpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    COUNTERS.reset()
    yield
    COUNTERS.reset()
