from __future__ import annotations

from typing import Any

import pytest

from engine import corpus
from engine.prompts import PromptSource, ids_sha256

CONTEXTS = (64, 128, 256, 512, 1024)


def test_prompts_are_exact_windows_of_the_corpus(tiny_prompts: PromptSource) -> None:
    for context in CONTEXTS:
        prompt = tiny_prompts.prompt(7, 2, context)
        assert len(prompt.ids) == context
        window = tiny_prompts.corpus_ids[prompt.start : prompt.start + context].tolist()
        assert prompt.ids == window
        assert prompt.sha256 == ids_sha256(prompt.ids)
        assert prompt.corpus_sha256 == corpus.corpus_sha256()


def test_same_key_same_ids_in_an_independent_source(
    tiny_prompts: PromptSource, tiny_model: tuple[Any, Any, dict[str, Any]]
) -> None:
    # another variant of the round builds its own source from its own tokenizer
    other = PromptSource.from_tokenizer(tiny_model[1])
    assert other.prompt(0, 3, 256) == tiny_prompts.prompt(0, 3, 256)
    assert tiny_prompts.prompt(1, 3, 256).ids != tiny_prompts.prompt(0, 3, 256).ids


def test_no_shared_prefix_across_rounds_contexts_and_warmup(tiny_prompts: PromptSource) -> None:
    cells = [tiny_prompts.prompt(0, r, c) for r in range(12) for c in CONTEXTS]
    first_by_context: dict[int, set[int]] = {}
    for prompt in cells:
        first_by_context.setdefault(prompt.context_tokens, set()).add(prompt.ids[0])
    # rounds of one context: 12 distinct first tokens
    assert all(len(firsts) == 12 for firsts in first_by_context.values())
    # a ladder of doublings: no first token shared between contexts either
    assert len(set().union(*first_by_context.values())) == 12 * len(CONTEXTS)
    warmups = {tiny_prompts.warmup_prompt(0, c).ids[0] for c in CONTEXTS}
    assert not warmups & set().union(*first_by_context.values())
    assert tiny_prompts.warmup_prompt(0, 64).round == -1


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (8193, "exceeds the model's maximum of 8192"),
        (0, "positive number of tokens"),
    ],
)
def test_bad_context_is_one_clear_error(
    tiny_prompts: PromptSource, context: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_prompts.prompt(0, 0, context)


def test_context_beyond_the_corpus(tiny_model: tuple[Any, Any, dict[str, Any]]) -> None:
    unbounded = PromptSource.from_tokenizer(tiny_model[1])
    too_long = len(unbounded.corpus_ids)
    with pytest.raises(ValueError, match="more than half the prompt corpus"):
        unbounded.prompt(0, 0, too_long)
    with pytest.raises(ValueError, match="round must be >= 0"):
        unbounded.prompt(0, -1, 64)
