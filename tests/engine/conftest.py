"""Engine fixtures: the tiny model loaded once per session and its prompt source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coldbench.engine import checkpoints
from coldbench.engine.prompts import PromptSource


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config) of the tiny preset, loaded through mlx_lm.utils.load."""
    return checkpoints.load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_prompts(tiny_model: tuple[Any, Any, dict[str, Any]]) -> PromptSource:
    _, tokenizer, config = tiny_model
    return PromptSource.from_tokenizer(tokenizer, max_tokens=config["max_position_embeddings"])


@pytest.fixture(scope="session")
def micro_model(micro_model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config) of the micro preset: for tests of what a cell counts (chunk
    widths, clears) at lengths where `tiny`'s CPU arithmetic takes a minute."""
    return checkpoints.load_model(micro_model_dir)


@pytest.fixture(scope="session")
def micro_prompts(micro_model: tuple[Any, Any, dict[str, Any]]) -> PromptSource:
    _, tokenizer, config = micro_model
    return PromptSource.from_tokenizer(tokenizer, max_tokens=config["max_position_embeddings"])
