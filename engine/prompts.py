"""Prompts: exactly N token ids cut from the tokenized corpus at a window chosen by
(seed, round, context).

Pairing and coldness both depend on this module:
- every variant of a round sees the same ids (the window is a pure function of the key);
- rounds never share a prefix: for one (seed, context) the first token of every round's window
  differs from every earlier round's, so not even a one-token prefix cache can hit;
- contexts whose bit lengths differ (mod 8), e.g. any ladder of up to 8 doublings, start with
  first tokens from disjoint classes (token id mod 9), so they cannot share a prefix either;
- the warm-up prompt starts in a ninth class that measured prompts never use.
The tokenized corpus is the concatenation of each paragraph's encoding without special tokens.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import corpus

PROMPT_VERSION = "coldbench-prompt/1"
_CLASSES = 9
_WARMUP_CLASS = 8


def ids_sha256(ids: Sequence[int]) -> str:
    """sha256 of token ids as compact JSON (`[1,2,3]`): the prompt and output digests."""
    text = json.dumps([int(i) for i in ids], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    seed: int
    round: int  # -1 for the warm-up prompt
    context_tokens: int
    start: int  # offset of the window in the tokenized corpus
    sha256: str
    corpus_sha256: str


def batch_encoder(tokenizer: Any) -> Callable[[list[str]], list[list[int]]]:
    """An encoder of many texts without special tokens, for an mlx-lm TokenizerWrapper, a
    transformers tokenizer or a `tokenizers.Tokenizer`."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None and hasattr(inner, "encode_batch"):
        backend = inner
    if backend is not None:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [inner.encode(t, add_special_tokens=False) for t in texts]


class PromptSource:
    """The tokenized corpus for one tokenizer, and the windows cut from it."""

    def __init__(
        self, encode: Callable[[list[str]], list[list[int]]], *, max_tokens: int | None = None
    ) -> None:
        pieces = encode(list(corpus.paragraphs()))
        self.corpus_ids = np.fromiter(
            (i for piece in pieces for i in piece), dtype=np.int64, count=sum(map(len, pieces))
        )
        self.corpus_sha256 = corpus.corpus_sha256()
        self.max_tokens = max_tokens

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, max_tokens: int | None = None) -> PromptSource:
        return cls(batch_encoder(tokenizer), max_tokens=max_tokens)

    def prompt(self, seed: int, round: int, context_tokens: int) -> Prompt:
        if round < 0:
            raise ValueError(f"round must be >= 0, not {round}")
        return self._cut(seed, round, context_tokens, context_tokens.bit_length() % 8)

    def warmup_prompt(self, seed: int, context_tokens: int) -> Prompt:
        """A prompt no measured cell ever uses (its first token is in a class of its own)."""
        prompt = self._cut(seed, 0, context_tokens, _WARMUP_CLASS)
        return Prompt(**{**prompt.__dict__, "round": -1})

    def cell_prompt(self, seed: int, round: int, context_tokens: int) -> Prompt:
        """The prompt of one cell: the warm-up's for round -1, else the round's window."""
        if round < 0:
            return self.warmup_prompt(seed, context_tokens)
        return self.prompt(seed, round, context_tokens)

    def check_context(self, context_tokens: int) -> None:
        if not isinstance(context_tokens, int) or context_tokens < 1:
            raise ValueError(f"context must be a positive number of tokens, not {context_tokens!r}")
        if self.max_tokens is not None and context_tokens > self.max_tokens:
            raise ValueError(
                f"context {context_tokens} tokens exceeds the model's maximum of "
                f"{self.max_tokens} (max_position_embeddings)"
            )
        if context_tokens > len(self.corpus_ids) // 2:
            raise ValueError(
                f"context {context_tokens} tokens is more than half the prompt corpus "
                f"({len(self.corpus_ids)} tokens with this tokenizer)"
            )

    def _cut(self, seed: int, round: int, context_tokens: int, token_class: int) -> Prompt:
        self.check_context(context_tokens)
        ids = self.corpus_ids
        starts = np.flatnonzero(ids[: len(ids) - context_tokens + 1] % _CLASSES == token_class)
        available = len(np.unique(ids[starts]))
        if round >= available:
            raise ValueError(
                f"round {round}: only {available} distinct prompt starts for context "
                f"{context_tokens} with this tokenizer"
            )
        rng = random.Random(f"{PROMPT_VERSION}:{seed}:{context_tokens}:{token_class}")
        used: set[int] = set()
        start = 0
        for _ in range(round + 1):
            while True:
                start = int(starts[rng.randrange(len(starts))])
                if int(ids[start]) not in used:
                    used.add(int(ids[start]))
                    break
        window = [int(i) for i in ids[start : start + context_tokens]]
        return Prompt(
            ids=window,
            seed=seed,
            round=round,
            context_tokens=context_tokens,
            start=start,
            sha256=ids_sha256(window),
            corpus_sha256=self.corpus_sha256,
        )
