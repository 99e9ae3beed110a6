"""The Jinja2 environment over `web/templates`, with filters for times, sizes and flags."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from starlette.templating import Jinja2Templates

from coldbench.evidence.contract.protocol import RunState
from coldbench.evidence.contract.spec_text import flags_text


def web_dir() -> Path:
    """The installed `web` package folder (templates/ and static/ live in it)."""
    return Path(str(resources.files("coldbench.web")))


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "never"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_ago(value: datetime | None, now: datetime | None = None) -> str:
    """`12 s ago`, `5 min ago`, `3 h ago`, `2 d ago`."""
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def fmt_duration(seconds: float | None) -> str:
    """`45 s`, `3 min 12 s`, `2 h 5 min`."""
    if seconds is None:
        return "n/a"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def run_label(state: str) -> str:
    """A run's state in the jobs' words (coldbench.evidence.contract.protocol.RunState.label)."""
    try:
        return RunState(state).label
    except ValueError:
        return state


def fmt_bytes(value: int | None) -> str:
    if not value:
        return "n/a"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"


@functools.cache
def templates() -> Jinja2Templates:
    env_templates = Jinja2Templates(directory=str(web_dir() / "templates"))
    env = env_templates.env
    env.filters["time"] = fmt_time
    env.filters["ago"] = fmt_ago
    env.filters["bytes"] = fmt_bytes
    env.filters["duration"] = fmt_duration
    env.filters["run_label"] = run_label
    # `clear_cache=false`, as the submitter writes it (evidence/contract/spec_text.py)
    env.filters["flags"] = flags_text
    env.trim_blocks = True
    env.lstrip_blocks = True
    return env_templates
