"""Hypothesis strategies for what a host or a submitter can send: the worker protocol's
messages and the files of a run, valid ones with fields replaced by hostile values (control
characters and NUL in text and in keys, non-finite and huge numbers, extra fields, nesting).

Used by tests/evidence/test_boundary.py; any test of a parser or an endpoint may draw from
them.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.evidence.builders import record

FINGERPRINT: dict[str, Any] = {
    "hostname": "box",
    "chip": "Apple M3 Ultra",
    "backend": "metal",
    "os": "macOS 15.1",
    "cores": 32,
}

# Every code point below U+3000, controls and separators included, plus the line and
# paragraph separators, a bidirectional override and lone surrogates (what `"\\ud800"` in
# JSON parses into).
HOSTILE_CHARACTERS = st.characters(max_codepoint=0x3000) | st.sampled_from(
    [
        *("\u0000", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\u202e"),
        *("\ud800", "\udbff", "\udc80", "\udfff"),
    ]
)
HOSTILE_TEXT = st.text(HOSTILE_CHARACTERS, max_size=12)
HOSTILE_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | HOSTILE_TEXT
)
HOSTILE_JSON = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
    max_leaves=12,
)


def hostile(valid: dict[str, Any], depth: int = 2) -> st.SearchStrategy[Any]:
    """`valid` with some of its fields (nested down to `depth`) replaced by hostile values
    and some hostile fields added."""
    replaced: dict[str, st.SearchStrategy[Any]] = {}
    for key, value in valid.items():
        if depth > 1 and isinstance(value, dict) and value:
            replaced[key] = hostile(value, depth - 1) | st.just(value)
        else:
            replaced[key] = HOSTILE_JSON | st.just(value)
    return st.builds(
        lambda fields, added: {**fields, **added},
        st.fixed_dictionaries(replaced),
        st.dictionaries(HOSTILE_TEXT, HOSTILE_JSON, max_size=2),
    )


REPOSITORY_OFFER = {"adapter": "mlx-lm", "recipes": ["editable"], "options": {}}
VALID_MESSAGES: dict[str, dict[str, Any]] = {
    "RegisterRequest": {
        "name": "studio-1",
        "fingerprint": FINGERPRINT,
        "labels": ["gpu:m3"],
        "repositories": {"mlx-lm": REPOSITORY_OFFER},
        "models": ["preset:tiny"],
    },
    "LeaseRequest": {"fingerprint": FINGERPRINT, "wait_s": 0, "models": ["preset:tiny"]},
    "HeartbeatRequest": {
        "run_id": "r1",
        "attempt": 1,
        "progress": {
            "cells_done": 1,
            "cells_total": 8,
            "variant": "base",
            "context_tokens": 64,
            "invalid": [{"variant": "base", "round": 0, "context_tokens": 64, "reason": "oom"}],
        },
    },
    "CompleteRequest": {
        "attempt": 1,
        "status": "failed",
        "reason": "oom\nserver log: ...",
        "manifest": {
            "format": "coldbench.evidence/1",
            "files": {"records.jsonl": {"sha256": "0" * 64, "bytes": 3}},
            "provenance": {"host": FINGERPRINT},
        },
    },
}
VALID_RECORD: dict[str, Any] = json.loads(record().model_dump_json(by_alias=True))
VALID_PROVENANCE: dict[str, Any] = {
    "schema": "coldbench.provenance/1",
    "run_id": "r1",
    "created_at": "2026-11-29T09:00:00+00:00",
    "host": FINGERPRINT,
    "software": {"python": "3.11.9", "mlx": "0.32.4"},
    "targets": [{"variant": "base", "ref": "main", "flags": {"kv_bits": 4}}],
    "model": {"name": "preset:tiny"},
    "command": "coldbench run --model preset:tiny",
}
