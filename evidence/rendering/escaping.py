"""Text from hosts and submitters made safe for the Markdown and HTML it is shown in.

A host writes its fingerprint, provenance (chip, OS, versions, file paths, commit subjects),
cell reasons and the command that reproduces a run; a submitter writes variant names and flag
values. None of it may make structure where it is shown: a heading, a list item, a link, a
table cell, an image, an HTML tag. Every renderer of such text goes through this module:

- `md_text(value)`: inline Markdown text on one line; it reads as the value itself.
- `md_code(value)`: an inline code span holding the value verbatim, whatever backticks it has.
- `md_fence(lines, info)`: a fenced code block no line of the content can close.
- `escape_html(document)`: `&`, `<` and `>` as entities, applied to a whole Markdown document
  once it is assembled (raw HTML passes through Markdown renderers otherwise).

Line breaks and other control and format characters (NUL, CR, LF, tabs, bidirectional
overrides, line and paragraph separators) become one space in all of them: the boundary types
(`evidence/contract/boundary.py`) already refuse them in what is stored; this keeps what was stored
before, or comes from elsewhere, on its line.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_BREAKING_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Markdown punctuation that opens or closes inline structure anywhere in a line: emphasis and
# strikethrough, code, links and images, table cells, math on GitHub, and the escape itself.
_INLINE_SPECIALS = re.compile(r"([\\`*\[\]|~$])")
# An underscore opens or closes emphasis only at a word's edge (`a_b_c` never does).
_EDGE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_BACKTICKS = re.compile(r"`+")


def one_line(value: object) -> str:
    """`value` as text with every control, format and line-separating character a space."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        " " if unicodedata.category(char) in _BREAKING_CATEGORIES else char for char in text
    )


def md_text(value: object) -> str:
    """`value` as inline Markdown that renders as exactly this text, on one line: for the
    inside of a line (after a bullet, a label, in a table cell), never its start."""
    text = _INLINE_SPECIALS.sub(r"\\\1", one_line(value))
    return _EDGE_UNDERSCORE.sub(r"\\_", text)


def md_code(value: object) -> str:
    """`value` as an inline code span: delimited by one backtick more than its longest run of
    backticks, padded with a space where it starts or ends with a backtick or a space (which
    a code span strips). Empty text gives an empty string."""
    text = one_line(value)
    if not text:
        return ""
    fence = "`" * (1 + max((len(run) for run in _BACKTICKS.findall(text)), default=0))
    if text[0] in "` " or text[-1] in "` ":
        text = f" {text} "
    return f"{fence}{text}{fence}"


def md_fence(lines: Iterable[object], info: str = "") -> list[str]:
    """A fenced code block of `lines` (each kept on its line), fenced with more backticks than
    any line holds in a row, so no line closes it."""
    body = [one_line(line) for line in lines]
    longest = max((len(run) for line in body for run in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


def escape_html(text: str) -> str:
    """`&`, `<` and `>` as entities: Markdown renderers pass raw HTML through otherwise."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
