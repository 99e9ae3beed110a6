"""What a pull-request comment asks for: `/coldbench [MODE] [key=value ...]`, one line.

The line's words are split here into a mode and `name=text` options; the options are those
of the one job-spec builder (`coldbench.evidence.spec.job_options`, shared with `coldbench run`,
`submit` and the form), which reads every value, and the job is checked like any submission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import get_args

from coldbench.evidence.contract.schemas import Mode
from coldbench.evidence.spec.job_options import SET_BY_THE_PULL_REQUEST, service_options

PREFIX = "/coldbench"
# The modes a pull request can ask for (each must also be a mode of this service's JobSpec:
# `commits` is accepted once it is).
PULL_REQUEST_MODES = ("ab", "ablation", "sweep", "commits")
# The builder's options a request may give: a service's, but for what the service sets (the
# repository, adapter and variants: the pull request's commits) and the refs of modes that
# need them (the modes offered need no range; commits' base and head are the PR's).
OPTIONS = tuple(
    sorted(
        (
            name
            for name in service_options()
            if name not in (*SET_BY_THE_PULL_REQUEST, "base", "head")
        ),
        # the answer to a mistake lists the options asked most first, the mode (the command's
        # first word) last
        key=lambda name: {"contexts": 0, "rounds": 1, "mode": 3}.get(name, 2),
    )
)
MAX_LINE_CHARS = 500
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
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
    # `head=SHA`: the head commit the asker reviewed (7 to 40 hex digits); it runs only if it
    # is still the pull request's head.
    head_sha: str | None = None


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
        if key in options or (key == "mode" and mode is not None):
            raise CommandError(f"option `{key}` given twice")
        options[key] = value
    if mode is not None:
        options["mode"] = mode
    return ask_of(options)


def ask_of(options: dict[str, str]) -> Ask:
    """A request from its options' text (`mode` among them), as the comment, `coldbench submit
    --pr` and the form give them; CommandError naming the first unknown option or mode."""
    unknown = [key for key in options if key not in (*OPTIONS, "head")]
    if unknown:
        names = ", ".join((*OPTIONS, "head"))
        raise CommandError(f"unknown option `{_shown(unknown[0])}`; options: {names}")
    given = dict(options)
    mode = given.pop("mode", None)
    if mode is not None and mode not in available_modes():
        raise CommandError(f"unknown mode `{_shown(mode)}`; modes: {', '.join(available_modes())}")
    head = given.pop("head", None)
    if head is not None and not _SHA.fullmatch(head):
        raise CommandError(f"head: `{_shown(head)}` is not a commit sha (7 to 40 hex digits)")
    return Ask(mode=mode, options=given, head_sha=head)


def _shown(text: str) -> str:
    """Submitter text quoted back in a reply: short and without backticks."""
    return text[:40].replace("`", "'")
