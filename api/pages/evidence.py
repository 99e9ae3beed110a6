"""The evidence page: the bundle's report rendered again with plotly.js served by the app,
the Markdown for the PR and the download button on top.

The page is derived only from the immutable bundle (and the page templates), so it is cached
per process and served with an ETag and `Cache-Control: immutable`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from api.evidence.service import BundleView
from evidence.canonical import sha256_hex
from evidence.markdown import render_summary_md
from evidence.report import render_report_html

PLOTLY_SRC = "/static/plotly.min.js"
SCRIPT_SRC = "/static/evidence.js"


@dataclass(frozen=True)
class EvidencePage:
    html: bytes
    etag: str


@functools.lru_cache(maxsize=32)
def render_page(
    evidence_id: str, view: BundleView, page_url: str, header_html: str
) -> EvidencePage:
    """report.html for the bundle with the page's header; `header_html` holds `{markdown}`,
    where the PR Markdown goes. Cached: the same bundle and URL always render the same page."""
    markdown = render_summary_md(
        view.summary, view.provenances, evidence_id=evidence_id, page_url=page_url
    )
    html = render_report_html(
        view.summary,
        view.records,
        view.provenances,
        evidence_id,
        plotly_js_src=PLOTLY_SRC,
        file_digests=view.file_digests,
        page_header_html=header_html.replace("{markdown}", _escape(markdown)),
        page_script_src=SCRIPT_SRC,
    )
    return EvidencePage(html=html.encode("utf-8"), etag=f'"{sha256_hex(html.encode())[:32]}"')


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
