"""Prompts: exactly N token ids from a stream of corpus pieces keyed by (seed, round, context).

A window is assembled, not cut from a fixed text: the round's stream is the corpus's pieces (the
built-in paragraphs or a host corpus's, engine/corpus.py) in an order drawn by a seeded shuffle
of `(PROMPT_VERSION, seed, context, class, round, cycle)`, each piece tokenized on its own without
special tokens and the encodings concatenated; when the window is longer than the corpus, the
next cycle's shuffle follows. So any context has a window (the corpus is reused in a new order
past its own length), and only the pieces a window needs are ever tokenized (once per source).

Pairing and coldness both depend on this module:
- every variant of a round sees the same ids (the window is a pure function of the key, the
  corpus and the tokenizer);
- rounds never share a prefix: for one (seed, context) the window starts at the first token of
  its stream whose id is in the context's class and differs from every earlier round's first
  token, so not even a one-token prefix cache can hit;
- contexts whose bit lengths differ (mod 8), e.g. any ladder of up to 8 doublings, start with
  first tokens from disjoint classes (token id mod 9), so they cannot share a prefix either;
- the warm-up prompt starts in a ninth class that measured prompts never use.
Every prompt carries the digest of the corpus it came from (`prompt_corpus_sha256` in records).
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coldbench.engine import corpus as corpora

if TYPE_CHECKING:
    from coldbench.engine.plan import Plan

PROMPT_VERSION = "coldbench-prompt/2"
_CLASSES = 9
_WARMUP_CLASS = 8
# How far into a round's stream a first token is looked for before the round is refused.
_MAX_START_SCAN = 1 << 16

Encoder = Callable[[list[str]], list[list[int]]]
ContextCheck = Callable[[int], None]


def ids_sha256(ids: Sequence[int]) -> str:
    """sha256 of token ids as compact JSON (`[1,2,3]`): the prompt and output digests."""
    # the bytes of json.dumps(ids, separators=(",", ":")), built without the JSON encoder: a
    # 262,144-token window is hashed in milliseconds instead of half a second
    text = "[" + ",".join(map(str, map(int, ids))) + "]"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    seed: int
    round: int  # -1 for the warm-up prompt
    context_tokens: int
    start: int  # offset of the window in its round's stream
    sha256: str
    corpus_sha256: str
    corpus_name: str = corpora.BUILTIN


def batch_encoder(tokenizer: Any) -> Encoder:
    """An encoder of many texts without special tokens, for an mlx-lm TokenizerWrapper, a
    transformers tokenizer or a `tokenizers.Tokenizer`."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None and hasattr(inner, "encode_batch"):
        backend = inner
    if backend is not None:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [inner.encode(t, add_special_tokens=False) for t in texts]


class _Pieces:
    """The corpus's pieces, each tokenized the first time a window needs it."""

    def __init__(self, pieces: Sequence[str], encode: Encoder) -> None:
        self.texts = pieces
        self.encode = encode
        self.ids: list[array[int] | None] = [None] * len(pieces)
        self.tokens = 0
        self.encoded = 0

    def mean_tokens(self) -> float:
        return self.tokens / self.encoded if self.encoded else 64.0

    def get(self, indices: Sequence[int]) -> list[array[int]]:
        missing = sorted({i for i in indices if self.ids[i] is None})
        if missing:
            encoded = self.encode([self.texts[i] for i in missing])
            for i, piece in zip(missing, encoded, strict=True):
                self.ids[i] = array("q", piece)
                self.tokens += len(piece)
            self.encoded += len(missing)
        return [self.ids[i] for i in indices]  # type: ignore[misc]


class _Stream:
    """One round's stream: pieces in the order of successive seeded shuffles, extended on
    demand (tokenizing a block at a time, sized from the mean piece length so far)."""

    def __init__(self, pieces: _Pieces, key: str) -> None:
        self.pieces = pieces
        self.key = key
        self.parts: list[array[int]] = []
        self.length = 0
        self.cycle = 0
        self.order: list[int] = []
        self.position = 0

    def _next_indices(self, count: int) -> list[int]:
        taken: list[int] = []
        while len(taken) < count:
            if self.position == len(self.order):
                self.order = list(range(len(self.pieces.texts)))
                random.Random(f"{self.key}:{self.cycle}").shuffle(self.order)
                self.cycle += 1
                self.position = 0
            block = self.order[self.position : self.position + count - len(taken)]
            self.position += len(block)
            taken += block
        return taken

    def extend_to(self, tokens: int) -> None:
        while self.length < tokens:
            missing = tokens - self.length
            count = max(4, int(missing / max(self.pieces.mean_tokens(), 1.0) * 1.1) + 1)
            for ids in self.pieces.get(self._next_indices(count)):
                if len(ids):
                    self.parts.append(ids)
                    self.length += len(ids)

    def tokens(self, start: int, stop: int) -> array[int]:
        self.extend_to(stop)
        if len(self.parts) != 1:
            joined = array("q")
            for part in self.parts:
                joined.extend(part)
            self.parts = [joined]  # later slices of this stream do not concatenate again
        return self.parts[0][start:stop]


class PromptSource:
    """The windows of one corpus for one tokenizer."""

    def __init__(
        self,
        encode: Encoder,
        *,
        max_tokens: int | None = None,
        corpus: corpora.Corpus | None = None,
        checks: Sequence[ContextCheck] = (),
    ) -> None:
        self.corpus = corpus or corpora.builtin()
        self.corpus_sha256 = self.corpus.sha256
        self.max_tokens = max_tokens
        self.checks = tuple(checks)
        self._pieces = _Pieces(self.corpus.pieces, encode)
        # (seed, context, class) -> [(first token, start)] of rounds 0, 1, ... so far
        self._starts: dict[tuple[int, int, int], list[tuple[int, int]]] = {}

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        max_tokens: int | None = None,
        corpus: corpora.Corpus | None = None,
        checks: Sequence[ContextCheck] = (),
    ) -> PromptSource:
        return cls(batch_encoder(tokenizer), max_tokens=max_tokens, corpus=corpus, checks=checks)

    @classmethod
    def for_plan(
        cls, plan: Plan, tokenizer: Any, config: Mapping[str, Any], *, checks=()
    ) -> PromptSource:
        """The source a variant process uses: the plan's corpus, the model's position limit,
        and `checks` (e.g. coldbench.engine.memory's estimate) run on every context before its
        cell."""
        return cls.from_tokenizer(
            tokenizer,
            max_tokens=config.get("max_position_embeddings"),
            corpus=corpora.load_corpus(plan.corpus, plan.corpus_path),
            checks=checks,
        )

    def prompt(self, seed: int, round: int, context_tokens: int) -> Prompt:
        if round < 0:
            raise ValueError(f"round must be >= 0, not {round}")
        return self._window(seed, round, context_tokens, context_tokens.bit_length() % 8)

    def warmup_prompt(self, seed: int, context_tokens: int) -> Prompt:
        """A prompt no measured cell ever uses (its first token is in a class of its own)."""
        prompt = self._window(seed, 0, context_tokens, _WARMUP_CLASS)
        return Prompt(**{**prompt.__dict__, "round": -1})

    def cell_prompt(self, seed: int, round: int, context_tokens: int) -> Prompt:
        """The prompt of one cell: the warm-up's for round -1, else the round's window."""
        if round < 0:
            return self.warmup_prompt(seed, context_tokens)
        return self.prompt(seed, round, context_tokens)

    def check_context(self, context_tokens: int) -> None:
        """ValueError (one line) for a context this source, the model or a check refuses."""
        if (
            not isinstance(context_tokens, int)
            or isinstance(context_tokens, bool)
            or context_tokens < 1
        ):
            raise ValueError(f"context must be a positive number of tokens, not {context_tokens!r}")
        if self.max_tokens is not None and context_tokens > self.max_tokens:
            raise ValueError(
                f"context {context_tokens} tokens exceeds the model's maximum of "
                f"{self.max_tokens} (max_position_embeddings)"
            )
        for check in self.checks:
            check(context_tokens)

    def stream(self, seed: int, round: int, context_tokens: int, token_class: int) -> _Stream:
        """The round's stream of ids (exposed so tests can rebuild a window by definition)."""
        key = f"{PROMPT_VERSION}:{self.corpus_sha256}:{seed}:{context_tokens}:{token_class}:{round}"
        return _Stream(self._pieces, key)

    def _start(self, seed: int, round: int, context_tokens: int, token_class: int) -> int:
        """The window's start in the round's stream: the first token of the class that no
        earlier round of this (seed, context) started with."""
        starts = self._starts.setdefault((seed, context_tokens, token_class), [])
        while len(starts) <= round:
            r = len(starts)
            used = {first for first, _ in starts}
            stream = self.stream(seed, r, context_tokens, token_class)
            scanned = 0
            found: tuple[int, int] | None = None
            while found is None and scanned < _MAX_START_SCAN:
                chunk = stream.tokens(scanned, scanned + 256)
                for offset, token in enumerate(chunk.tolist()):
                    if token % _CLASSES == token_class and token not in used:
                        found = (int(token), scanned + offset)
                        break
                scanned += len(chunk)
            if found is None:
                raise ValueError(
                    f"round {r}: no unused first token for context {context_tokens} with this "
                    f"tokenizer and corpus {self.corpus.name!r} ({r} rounds is the most)"
                )
            starts.append(found)
        return starts[round][1]

    def _window(self, seed: int, round: int, context_tokens: int, token_class: int) -> Prompt:
        self.check_context(context_tokens)
        start = self._start(seed, round, context_tokens, token_class)
        stream = self.stream(seed, round, context_tokens, token_class)
        window = stream.tokens(start, start + context_tokens).tolist()
        return Prompt(
            ids=window,
            seed=seed,
            round=round,
            context_tokens=context_tokens,
            start=start,
            sha256=ids_sha256(window),
            corpus_sha256=self.corpus_sha256,
            corpus_name=self.corpus.name,
        )
