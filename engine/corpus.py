"""Prompt corpora: the built-in one, generated from code, and the host's own text files.

The built-in corpus: a seeded generator writes pseudo-English paragraphs over a fixed lexicon of
syllable words. Only `random.Random` seeded by strings (stable across Python versions: seed
version 2 hashes the string with SHA-512) and integer arithmetic decide the text, so the corpus,
and therefore the tokenizer trained on it and every prompt cut from it, match byte for byte
across hosts. Its digest is pinned by a test.

A host corpus (`[corpora]` in worker.toml, e.g. source code) is a UTF-8 text file split into
pieces at blank lines (and at line ends past `MAX_PIECE_CHARS`), so windows can be assembled
from it exactly as from the built-in paragraphs (engine/prompts.py). Its digest is the sha256 of
the file's bytes. Jobs name a corpus (`BUILTIN` or a host's name), never a path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from coldbench.engine.cache import models_root

CORPUS_VERSION = "coldbench-corpus/1"
BUILTIN = "builtin"
# Corpus names become labels (`corpus:NAME`) and travel in job specs: plain, short, no `+`.
CORPUS_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$"
MAX_PIECE_CHARS = 4096
MAX_HOST_CORPUS_BYTES = 512 << 20
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


# sha256 of the built-in corpus's text (tests/engine/test_checkpoints.py pins it too): a copy
# cached on disk is used only when it has exactly this digest.
BUILTIN_SHA256 = "c4a0185d3de2139451f4daa52bd691bbf097052f663403423218972dca2441a1"


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """Every paragraph, each ending with the blank line that separates it from the next.

    Generating them costs a variant process about 0.3 s of CPU at every start (75 starts in
    the demo), so the text is kept once in the model cache and read back when its digest is
    the pinned one; anything else there is ignored and the text generated again."""
    cached = _cached_text()
    if cached is not None:
        return tuple(piece + "\n\n" for piece in cached.split("\n\n")[:-1])
    generated = tuple(paragraph(i) + "\n\n" for i in range(PARAGRAPHS))
    _keep("".join(generated))
    return generated


def _cache_file() -> Path:
    return models_root() / f"corpus-{BUILTIN_SHA256[:16]}.txt"


def _cached_text() -> str | None:
    try:
        data = _cache_file().read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != BUILTIN_SHA256:
        return None
    return data.decode("utf-8")


def _keep(text: str) -> None:
    """Write the generated text for later processes (atomically: several variant processes
    start at once); a generator whose output is not the pinned corpus writes nothing."""
    data = text.encode("utf-8")
    if hashlib.sha256(data).hexdigest() != BUILTIN_SHA256:
        return
    target = _cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=".corpus-", delete=False)  # noqa: SIM115
    except OSError:  # a read-only cache: every process generates the text, as before
        return
    try:
        with handle:
            handle.write(data)
        os.replace(handle.name, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(handle.name)


@functools.cache
def corpus_sha256() -> str:
    """sha256 of the corpus text (UTF-8), recorded with every prompt."""
    digest = hashlib.sha256()
    for text in paragraphs():
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# the corpus a prompt source cuts from: built-in or the host's


@dataclass(frozen=True)
class Corpus:
    """The text pieces windows are assembled from, its name and its digest."""

    name: str
    pieces: tuple[str, ...]
    sha256: str
    path: str | None = None  # a host corpus's file; None for the built-in one


def builtin() -> Corpus:
    return Corpus(BUILTIN, paragraphs(), corpus_sha256())


def check_corpus_name(name: str) -> str:
    """`name` if it is a valid corpus name, else a one-line ValueError."""
    if not isinstance(name, str) or not re.fullmatch(CORPUS_NAME_PATTERN, name):
        raise ValueError(
            f"corpus name {name!r} must be a plain name (letters, digits, _ . -; at most 56)"
        )
    return name


def split_pieces(text: str) -> tuple[str, ...]:
    """Pieces whose concatenation is `text`: each ends after a blank line, or at the first line
    end past MAX_PIECE_CHARS (a line longer than that is cut at MAX_PIECE_CHARS)."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        while len(line) > MAX_PIECE_CHARS:
            if current:
                pieces.append("".join(current))
                current, size = [], 0
            pieces.append(line[:MAX_PIECE_CHARS])
            line = line[MAX_PIECE_CHARS:]
        current.append(line)
        size += len(line)
        if (line.strip() == "" and size > len(line)) or size >= MAX_PIECE_CHARS:
            pieces.append("".join(current))
            current, size = [], 0
    if current:
        pieces.append("".join(current))
    return tuple(pieces)


def host_corpus(name: str, path: str | Path) -> Corpus:
    """The host's corpus `name` read from `path`; a one-line ValueError when unusable."""
    check_corpus_name(name)
    if name == BUILTIN:
        raise ValueError(f"corpus name {BUILTIN!r} is the built-in corpus; name yours otherwise")
    file = Path(path).expanduser()
    try:
        size = file.stat().st_size
        if size > MAX_HOST_CORPUS_BYTES:
            raise ValueError(
                f"corpus {name!r}: {file} has {size:,} bytes, more than the "
                f"{MAX_HOST_CORPUS_BYTES:,} a corpus may have"
            )
        data = file.read_bytes()
    except OSError as error:
        why = error.strerror or error
        raise ValueError(f"corpus {name!r}: cannot read {file}: {why}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"corpus {name!r}: {file} is not UTF-8 text ({error.reason})") from None
    pieces = split_pieces(text)
    if len(pieces) < 2 or not text.strip():
        raise ValueError(f"corpus {name!r}: {file} has too little text (at least two paragraphs)")
    return Corpus(name, pieces, hashlib.sha256(data).hexdigest(), str(file))


def load_corpus(name: str | None, path: str | Path | None) -> Corpus:
    """The built-in corpus when `name` is None or BUILTIN, else the host's file at `path`."""
    if name in (None, BUILTIN):
        return builtin()
    if path is None:
        raise ValueError(f"corpus {name!r} has no file on this host")
    return host_corpus(name, path)
