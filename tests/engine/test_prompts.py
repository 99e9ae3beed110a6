from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coldbench.engine import checkpoints, corpus
from coldbench.engine.plan import Plan
from coldbench.engine.prompts import PROMPT_VERSION, PromptSource, batch_encoder, ids_sha256

CONTEXTS = (64, 128, 256, 512, 1024)
LONG = 262_144
REPO = Path(__file__).resolve().parents[2]


def _by_definition(source: PromptSource, encode, key: str, start: int, n: int) -> list[int]:
    """A window rebuilt from the module docstring's rule alone: pieces in the order of seeded
    shuffles, each tokenized on its own, concatenated, then the window cut at `start`."""
    pieces = source.corpus.pieces
    ids: list[int] = []
    cycle = 0
    while len(ids) < start + n:
        order = list(range(len(pieces)))
        random.Random(f"{key}:{cycle}").shuffle(order)
        cycle += 1
        for i in order:
            ids += encode([pieces[i]])[0]
            if len(ids) >= start + n:
                break
    return ids[start : start + n]


def test_windows_follow_their_definition(tiny_prompts: PromptSource, tiny_model) -> None:
    encode = batch_encoder(tiny_model[1])
    for context in (64, 1024):
        prompt = tiny_prompts.prompt(7, 2, context)
        token_class = context.bit_length() % 8
        key = f"{PROMPT_VERSION}:{corpus.corpus_sha256()}:7:{context}:{token_class}:2"
        assert prompt.ids == _by_definition(tiny_prompts, encode, key, prompt.start, context)
        assert prompt.ids[0] % 9 == token_class
        assert prompt.sha256 == ids_sha256(prompt.ids)
        assert prompt.corpus_sha256 == corpus.corpus_sha256()
        assert prompt.corpus_name == corpus.BUILTIN


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
    with pytest.raises(ValueError, match="round must be >= 0"):
        tiny_prompts.prompt(0, -1, 64)


# -- windows of 256K tokens -------------------------------------------------------------------

_DIGESTS = """
import json, sys
from engine import checkpoints
from coldbench.engine.prompts import PromptSource
source = PromptSource.from_tokenizer(checkpoints.train_tokenizer(int(sys.argv[1])))
keys = [(r, c) for r in range(3) for c in (131072, 262144)]
print(json.dumps({f"{r}:{c}": source.prompt(0, r, c).sha256 for r, c in keys}))
"""


def _long_digests(source: PromptSource) -> dict[str, str]:
    digests = {}
    for r in range(3):
        for c in (131_072, LONG):
            prompt = source.prompt(0, r, c)
            assert len(prompt.ids) == c
            digests[f"{r}:{c}"] = prompt.sha256
    return digests


@pytest.mark.parametrize("preset", ["tiny", "llama-8b-shape"])
def test_long_windows_distinct_and_identical_across_processes(
    preset: str, tiny_model: tuple[Any, Any, dict[str, Any]]
) -> None:
    vocab = checkpoints.get_preset(preset).tokenizer_vocab
    # the tiny checkpoint's own tokenizer (through mlx-lm); the 8B preset's tokenizer alone
    tokenizer = tiny_model[1] if preset == "tiny" else checkpoints.train_tokenizer(vocab)
    source = PromptSource.from_tokenizer(tokenizer)
    digests = _long_digests(source)
    # the built-in corpus alone has fewer tokens than one window: it is reused in new orders
    assert source._pieces.tokens < 2 * LONG
    assert len(set(digests.values())) == len(digests)  # distinct across rounds and contexts
    windows = [np.array(source.prompt(0, r, LONG).ids) for r in range(3)]
    assert len({int(w[0]) for w in windows}) == 3  # no shared first token
    assert all((a[:1024] != b[:1024]).any() for a in windows for b in windows if a is not b)
    other = subprocess.run(
        [sys.executable, "-c", _DIGESTS, str(vocab)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert json.loads(other.stdout) == digests


# -- host corpora -----------------------------------------------------------------------------


def _code_corpus(path: Path) -> Path:
    blocks = [
        f"def function_{i}(value):\n    total = value * {i}\n    return total + {i * i}\n\n"
        for i in range(400)
    ]
    path.write_text("".join(blocks), encoding="utf-8")
    return path


def test_host_corpus_windows_and_digest(tiny_model, tmp_path: Path) -> None:
    file = _code_corpus(tmp_path / "code.py")
    host = corpus.host_corpus("code", file)
    assert "".join(host.pieces) == file.read_text()
    assert host.sha256 != corpus.corpus_sha256()
    source = PromptSource.from_tokenizer(tiny_model[1], corpus=host)
    builtin = PromptSource.from_tokenizer(tiny_model[1])
    prompt = source.prompt(0, 0, 4096)  # longer than the file's own tokens
    assert len(prompt.ids) == 4096 and prompt.corpus_name == "code"
    assert prompt.corpus_sha256 == host.sha256
    assert prompt.ids != builtin.prompt(0, 0, 4096).ids
    # the same bytes under another file name: the same windows; one byte changed: others
    again = PromptSource.from_tokenizer(
        tiny_model[1], corpus=corpus.host_corpus("code", _code_corpus(tmp_path / "b.py"))
    )
    assert again.prompt(0, 0, 4096) == prompt
    changed = tmp_path / "c.py"
    changed.write_text(file.read_text().replace("return", "yield", 1))
    other = corpus.host_corpus("code", changed)
    assert other.sha256 != host.sha256
    assert PromptSource.from_tokenizer(tiny_model[1], corpus=other).prompt(0, 0, 256).ids != (
        source.prompt(0, 0, 256).ids
    )


def test_plan_names_the_corpus(tiny_model, tmp_path: Path) -> None:
    file = _code_corpus(tmp_path / "code.py")
    base = {"run_id": "r", "variant": "v", "adapter": "embedded", "model": "m"}
    plan = Plan.from_json({**base, "records_path": "x", "corpus": "code", "corpus_path": str(file)})
    source = PromptSource.for_plan(plan, tiny_model[1], tiny_model[2])
    assert source.corpus.name == "code" and source.max_tokens == 8192
    with pytest.raises(ValueError, match="needs its corpus_path"):
        Plan.from_json({**base, "records_path": "x", "corpus": "code"})
    with pytest.raises(ValueError, match="must be a plain name"):
        Plan.from_json({**base, "records_path": "x", "corpus": "../etc", "corpus_path": "/x"})


def test_split_pieces_keeps_every_character() -> None:
    text = "a\n\n\nb\n" + "x" * 9000 + "\nlast line without end"
    pieces = corpus.split_pieces(text)
    assert "".join(pieces) == text
    assert max(len(p) for p in pieces) <= corpus.MAX_PIECE_CHARS + 1


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("code", b"\xff\xfe not utf-8\n\nmore\n", "is not UTF-8 text"),
        ("code", b"one line only", "too little text"),
        ("builtin", b"a\n\nb\n", "is the built-in corpus"),
        ("a/b", b"a\n\nb\n", "must be a plain name"),
        ("code", None, "cannot read"),
    ],
)
def test_bad_host_corpus_is_one_line(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        corpus.host_corpus(name, path)
    assert "\n" not in str(error.value)
