from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.rendering.report import plotly_js, provenance_digests, render_report_html
from tests.evidence.builders import provenance, record, simulate_run

VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}
URL_ATTRIBUTES = {"src", "href", "action", "data", "poster", "srcset", "formaction"}
EXTERNAL = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)


class Checker(HTMLParser):
    """Balanced tags, every URL attribute, text outside scripts, and each script's body."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self.tables: list[list[str]] = []

    def handle_starttag(self, tag, attrs) -> None:
        for name, value in attrs:
            if name in URL_ATTRIBUTES and value is not None:
                self.urls.append(value)
        if tag == "table":
            self.tables.append([])
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "script":
            self.scripts.append("")

    def handle_endtag(self, tag) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with {self.stack[-3:]} open")
            return
        self.stack.pop()

    def handle_data(self, data) -> None:
        if self.stack and self.stack[-1] == "script":
            self.scripts[-1] += data
        else:
            self.text.append(data)
            if self.tables and "table" in self.stack:
                self.tables[-1].append(data.strip())


@pytest.fixture(scope="module")
def ablation_job():
    spec = JobSpec.model_validate(
        {
            "mode": "ablation",
            "variants": [{"name": "cand"}],
            "contexts": [64, 256],
            "rounds": 6,
            "features": ["compile"],
        }
    )
    records = simulate_run(
        effects={"none": 1.0, "all": 1.1, "all-minus-compile": 1.0}, rounds=6, run_id="r-1"
    ) + simulate_run(
        effects={"none": 1.0, "all": 1.1, "all-minus-compile": 1.0},
        rounds=6,
        run_id="r-2",
        seed=9,
    )
    records.append(
        record(variant="all", round=6, status="invalid", reason="silent no-op: <compile> & co")
    )
    provenances = [provenance("r-1", "studio-1"), provenance("r-2", "studio-2")]
    summary = summarize(records, spec=spec, provenances=provenances, n_resamples=300)
    return summary, records, provenances


def test_report_is_balanced_html_with_no_external_url(ablation_job) -> None:
    summary, records, provenances = ablation_job
    html = render_report_html(
        summary, records, provenances, "ab" * 12, file_digests={"records.jsonl": "c" * 64}
    )
    checker = Checker()
    checker.feed(html)
    checker.close()
    assert checker.errors == [] and checker.stack == []
    assert html.startswith("<!doctype html>")
    assert [u for u in checker.urls if EXTERNAL.match(u)] == []
    outside_scripts = "".join(checker.text)
    assert "http://" not in outside_scripts and "https://" not in outside_scripts
    plotly_bodies = [s for s in checker.scripts if len(s) > 1_000_000]
    assert len(plotly_bodies) == 1  # plotly.js inlined once
    for script in checker.scripts:
        if script not in plotly_bodies:
            assert "http://" not in script and "https://" not in script
    assert "<style>" in html and "@import" not in html


def test_tables_carry_the_numbers_without_javascript(ablation_job) -> None:
    summary, records, provenances = ablation_job
    html = render_report_html(summary, records, provenances, None)
    checker = Checker()
    checker.feed(html)
    cells = [cell for table in checker.tables for cell in table if cell]
    comparison = summary.comparisons[0]
    assert comparison.verdict in cells
    low, high = comparison.ci_low, comparison.ci_high
    assert f"{comparison.ratio_median:.3f} [{low:.3f}, {high:.3f}]" in cells
    assert "silent no-op: <compile> & co" in cells  # escaped in the source, intact as text
    assert "silent no-op: <compile>" not in html
    assert "compile" in cells and "all-minus-compile" in cells  # ablation table
    assert "studio-2" in cells  # reproductions side by side
    assert provenances[0].model.weights_sha256 in cells  # provenance digests
    assert "How to read this" in "".join(checker.text)
    assert provenances[0].command in "".join(checker.text)


def test_plotly_can_be_served_from_a_static_url(ablation_job) -> None:
    summary, records, provenances = ablation_job
    html = render_report_html(
        summary, records, provenances, None, plotly_js_src="/static/plotly.min.js"
    )
    assert '<script src="/static/plotly.min.js"></script>' in html
    assert len(html) < 500_000 < len(plotly_js())


def test_provenance_digests_are_found_by_path() -> None:
    document = provenance().model_dump(mode="json", by_alias=True)
    names = dict(provenance_digests(document))
    assert "model.weights_sha256" in names and "targets[0].build_log_sha256" in names
    assert "job_spec_sha256" in names


@pytest.mark.browser
def test_report_draws_its_charts_offline_in_chromium(ablation_job, tmp_path) -> None:
    from playwright.sync_api import sync_playwright

    summary, records, provenances = ablation_job
    page_path = tmp_path / "report.html"
    page_path.write_text(render_report_html(summary, records, provenances, None))
    requested: list[str] = []
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        try:
            page = browser.new_page()
            page.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith("file://")
                    else (requested.append(route.request.url), route.abort())
                ),
            )
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on(
                "console",
                lambda message: problems.append(message.text) if message.type == "error" else None,
            )
            page.goto(page_path.as_uri())
            page.wait_for_function("document.querySelectorAll('.chart .main-svg').length >= 5")
            drawn = page.eval_on_selector_all(
                ".chart", "charts => charts.map(c => c.querySelectorAll('.main-svg').length > 0)"
            )
        finally:
            browser.close()
    assert requested == [] and problems == []
    assert drawn == [True] * 5  # tok/s, ratio, strips, drift, ablation


def test_the_answer_comes_first_and_how_to_read_after_the_verdict_tables(ablation_job) -> None:
    from coldbench.evidence.rendering.markdown import answer_sentences

    summary, records, provenances = ablation_job
    html = render_report_html(summary, records, provenances, None)
    body = html[html.index("<body>") :]
    # An ablation answers in one sentence over its leave-one-out table, which comes next.
    (sentence,) = answer_sentences(summary)
    assert sentence.startswith("Leave one out, all features against all but one: ")
    answer = body.index('<section id="answer">')
    assert body.index(sentence) > answer
    leave_one_out = body.index('<section id="ablation">')
    assert answer < leave_one_out < body.index("Cold prefill: verdicts") < body.index("Charts")
    # What was compared stands above the answer; what undercuts it right below.
    assert body.index('id="compared"') < answer < body.index('id="caveats"') < leave_one_out
    assert answer < body.index("Cold prefill: verdicts") < body.index("How to read this")
    assert body.index("Decode: verdicts") < body.index("How to read this")
    # Hosts are named by their names, not a shared machine hostname.
    assert body.index("<h1>") < answer


def test_hosts_sharing_a_hostname_are_told_apart_by_their_registered_names() -> None:
    from coldbench.evidence.rendering.markdown import host_line

    records = simulate_run(effects={"base": 1.0, "fast": 1.1}, rounds=6, run_id="r-1")
    records += simulate_run(effects={"base": 1.0, "fast": 1.1}, rounds=6, run_id="r-2", seed=4)
    first, second = provenance("r-1", "vm"), provenance("r-2", "vm")
    first.host.registered_name, second.host.registered_name = "rack-a", "rack-b"
    summary = summarize(records, baseline="base", provenances=[first, second], n_resamples=50)
    hosts = [run.host for run in summary.reproductions.comparisons[0].runs]
    assert hosts == ["rack-a", "rack-b"]
    assert host_line(first).startswith("rack-a (hostname `vm`, run `r-1`)")
    assert "device" not in host_line(first)
    # The cards their processes reported when ready tell the machines apart too (two H100s
    # of one cloud image, both `vm`, 2026-12-07).
    for run, uuid in ((first, "GPU-c9dfc996-0d03"), (second, "GPU-6c79a0b4-a626")):
        run.targets[0].ready = {"device": {"uuid": uuid, "name": "NVIDIA H100 80GB HBM3"}}
        run.targets[-1].ready = {"device": {"uuid": uuid}}
    assert host_line(first).endswith(", device GPU-c9dfc996")
    assert host_line(second).endswith(", device GPU-6c79a0b4")
    html = render_report_html(summary, records, [first, second], None)
    assert "<th>rack-a</th><th>rack-b</th>" in html
    # Without registered names, a shared hostname still gives two distinct columns.
    unnamed = summarize(
        records, baseline="base", provenances=[provenance("r-1", "vm"), provenance("r-2", "vm")]
    )
    hosts = [run.host for run in unnamed.reproductions.comparisons[0].runs]
    assert hosts == ["vm (run r-1)", "vm (run r-2)"]


def test_context_axes_are_logarithmic(ablation_job) -> None:
    """4K..128K contexts spread evenly instead of bunching at the left."""
    from coldbench.evidence.rendering.report import build_figures

    summary, records, _ = ablation_job
    figures = {figure["id"]: figure["spec"] for figure in build_figures(summary, records)}
    for figure_id in ("fig-tps", "fig-ratio"):
        axis = figures[figure_id]["layout"]["xaxis"]
        assert axis["type"] == "log" and axis["title"]["text"] == "context tokens", figure_id
