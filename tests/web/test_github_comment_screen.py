"""The pull-request comment as a reader sees it: the service's own comment for a finished A/B
(evidence published from simulated records, as tests/web/test_evidence_screens.py does),
rendered from its Markdown by markdown-it-py (CommonMark with GitHub's tables and raw HTML,
as GitHub renders a comment) and drawn by headless Chromium at a PR column's width.

The screenshot lands in tests/_artifacts/github-comment.png; docs/img/ holds a copy
(docs/WEB.md says how to repeat it).
"""

# The fixtures of tests/web/test_evidence_screens.py are imported, and named again as
# test arguments.
# ruff: noqa: F811

from __future__ import annotations

import html
import re

import pytest
import sqlalchemy as sa
from markdown_it import MarkdownIt
from playwright.sync_api import Browser

from coldbench.api.github import answer
from coldbench.api.github.comment import JobView, render_comment
from coldbench.api.github.config import GitHubConfig
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Run
from coldbench.evidence.contract.protocol import JobState
from tests.web.test_evidence_screens import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    Served,
    _ab,
    _in_view,
    _publish,
    browser,
    served,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# About the width of a comment in a pull request's conversation on github.com.
COLUMN = {"width": 860, "height": 760}
_STYLE = """
body { margin: 0; background: #fff; font: 14px/1.5 -apple-system, "Segoe UI", "Noto Sans",
  Helvetica, Arial, sans-serif; color: #1f2328; }
.comment { margin: 16px; border: 1px solid #d1d9e0; border-radius: 6px; }
.head { background: #f6f8fa; border-bottom: 1px solid #d1d9e0; padding: 8px 16px;
  color: #59636e; }
.body { padding: 8px 16px; overflow-x: auto; }
code { background: #eff1f3; border-radius: 6px; padding: .2em .4em; font-size: 85%; }
pre { background: #f6f8fa; border-radius: 6px; padding: 16px; overflow: auto; }
pre code { background: none; padding: 0; }
blockquote { margin: 0; padding: 0 1em; color: #59636e; border-left: .25em solid #d1d9e0; }
table { border-collapse: collapse; display: block; overflow: auto; }
th, td { border: 1px solid #d1d9e0; padding: 6px 13px; }
tr:nth-child(2n) { background: #f6f8fa; }
"""


def _github_html(markdown: str, author: str) -> str:
    renderer = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    body = renderer.render(markdown)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{_STYLE}</style></head>"
        f"<body><div class='comment'><div class='head'><b>{html.escape(author)}</b> "
        f"commented</div><div class='body'>{body}</div></div></body></html>"
    )


def test_the_pull_request_comment_leads_with_the_verdict_and_where_it_ran(
    browser: Browser, served: Served
) -> None:
    evidence_id = _publish(served, _ab())
    config = GitHubConfig(service_url="https://bench.example.org")
    with served.session() as db_session:
        job = db_session.scalars(sa.select(Job).where(Job.evidence_id == evidence_id)).one()
        studio = db_session.scalars(sa.select(Host).where(Host.name == "studio-1")).one()
        # As the evidence's provenance has it (tests/evidence/builders.py).
        studio.fingerprint = {
            **studio.fingerprint,
            "machine_model": "Mac15,14",
            "chip": "Apple M3 Ultra",
            "cores": 32,
            "memory_bytes": 192 * 2**30,
        }
        for run in db_session.scalars(sa.select(Run).where(Run.job_id == job.id)):
            run.host_id = studio.id
        db_session.commit()
        view = JobView(
            job_id=job.id,
            state=JobState.DONE,
            base_sha="a" * 40,
            head_sha="b" * 40,
            asked_by="@maintainer",
            command="/coldbench ab contexts=512,4K rounds=8",
            job_url=config.link(f"/jobs/{job.id}"),
            evidence_markdown=answer.evidence_markdown(
                db_session,
                job,
                served.app.state.store,
                config,  # type: ignore[attr-defined]
            ),
            hosts=answer.hosts_text(db_session, job.id),
        )
    body = render_comment(job=view, head_sha="b" * 40, notice=None)
    page = browser.new_page(viewport=COLUMN)
    try:
        page.set_content(_github_html(body, "coldbench"))
        text = page.locator(".body").inner_text()
        first = page.locator(".body p").first
        # Its first line: what was asked, by whom, on which commits and where it ran.
        assert "asked by @maintainer" in first.inner_text()
        assert "on studio-1 (Mac15,14, Apple M3 Ultra, 32 cores, 192 GiB)" in first.inner_text()
        # The verdict sentences and the table on the same first screen.
        assert _in_view(page, ".body p") and _in_view(page, ".body table")
        assert re.search(r"cand is \d+\.\d% slower", text), text[:400]
        assert f"Evidence id: {evidence_id}" in text
        # No host path, no raw entity shown as text.
        assert not re.search(r"(?<![\w:/])/(?:tmp|private|home|Users)/", text)
        assert "&gt;" not in text and "&lt;" not in text
        page.screenshot(path=str(ARTIFACTS / "github-comment.png"))
    finally:
        page.close()
