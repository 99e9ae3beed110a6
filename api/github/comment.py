"""The one comment the service keeps on a pull request, as Markdown it wrote itself.

A hidden marker names it; it opens with where the latest job stands (and, once done, the
evidence's own PR Markdown: the verdict sentences, the table, the evidence link, the
reproduce command), says when the pull request's head has moved past the measured commit, and
shows the reply to the last request that started nothing. Text that came from GitHub or a
host is escaped: no HTML of theirs reaches the page that renders the comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.rendering.escaping import escape_html, md_code, md_text

MARKER = "<!-- coldbench:pull-request -->"
# GitHub refuses comment bodies above 65,536 characters; the evidence Markdown stays below
# 60,000 (evidence/rendering/markdown.py) and the rest of the comment is short.
MAX_COMMENT_CHARS = 65_000
# U+2060 WORD JOINER: invisible, and no mention (`@login`, `@org/team`), email or autolink
# (`https://`, `www.`) survives one after its `@`, `:` or `www`.
_JOINER = "\u2060"
_LIVE = re.compile(r"(@)(?=[A-Za-z0-9])|(:)(?=//)|(?<![A-Za-z0-9])(www)(?=\.)", re.IGNORECASE)
# A notice starts by naming its asker (a mention meant to notify them); the rest is quoted.
_ASKER = re.compile(r"^(@[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?: )(.*)$", re.DOTALL)


# A host's absolute path (two segments or more) where a path starts: a line's or a word's start,
# after `=`, a quote or a backtick; never inside a URL or a link target.
_HOST_PATH = re.compile(
    r"(?:(?<=^)|(?<=[\s=`'\"]))(?:~|/[^\s/`'\"]+)(?:/[^\s/`'\"]+)+/?", re.MULTILINE
)


def without_host_paths(markdown: str) -> str:
    """The evidence's Markdown for a public pull request: each of a host's filesystem paths
    (the reproduce line's `--repo`, a worktree, an engine's files) shown by its last name; the
    paths stay on the evidence page and in the bundle."""
    return _HOST_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], markdown)


_MENTION = re.compile(r"@(?=[A-Za-z0-9])")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


def without_mentions(markdown: str) -> str:
    """Markdown that notifies nobody: outside code (where GitHub makes no mention anyway, and
    a command must copy as written), each `@name` and `@org/team` gets a word joiner. The
    evidence quotes hosts and commit subjects, which a fork's contributor writes."""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or line.lstrip().startswith("```"):
            lines.append(line)
            continue
        pieces, last = [], 0
        for span in _CODE_SPAN.finditer(line):
            pieces += [_MENTION.sub("@" + _JOINER, line[last : span.start()]), span.group(0)]
            last = span.end()
        pieces.append(_MENTION.sub("@" + _JOINER, line[last:]))
        lines.append("".join(pieces))
    return "\n".join(lines)


def inert(text: str) -> str:
    """`text` as GitHub shows it, without the mentions, team mentions and links GitHub would
    make of it: text quoted back from a request notifies nobody and links nowhere."""
    return _LIVE.sub(lambda m: (m.group(1) or m.group(2) or m.group(3)) + _JOINER, text)


def notice_line(notice: str) -> str:
    """The reply to a request as a quote: the asker named (and notified), the rest inert and
    escaped; the quote marker itself is Markdown, never an entity."""
    found = _ASKER.match(notice)
    asker, rest = (found.group(1), found.group(2)) if found else ("", notice)
    return "> " + escape_html(md_text(asker) + inert(md_text(rest)))


@dataclass(frozen=True)
class JobView:
    """What the comment says of one job asked for on the pull request."""

    job_id: str
    state: str
    base_sha: str
    head_sha: str
    asked_by: str
    command: str
    job_url: str
    reason: str | None = None
    # The evidence's PR Markdown, with its id linked to its page (once the job is done).
    evidence_markdown: str | None = None
    # Where it ran (host names and machines), shown on the comment's first line.
    hosts: str | None = None


def short(sha: str) -> str:
    return sha[:10]


def job_lines(job: JobView) -> list[str]:
    """The lines about one job; its evidence Markdown (already escaped) comes after them."""
    head, base = md_code(short(job.head_sha)), md_code(short(job.base_sha))
    asked = (
        f"{md_code(job.command)} asked by {md_text(job.asked_by)}: head {head} against base {base}"
    )
    if job.hosts:
        asked += f" on {inert(md_text(job.hosts))}"
    link = f"[job {md_code(job.job_id)}]({job.job_url})"
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        why = f": {inert(md_text(job.reason))}" if job.reason else ""
        return [escape_html(f"**{job.state}**: {asked}, {link}{why}")]
    if job.state == JobState.DONE and job.evidence_markdown:
        return [escape_html(f"{asked}, {link}."), "", job.evidence_markdown]
    return [
        escape_html(f"**{job.state}**: {asked}, {link}. This comment is edited when it is done.")
    ]


def render_comment(
    *,
    job: JobView | None,
    head_sha: str | None,
    notice: str | None,
    evidence: JobView | None = None,
) -> str:
    """The comment's whole body: the latest job, and, when that one has no evidence (queued,
    running, failed, cancelled), the evidence of the latest job that has (`evidence`) after
    it: a later job cancelled never hides evidence already there."""
    lines = [MARKER]
    if job is not None and head_sha and head_sha != job.head_sha:
        lines += [
            "",
            f"> **This evidence is for an older head** (`{short(job.head_sha)}`); the pull "
            f"request's head is now `{short(head_sha)}`. Comment `/coldbench` to measure it.",
        ]
    if notice:
        lines += ["", notice_line(notice)]
    if job is not None:
        lines += ["", *job_lines(job)]
    if job is not None and evidence is not None and evidence.job_id != job.job_id:
        lines += ["", "Evidence of the job before it:", "", *job_lines(evidence)]
    elif job is None and not notice:
        lines += ["", "No coldbench job for this pull request yet: comment `/coldbench ab`."]
    body = "\n".join(lines) + "\n"
    if len(body) > MAX_COMMENT_CHARS:
        cut = "\n\n(cut: the full Markdown is on the evidence page)\n"
        body = body[: MAX_COMMENT_CHARS - len(cut)] + cut
    return body
