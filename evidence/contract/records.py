"""records.jsonl: one `Record` per line, read with line-numbered errors, written canonically."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from coldbench.evidence.contract.boundary import strict_json_loads
from coldbench.evidence.contract.canonical import canonical_json
from coldbench.evidence.contract.schemas import Record, error_line

RECORDS_FILE = "records.jsonl"


class RecordsError(ValueError):
    """records.jsonl could not be read; the message names the line and the field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        super().__init__(f"{shown}{more}")


def parse_records(
    text: str | bytes, *, source: str = RECORDS_FILE
) -> tuple[list[Record], list[str]]:
    """Every valid record, and one problem per bad line: `records.jsonl line 3: field: message`.

    Blank lines are ignored (a trailing newline is normal); everything else must be a record.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            return [], [f"{source}: not UTF-8 ({error.reason} at byte {error.start})"]
    records: list[Record] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parsed = parse_record_line(line)
        if isinstance(parsed, Record):
            records.append(parsed)
        else:
            problems.append(f"{source} line {number}: {parsed}")
    return records, problems


def parse_record_line(line: str) -> Record | str:
    """One line of records.jsonl as a `Record`, or what is wrong with it (one line).

    pydantic parses and validates a line in one call; only a line it refuses goes through
    `strict_json_loads` and `Record.model_validate` again, for the message that says why
    (the same records are accepted either way: a record's floats are finite, its text
    checked, whichever parser read it)."""
    try:
        return Record.model_validate_json(line)
    except ValidationError:
        pass
    try:
        value = strict_json_loads(line)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(value, dict):
        return "expected a JSON object"
    try:
        return Record.model_validate(value)
    except ValidationError as error:
        return error_line(error, whole="record", every=True)


def read_records(path: str | Path) -> list[Record]:
    """All records of a records.jsonl file; raises `RecordsError` naming each bad line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise RecordsError([f"{path}: cannot read ({error.strerror})"]) from error
    records, problems = parse_records(raw, source=path.name)
    if problems:
        raise RecordsError(problems)
    return records


def record_line(record: Record) -> bytes:
    """One record as its canonical JSON line (with the newline)."""
    return canonical_json(record.to_json_dict()) + b"\n"


def records_bytes(records: Iterable[Record]) -> bytes:
    return b"".join(record_line(record) for record in records)
