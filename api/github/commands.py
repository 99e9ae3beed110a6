"""What a pull-request comment asks for: `/coldbench [MODE] [key=value ...]`, one line.

The line's words are split here; every value is read by the job-spec text parsers of
`evidence.spec_text` (the ones `coldbench run`, `submit` and the form use), and the job spec
is validated by the same checks as any submission (`api.jobs.service.checked_spec`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

from evidence.schemas import Mode
from evidence.spec_text import parse_contexts, split_list

PREFIX = "/coldbench"
# The modes a pull request can ask for (each must also be a mode of this service's JobSpec:
# `commits` is accepted once it is).
PULL_REQUEST_MODES = ("ab", "ablation", "sweep", "commits")
OPTIONS = ("contexts", "rounds", "model", "labels", "features", "mode")
MAX_LINE_CHARS = 500
_COMMAND_LINE = re.compile(rf"^[ \t]*{re.escape(PREFIX)}(?:[ \t]+(.*))?$", re.MULTILINE)


class CommandError(ValueError):
    """A `/coldbench` line that cannot be read; the message says what to write instead."""


def available_modes() -> tuple[str, ...]:
    modes = set(get_args(Mode))
    return tuple(mode for mode in PULL_REQUEST_MODES if mode in modes)


@dataclass(frozen=True)
class Ask:
    """A request as typed: the mode (None: the repository's default) and the options' text."""

    mode: str | None = None
    options: dict[str, str] = field(default_factory=dict)


def find_command(body: str) -> str | None:
    """The text after the first `/coldbench` at the start of a line (quoted lines, `> ...`,
    are someone else's words and do not count); None when the comment asks nothing."""
    match = _COMMAND_LINE.search(body.replace("\r\n", "\n").replace("\r", "\n"))
    if match is None:
        return None
    return (match.group(1) or "").strip()


def parse_command(text: str) -> Ask:
    """`ablation features=compile contexts=4K,16K` -> Ask; CommandError in one line."""
    if len(text) > MAX_LINE_CHARS:
        raise CommandError(f"the /coldbench line is longer than {MAX_LINE_CHARS} characters")
    words = text.split()
    mode: str | None = None
    if words and "=" not in words[0]:
        mode = words.pop(0)
    options: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise CommandError(f"`{_shown(word)}`: write options as key=value, e.g. rounds=12")
        if key not in OPTIONS:
            raise CommandError(f"unknown option `{_shown(key)}`; options: {', '.join(OPTIONS)}")
        if key in options or (key == "mode" and mode is not None):
            raise CommandError(f"option `{key}` given twice")
        options[key] = value
    mode = options.pop("mode", mode)
    if mode is not None and mode not in available_modes():
        raise CommandError(f"unknown mode `{_shown(mode)}`; modes: {', '.join(available_modes())}")
    return Ask(mode=mode, options=options)


def _shown(text: str) -> str:
    """Submitter text quoted back in a reply: short and without backticks."""
    return text[:40].replace("`", "'")


def option_fields(options: dict[str, str]) -> dict[str, Any]:
    """JobSpec fields of the options' text (contexts, rounds, model, labels, features)."""
    fields: dict[str, Any] = {}
    try:
        if "contexts" in options:
            fields["contexts"] = parse_contexts(options["contexts"])
        if "rounds" in options:
            if not re.fullmatch(r"[0-9]{1,6}", options["rounds"]):
                raise ValueError(f"rounds={_shown(options['rounds'])} is not a whole number")
            fields["rounds"] = int(options["rounds"])
    except ValueError as error:
        raise CommandError(str(error)) from None
    if "model" in options:
        fields["model"] = options["model"]
    if "labels" in options:
        fields["host_labels"] = split_list(options["labels"])
    if "features" in options:
        fields["features"] = split_list(options["features"])
    return fields
