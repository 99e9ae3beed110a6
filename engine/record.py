"""The cell record, typed: what an adapter measured (`Measurement`) and the line the variant
process writes (`CellRecord`: the measurement with the cell's identity).

Made here and nowhere else: adapters return a `Measurement`, the runner adds the identity,
the orchestrator (worker/variants.py) writes `CellRecord.failed` for a cell whose process never
answered. `as_json()` is the JSON object of DESIGN.md's record (`coldbench.record/1`), which
`coldbench.evidence.contract.schemas.Record` validates on the other side;
tests/engine/test_record.py holds the two field lists together. Standard library only: engine/ may
not import pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

RECORD_SCHEMA = "coldbench.record/1"
# How many characters of a failure's text a record's reason keeps.
REASON_MAX_CHARS = 500

CellStatus = Literal["ok", "invalid", "error", "warmup"]
# Written only when known: absent keys keep records of adapters without them as they were.
_OPTIONAL = ("output_margins", "prompt_corpus_sha256", "process")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def clip(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """`text` within `limit` characters, keeping its start (what failed) and its end (where a
    log tail's last lines, e.g. argparse's `unrecognized arguments`, say why)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]} ... {text[len(text) - (limit - head - 5) :]}"


def one_line(error: BaseException) -> str:
    """An exception as one line: a ValueError's own words (bad input says what is wrong),
    anything else prefixed with its type."""
    text = " ".join(str(error).split())
    return text if isinstance(error, ValueError) and text else f"{type(error).__name__}: {text}"


@dataclass(kw_only=True)
class Measurement:
    """The measured part of a record: DESIGN.md's fields from `prompt_tokens` on. Unknown
    values are None, never 0."""

    prompt_tokens: int | None = None
    prompt_sha256: str | None = None
    cached_tokens: int | None = None
    prefill_s: float | None = None
    prefill_tps: float | None = None
    decode_tokens: int | None = None
    decode_s: float | None = None
    decode_tps: float | None = None
    output_sha256: str | None = None
    output_head: list[int] | None = None
    peak_memory_bytes: int | None = None
    counters: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
    status: CellStatus = "error"
    reason: str | None = None
    # Top-2 logit margins of each output id's distribution (the parity tolerance policy).
    output_margins: list[float] | None = None
    # The corpus the prompt was cut from.
    prompt_corpus_sha256: str | None = None

    @classmethod
    def failed(cls, reason: str, *, started_at: str | None = None) -> Measurement:
        """A cell that measured nothing: status `error`, every value unknown."""
        return cls(
            status="error",
            reason=clip(reason),
            started_at=started_at or now_iso(),
            ended_at=now_iso(),
        )

    def fail(self, error: BaseException) -> None:
        """This cell failed part-way: status `error` with the exception in one line (what
        was measured before the failure stays)."""
        self.status = "error"
        self.reason = clip(f"{type(error).__name__}: {' '.join(str(error).split())}")


@dataclass(kw_only=True)
class CellRecord(Measurement):
    """One line of records.jsonl: a measurement and which cell it is."""

    schema: str = RECORD_SCHEMA
    run_id: str
    variant: str
    round: int
    order: int
    context_tokens: int
    adapter: str | None = None
    flags: dict[str, Any] | None = None
    # The variant's process instance that measured it (set by the orchestrator).
    process: int | None = None

    @classmethod
    def of(cls, measured: Measurement, **identity: Any) -> CellRecord:
        """The record of `measured` for the cell named by `identity` (run_id, variant, ...)."""
        values = {f.name: getattr(measured, f.name) for f in fields(Measurement)}
        return cls(**values, **identity)

    def as_json(self) -> dict[str, Any]:
        """The record/1 JSON object, the cell's identity first; optional fields only when
        known."""
        measured = {f.name for f in fields(Measurement)}
        names = [f.name for f in fields(self) if f.name not in measured] + [
            f.name for f in fields(Measurement)
        ]
        out = {name: getattr(self, name) for name in names}
        for name in _OPTIONAL:
            if out[name] is None:
                del out[name]
        return out
