"""The evidence page `/e/{id}`: the bundle's report rendered again with plotly.js served by
the app, with the Markdown for the PR and the download buttons on top.

The page is rendered once, when the evidence is published (`render_stored_page`), and stored
as `page.html` beside the bundle: a 10,000-cell report takes seconds of CPU to render and a
request only reads and checks its bytes. The one part that depends on the request, the page's
own URL in the Markdown, is written as a placeholder named after the manifest's digest (no
host can know it while its provenance is part of that manifest) and filled in per request.
Evidence published before `page.html` existed is rendered per request (`render_page`, cached).
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass

from coldbench.api.evidence.view import BundleView
from coldbench.api.pages.templates import templates
from coldbench.evidence.contract.canonical import sha256_hex
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html

PAGE_FILE = "page.html"
PLOTLY_SRC = "/static/plotly.min.js"
SCRIPT_SRC = "/static/evidence.js"


@dataclass(frozen=True)
class EvidencePage:
    html: bytes
    etag: str


def page_url_placeholder(manifest_sha256: str) -> str:
    """What stands for the page's URL in a stored page (letters, digits and dashes: HTML
    escaping leaves it as it is)."""
    return f"coldbench-page-url-{manifest_sha256}"


def _page_html(evidence_id: str, view: BundleView, page_url: str) -> str:
    header = (
        templates()
        .get_template("_evidence_header.html")
        .render(evidence_id=evidence_id, markdown="{markdown}")
    )
    markdown = render_summary_md(
        view.summary, view.provenances, evidence_id=evidence_id, page_url=page_url
    )
    return render_report_html(
        view.summary,
        view.records,
        view.provenances,
        evidence_id,
        plotly_js_src=PLOTLY_SRC,
        file_digests=view.file_digests,
        page_header_html=header.replace("{markdown}", html.escape(markdown)),
        page_script_src=SCRIPT_SRC,
    )


def render_stored_page(evidence_id: str, view: BundleView, manifest_sha256: str) -> bytes:
    """page.html as published: the page with its URL left as the placeholder."""
    return _page_html(evidence_id, view, page_url_placeholder(manifest_sha256)).encode("utf-8")


def stored_page(
    stored: bytes, *, stored_sha256: str, manifest_sha256: str, page_url: str
) -> EvidencePage:
    """The stored page (its digest `stored_sha256` already checked) with this request's page
    URL; the ETag names both, so a page reached through another address is another entity."""
    filled = stored.replace(
        page_url_placeholder(manifest_sha256).encode(), html.escape(page_url).encode("utf-8")
    )
    etag = f'"{stored_sha256[:24]}-{sha256_hex(page_url.encode())[:8]}"'
    return EvidencePage(html=filled, etag=etag)


@functools.lru_cache(maxsize=32)
def render_page(evidence_id: str, view: BundleView, page_url: str) -> EvidencePage:
    """The page of evidence that has no stored page.html, rendered for this URL (cached: the
    same bundle and URL always render the same page)."""
    page = _page_html(evidence_id, view, page_url).encode("utf-8")
    return EvidencePage(html=page, etag=f'"{sha256_hex(page)[:32]}"')
