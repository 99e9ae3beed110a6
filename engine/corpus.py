"""The prompt corpus: the same bytes on every host, generated from code, never from the host.

A seeded generator writes pseudo-English paragraphs over a fixed lexicon of syllable words. Only
`random.Random` seeded by strings (stable across Python versions: seed version 2 hashes the
string with SHA-512) and integer arithmetic decide the text, so the corpus, and therefore the
tokenizer trained on it and every prompt cut from it, match byte for byte across hosts. The
digest is pinned by a test.
"""

from __future__ import annotations

import functools
import hashlib
import random

CORPUS_VERSION = "coldbench-corpus/1"
PARAGRAPHS = 2500
LEXICON_WORDS = 3000
_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w"]
_ONSETS += ["br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "nd", "st", "rk", "t"]


@functools.cache
def lexicon() -> tuple[str, ...]:
    """LEXICON_WORDS distinct pseudo-words; rank order is frequency order (Zipf)."""
    rng = random.Random(f"{CORPUS_VERSION}:lexicon")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < LEXICON_WORDS:
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


@functools.cache
def _cumulative_weights() -> tuple[float, ...]:
    total = 0.0
    cumulative = []
    for rank in range(LEXICON_WORDS):
        total += 1.0 / (rank + 2.7)
        cumulative.append(total)
    return tuple(cumulative)


def paragraph(index: int) -> str:
    """Paragraph `index` of the corpus: 3-7 sentences of 6-18 words, seeded by its index."""
    rng = random.Random(f"{CORPUS_VERSION}:paragraph:{index}")
    words = lexicon()
    cumulative = _cumulative_weights()
    sentences = []
    for _ in range(rng.randint(3, 7)):
        chosen = rng.choices(words, cum_weights=cumulative, k=rng.randint(6, 18))
        chosen[0] = chosen[0].capitalize()
        sentences.append(" ".join(chosen) + rng.choice((".", ".", ".", "?", "!", ";")))
    return " ".join(sentences)


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """Every paragraph, each ending with the blank line that separates it from the next."""
    return tuple(paragraph(i) + "\n\n" for i in range(PARAGRAPHS))


@functools.cache
def corpus_sha256() -> str:
    """sha256 of the corpus text (UTF-8), recorded with every prompt."""
    digest = hashlib.sha256()
    for text in paragraphs():
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()
