"""The plan of one variant process (`python -m coldbench.engine.runner --plan PLAN.json`).

```json
{"run_id": "r-1", "variant": "base", "adapter": "embedded", "model": "/abs/checkpoint",
 "flags": {"prefill_step_size": 256}, "decode_tokens": 8, "seed": 0,
 "records_path": "/abs/records.jsonl", "checkout": null, "server_command": null,
 "cells": null, "warmup_tokens": null, "warmup_contexts": [4096, 16384],
 "server_options": null, "wipe": [], "first_token_timeout_s": null, "corpus": null,
 "corpus_path": null}
```

For the openai-server adapter, `server_options` maps each requested option to what the host's
declaration resolved it to (`{"value": 4096, "argv": [...], "env": {...}, "proof": "regex" or
null}`, optionally `stock`, `prefill_step` and `proof_template`, with which the adapter judges
it; the worker validates the variant's values, the engine only applies them), `wipe` lists
the cache folders deleted before the server starts, and `first_token_timeout_s` bounds the wait
for a cell's first streamed token.

`model` is a checkpoint directory or `preset:NAME`; `cells` (a list of
`{"round", "order", "context_tokens"}`) makes the process run them and exit (batch mode);
`warmup_contexts` lists the contexts warmed once each before the first timed cell (kernels
compile per shape on Metal and CUDA, so every context of the matrix is warmed); without it,
`warmup_tokens` names a single warm-up length, else every context of the batch `cells`, else
256 tokens. `corpus` names the prompt corpus (null: the built-in one) and
`corpus_path` is the host's file for it, which only the worker writes from the host's own
configuration. Every field is checked; a bad one is a ValueError of one line naming it.
`Plan.to_json` writes the object, `Plan.from_json` reads it (the worker writes, the runner
reads, possibly the runner of an older embedded ref: see `_ALWAYS`).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from coldbench.engine.corpus import BUILTIN, check_corpus_name

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
DEFAULT_WARMUP_TOKENS = 256


# Set by the orchestrator in a variant process's environment (engine/runner.py's gates): after
# the imports print `imported` and wait for `{"op": "load"}`; after loading print `loaded` and
# wait for `{"op": "warmup"}`. Environment variables, not plan fields, so that a runner of an
# older engine commit, whose Plan refuses unknown fields, still starts.
LOAD_GATE_ENV = "COLDBENCH_LOAD_GATE"
WARMUP_GATE_ENV = "COLDBENCH_WARMUP_GATE"


@dataclass(frozen=True)
class CellRequest:
    round: int
    order: int
    context_tokens: int

    @classmethod
    def from_json(cls, value: Any) -> CellRequest:
        if not isinstance(value, dict):
            raise ValueError(f"a cell must be a JSON object, not {type(value).__name__}")
        unknown = sorted(set(value) - {"round", "order", "context_tokens"})
        if unknown:
            raise ValueError(f"unknown cell field(s): {', '.join(unknown)}")
        for key, least in (("round", 0), ("order", 0), ("context_tokens", 1)):
            item = value.get(key)
            if not isinstance(item, int) or isinstance(item, bool) or item < least:
                raise ValueError(f"cell {key} must be an integer >= {least}, not {item!r}")
        return cls(value["round"], value["order"], value["context_tokens"])


# The fields every runner reads, written always; the rest came later (corpora, servers' options,
# wipe paths, the first-token bound, a single warm-up length) and are written only where set, so
# that the runner of an older embedded ref, whose Plan refuses fields it does not know, still
# reads the plan of a job that does not use them.
_ALWAYS: Final = (
    "run_id",
    "variant",
    "adapter",
    "model",
    "records_path",
    "flags",
    "decode_tokens",
    "seed",
    "checkout",
    "server_command",
    "cells",
    "warmup_contexts",
)


@dataclass(frozen=True)
class Plan:
    """`records_path` and `cells` are the process's own: the orchestrator (worker/variants.py)
    fills them for each process it starts from one variant's plan."""

    run_id: str
    variant: str
    adapter: str
    model: str
    records_path: str = ""
    flags: dict[str, Any] = field(default_factory=dict)
    decode_tokens: int = 8
    seed: int = 0
    checkout: str | None = None
    server_command: list[str] | None = None
    cells: list[CellRequest] | None = None
    warmup_tokens: int | None = None
    warmup_contexts: list[int] | None = None
    server_options: dict[str, dict[str, Any]] | None = None
    wipe: list[str] = field(default_factory=list)
    first_token_timeout_s: float | None = None
    corpus: str | None = None
    corpus_path: str | None = None

    @classmethod
    def load(cls, path: Path | str) -> Plan:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ValueError(f"cannot read plan {path}: {error.strerror or error}") from None
        try:
            value = json.loads(text)
        except ValueError as error:
            raise ValueError(f"plan {path} is not valid JSON: {error}") from None
        return cls.from_json(value)

    @classmethod
    def from_json(cls, value: Any) -> Plan:
        if not isinstance(value, dict):
            raise ValueError("a plan must be a JSON object")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown plan field(s): {', '.join(unknown)}")
        missing = sorted(
            k
            for k in ("run_id", "variant", "adapter", "model", "records_path")
            if not isinstance(value.get(k), str) or not value.get(k)
        )
        if missing:
            raise ValueError(f"plan needs non-empty string field(s): {', '.join(missing)}")
        if not _NAME.fullmatch(value["variant"]):
            raise ValueError(f"plan variant {value['variant']!r} is not a valid name")
        flags = value.get("flags") or {}
        if not isinstance(flags, dict):
            raise ValueError("plan flags must be an object of flag -> value")
        for key, least in (("decode_tokens", 0), ("seed", 0), ("warmup_tokens", 1)):
            item = value.get(key)
            if item is not None and (
                not isinstance(item, int) or isinstance(item, bool) or item < least
            ):
                raise ValueError(f"plan {key} must be an integer >= {least}, not {item!r}")
        command = value.get("server_command")
        if command is not None and (
            not isinstance(command, list) or not all(isinstance(c, str) for c in command)
        ):
            raise ValueError("plan server_command must be a list of strings")
        options = value.get("server_options")
        if options is not None:
            _check_server_options(options)
        wipe = value.get("wipe") or []
        if not isinstance(wipe, list) or not all(
            isinstance(p, str) and p.startswith("/") and p.rstrip("/") for p in wipe
        ):
            raise ValueError("plan wipe must be a list of absolute paths other than /")
        timeout = value.get("first_token_timeout_s")
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0
        ):
            raise ValueError(f"plan first_token_timeout_s must be above 0, not {timeout!r}")
        checkout = value.get("checkout")
        if checkout is not None and not isinstance(checkout, str):
            raise ValueError("plan checkout must be a path string")
        corpus_name, corpus_path = value.get("corpus"), value.get("corpus_path")
        if corpus_name is not None:
            check_corpus_name(corpus_name)
        if corpus_path is not None and not isinstance(corpus_path, str):
            raise ValueError("plan corpus_path must be a path string")
        if corpus_name not in (None, BUILTIN) and corpus_path is None:
            raise ValueError(f"plan corpus {corpus_name!r} needs its corpus_path")
        warmup_contexts = value.get("warmup_contexts")
        if warmup_contexts is not None and (
            not isinstance(warmup_contexts, list)
            or not warmup_contexts
            or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in warmup_contexts
            )
        ):
            raise ValueError("plan warmup_contexts must be a non-empty list of integers >= 1")
        cells = value.get("cells")
        if cells is not None:
            if not isinstance(cells, list):
                raise ValueError("plan cells must be a list")
            cells = [CellRequest.from_json(c) for c in cells]
        return cls(
            run_id=value["run_id"],
            variant=value["variant"],
            adapter=value["adapter"],
            model=value["model"],
            records_path=value["records_path"],
            flags=dict(flags),
            decode_tokens=value.get("decode_tokens", 8)
            if value.get("decode_tokens") is not None
            else 8,
            seed=value.get("seed") or 0,
            checkout=checkout,
            server_command=command,
            cells=cells,
            warmup_tokens=value.get("warmup_tokens"),
            warmup_contexts=sorted(set(warmup_contexts)) if warmup_contexts else None,
            server_options=options,
            wipe=list(wipe),
            first_token_timeout_s=None if timeout is None else float(timeout),
            corpus=corpus_name,
            corpus_path=corpus_path,
        )

    def to_json(self) -> dict[str, Any]:
        """The plan as PLAN.json's object (`from_json` reads it back; `_ALWAYS` says which
        fields are written when unset)."""
        value: dict[str, Any] = {}
        for item in fields(self):
            given = getattr(self, item.name)
            if item.name == "cells" and given is not None:
                given = [asdict(cell) for cell in given]
            elif isinstance(given, dict | list):
                given = copy.deepcopy(given)
            if item.name in _ALWAYS or given != _default(item):
                value[item.name] = given
        return value

    def warmup_shapes(self) -> list[int]:
        """The contexts to warm, each once, smallest first (module docstring)."""
        if self.warmup_contexts:
            return list(self.warmup_contexts)
        if self.warmup_tokens is not None:
            return [self.warmup_tokens]
        if self.cells:
            return sorted({c.context_tokens for c in self.cells})
        return [DEFAULT_WARMUP_TOKENS]


_OPTION_KEYS = {"value", "argv", "env", "proof"}
# What coldbench.engine.judge needs to judge an option at each context (evidence/spec/options.py).
_OPTION_JUDGED = {"stock", "prefill_step", "proof_template"}


def _check_server_options(options: Any) -> None:
    if not isinstance(options, dict):
        raise ValueError("plan server_options must be an object of option -> resolution")
    for name, item in options.items():
        if not isinstance(item, dict) or not (
            _OPTION_KEYS <= set(item) <= _OPTION_KEYS | _OPTION_JUDGED
        ):
            raise ValueError(
                f"plan server_options.{name} needs value, argv, env and proof (and may say "
                "stock, prefill_step and proof_template)"
            )
        argv, env, proof = item["argv"], item["env"], item["proof"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"plan server_options.{name}.argv must be a list of strings")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"plan server_options.{name}.env must map names to strings")
        if proof is not None:
            if not isinstance(proof, str):
                raise ValueError(f"plan server_options.{name}.proof must be a string or null")
            try:
                re.compile(proof)
            except re.error as error:
                raise ValueError(f"plan server_options.{name}.proof: {error}") from None
        if not isinstance(item.get("stock"), int | None):
            raise ValueError(f"plan server_options.{name}.stock must be an int, a bool or null")
        if not isinstance(item.get("prefill_step", False), bool):
            raise ValueError(f"plan server_options.{name}.prefill_step must be true or false")
        if not isinstance(item.get("proof_template"), str | None):
            raise ValueError(f"plan server_options.{name}.proof_template must be a string or null")


def _default(item: Field[Any]) -> Any:
    """A dataclass field's default value (MISSING for a required field)."""
    if item.default_factory is not MISSING:
        return item.default_factory()
    return item.default
