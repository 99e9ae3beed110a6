"""Host-supplied text in summary.md and report.html makes no structure: one test per field.

Each field is rendered once with a plain value and once with a hostile one (a heading, a list
item, a link, an image, emphasis, code, a table cell break, math, raw HTML, on several lines);
summary.md is parsed by a CommonMark parser with GitHub's tables and strikethrough
(markdown-it-py), and the hostile document must have exactly the plain one's structure, with
the hostile text shown as text. The stored values bypass validation (`model_copy`): what the
boundary types refuse today may have been stored before.
"""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import CorpusInfo, JobSpec, Provenance
from coldbench.evidence.rendering.escaping import escape_html, md_code, md_fence, md_text, one_line
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html
from tests.evidence.builders import provenance, record, simulate_run

HOSTILE = (
    "x\n# Heading\n- [link](https://evil.example) ![i](https://evil.example/i.png) **bold** "
    "_em_ `code` ``` | cell ~~gone~~ $m$ <b id=injected>tag</b> &amp; \\\r\u2028\u202e\x00end"
)
_MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _types(tokens: list[Token]) -> Counter[str]:
    found: Counter[str] = Counter()
    for token in tokens:
        found[token.type] += 1
        if token.children:
            found += _types(token.children)
    return found


def _shown(tokens: list[Token]) -> str:
    """The text a reader sees: text and code content, in order."""
    parts = []
    for token in tokens:
        if token.type in ("text", "code_inline", "fence"):
            parts.append(token.content)
        if token.children:
            parts.append(_shown(token.children))
    return " ".join(parts)


@pytest.fixture(scope="module")
def job() -> tuple[Any, list[Any]]:
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=4, seed=2, run_id="r-1")
    spec = JobSpec.model_validate(
        {"variants": [{"name": "base"}, {"name": "fast"}], "contexts": [64, 256], "rounds": 4}
    )
    return spec, records


def _provenance(**host: Any) -> Provenance:
    made = provenance("r-1", "studio-1")
    return made.model_copy(
        update={
            "host": made.host.model_copy(update={"registered_name": "studio-1", **host}),
            "corpus": CorpusInfo(name="code", sha256="c" * 64, source="host"),
        }
    )


def _hostile(base: Provenance, path: str, value: str) -> Provenance:
    """`base` with the field at `path` (`host.chip`, `targets.0.ref`, `command`) set."""
    first, _, rest = path.partition(".")
    if not rest:
        return base.model_copy(update={first: value})
    if first == "targets":
        index, _, field = rest.partition(".")
        targets = list(base.targets)
        target = targets[int(index)]
        if field.startswith("software."):
            software = {"mlx": "0.32.4", "files": {"mlx_lm": "/x/mlx_lm/__init__.py"}}
            key = field.split(".", 1)[1]
            if key == "files":
                software["files"] = {"mlx_lm": value}
            else:
                software[key] = value
            targets[int(index)] = target.model_copy(update={"software": software})
        elif field == "flags":
            targets[int(index)] = target.model_copy(update={"flags": {"kv_bits": value}})
        else:
            targets[int(index)] = target.model_copy(update={field: value})
        return base.model_copy(update={"targets": targets})
    part = getattr(base, first)
    return base.model_copy(update={first: part.model_copy(update={rest: value})})


PROVENANCE_FIELDS = [
    "host.registered_name",
    "host.hostname",
    "host.machine_model",
    "host.chip",
    "host.gpu",
    "host.os",
    "host.power_source",
    "host.thermal_state",
    "software.python",
    "software.mlx",
    "software.mlx_lm",
    "software.coldbench",
    "targets.0.repository",
    "targets.0.ref",
    "targets.0.commit",
    "targets.0.flags",
    "targets.0.software.mlx",
    "targets.0.software.files",
    "model.name",
    "corpus.name",
    "corpus.prompt_version",
    "command",
    "run_id",
]


@pytest.mark.parametrize("path", PROVENANCE_FIELDS)
def test_a_provenance_field_makes_no_markdown_structure(job, path: str) -> None:
    spec, records = job
    summary = summarize(records, spec=spec, provenances=[_provenance()])
    plain = _MARKDOWN.parse(render_summary_md(summary, [_hostile(_provenance(), path, "plain")]))
    text = render_summary_md(summary, [_hostile(_provenance(), path, HOSTILE)])
    hostile = _MARKDOWN.parse(text)
    assert _types(hostile) == _types(plain)
    assert "<b" not in text  # raw HTML never reaches the document
    shown = _shown(hostile)
    # Shown as the value itself, on one line (in a code span `&lt;` stays as typed; a commit
    # shows its first 12 characters).
    expected = one_line(HOSTILE)[: 12 if path == "targets.0.commit" else None]
    assert expected.split("<b")[0] in shown or escape_html(expected) in shown


def test_a_cell_reason_makes_no_markdown_structure(job) -> None:
    spec, records = job

    def rendered(reason: str) -> str:
        bad = record(
            variant="fast", round=4, status="error", prefill_s=None, prefill_tps=None, reason="r"
        )
        bad = bad.model_copy(update={"reason": reason})
        summary = summarize([*records, bad], spec=spec, provenances=[_provenance()])
        return render_summary_md(summary, [_provenance()])

    text = rendered(HOSTILE)
    assert _types(_MARKDOWN.parse(text)) == _types(_MARKDOWN.parse(rendered("plain")))
    assert one_line(HOSTILE).split("<b")[0] in _shown(_MARKDOWN.parse(text))


def test_history_subjects_and_skip_reasons_make_no_markdown_structure() -> None:
    names = ["ref", "c1", "c2", "c3"]
    spec = JobSpec.model_validate(
        {
            "mode": "history",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": n * 4} for n in names],
            "contexts": [64],
            "rounds": 8,
            "history": {"range": "v1..main"},
        }
    )
    records = simulate_run(
        effects={"ref": 1.0, "c1": 1.0, "c2": 0.9}, contexts=(64,), rounds=8, noise=0.01, seed=5
    )

    def rendered(text: str) -> str:
        measured = provenance()
        measured = measured.model_copy(
            update={
                "targets": [
                    measured.targets[0].model_copy(
                        update={
                            "variant": n,
                            "commit": (n * 40)[:40],
                            "subject": text,
                            "skipped": text if n == "c3" else None,
                        }
                    )
                    for n in names
                ]
            }
        )
        summary = summarize(records, spec=spec, provenances=[measured], n_resamples=200)
        assert summary.history is not None and summary.history.steps
        return render_summary_md(summary, [measured])

    text = rendered(HOSTILE)
    assert _types(_MARKDOWN.parse(text)) == _types(_MARKDOWN.parse(rendered("plain")))


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attributes: list[tuple[str, str | None]] = []
        self.tags: Counter[str] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.attributes += attrs


@pytest.mark.parametrize("path", PROVENANCE_FIELDS)
def test_a_provenance_field_makes_no_html_in_the_report(job, path: str) -> None:
    spec, records = job
    summary = summarize(records, spec=spec, provenances=[_provenance()])

    def elements(value: str) -> _Elements:
        parser = _Elements()
        parser.feed(
            render_report_html(summary, records, [_hostile(_provenance(), path, value)], None)
        )
        return parser

    hostile, plain = elements(HOSTILE), elements("plain")
    assert ("id", "injected") not in hostile.attributes
    assert hostile.tags == plain.tags


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("a_b_c", "a_b_c"),
        ("_a_", "\\_a\\_"),
        ("[x](y)", "\\[x\\](y)"),
        ("a|b", "a\\|b"),
        ("line\nnext\tend", "line next end"),
        ("nul\x00", "nul "),
    ],
)
def test_md_text(value: str, shown: str) -> None:
    assert md_text(value) == shown


def test_md_code_and_md_fence_hold_any_backticks() -> None:
    assert md_code("a") == "`a`"
    assert md_code("a``b") == "```a``b```"
    assert md_code("`x") == "`` `x ``"
    assert md_code("") == ""
    block = md_fence(["echo ```", "two\nlines"], "sh")
    assert block == ["````sh", "echo ```", "two lines", "````"]
    tokens = _MARKDOWN.parse("\n".join(block))
    assert [t.type for t in tokens] == ["fence"] and tokens[0].content == "echo ```\ntwo lines\n"
