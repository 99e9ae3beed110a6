"""The evidence page: the bundle's report rendered again with plotly.js served by the app,
the Markdown for the PR and the download button on top.

The page is derived only from the immutable bundle (and the page templates), so it is cached
per process and served with an ETag and `Cache-Control: immutable`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from evidence.bundle import bundle_records, provenances_of, read_zip
from evidence.canonical import sha256_hex
from evidence.markdown import render_summary_md
from evidence.report import render_report_html
from evidence.summary_schema import Summary

PLOTLY_SRC = "/static/plotly.min.js"
SCRIPT_SRC = "/static/evidence.js"


@dataclass(frozen=True)
class EvidencePage:
    html: bytes
    etag: str


def pr_markdown(summary_md: str, evidence_id: str, page_url: str) -> str:
    """summary.md with the evidence id linked to its page (a reviewer clicks through)."""
    line = f"Evidence id: `{evidence_id}`"
    return summary_md.replace(line, f"Evidence id: [`{evidence_id}`]({page_url})", 1)


@functools.lru_cache(maxsize=32)
def render_page(
    evidence_id: str,
    bundle_sha256: str,
    read: Callable[[str], bytes],
    page_url: str,
    header_html: str,
) -> EvidencePage:
    """report.html for the bundle with the page's header; `header_html` holds `{markdown}`.

    Cached by the bundle's digest (and the store's `read`): the same key always renders the
    same page.
    """
    files = read_zip(read(bundle_sha256))
    # A summary that does not match the contract raises pydantic's ValidationError (a
    # ValueError): the router then serves the bundle's own report.html instead.
    summary = Summary.model_validate_json(files["summary.json"])
    provenances = provenances_of(json.loads(files["provenance.json"]))
    manifest = json.loads(files["manifest.json"])
    markdown = pr_markdown(
        render_summary_md(summary, provenances, evidence_id=evidence_id), evidence_id, page_url
    )
    html = render_report_html(
        summary,
        bundle_records(files),
        provenances,
        evidence_id,
        plotly_js_src=PLOTLY_SRC,
        file_digests={name: entry["sha256"] for name, entry in manifest["files"].items()},
        page_header_html=header_html.replace("{markdown}", _escape(markdown)),
        page_script_src=SCRIPT_SRC,
    )
    return EvidencePage(html=html.encode("utf-8"), etag=f'"{sha256_hex(html.encode())[:32]}"')


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
