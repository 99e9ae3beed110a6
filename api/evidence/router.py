"""Evidence pages: `/e/{id}` (the report page), `.html` (the bundle's report.html), `.md`
(the PR Markdown: the bundle's summary.md with the id linked), `.json` and `.zip`.

Readable by anyone who has the id: the id is derived from the manifest's sha256, so it is
unguessable and names exactly one immutable set of files.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from coldbench.api.deps import SessionDep, StoreDep
from coldbench.api.errors import ServiceError
from coldbench.api.evidence import service
from coldbench.api.pages.router import error_page, evidence_page, wants_html
from coldbench.api.reproductions import service as reproduction_service
from coldbench.api.routing import StrictJSONRoute
from coldbench.evidence.contract.canonical import sha256_hex

router = APIRouter(route_class=StrictJSONRoute, tags=["evidence"])


@router.api_route("/e/{path}", methods=["GET", "HEAD"], response_class=Response)
def evidence_file(path: str, request: Request, db_session: SessionDep, store: StoreDep):
    """The file, or why not: an HTML page for a browser, JSON for an API client."""
    try:
        return _evidence_file(path, request, db_session, store)
    except ServiceError as error:
        if not wants_html(request):
            raise
        title = "No such evidence" if error.status_code == 404 else "Evidence not served"
        return error_page(request, title, error.message, status_code=error.status_code)


def _evidence_file(path: str, request: Request, db_session: SessionDep, store: StoreDep):
    evidence_id, suffix = service.split_evidence_path(path)
    if suffix == "" and not path.endswith(".html"):
        # The page (plotly.js served by the app, buttons); `.html` is the bundle's own file.
        return evidence_page(request, db_session, store, evidence_id)
    if suffix == ".md":
        # The PR Markdown (the bundle's summary.md with its id linked to this page).
        markdown = service.pr_markdown(
            db_session=db_session,
            store=store,
            evidence_id=evidence_id,
            base_url=str(request.base_url),
        )
        # Reproductions uploaded since add their hosts' section: revalidated, never immutable.
        markdown = reproduction_service.with_hosts_markdown(
            markdown, db_session=db_session, store=store, evidence_id=evidence_id
        )
        etag = f'"{sha256_hex(markdown.encode())[:32]}"'
        headers = {
            "ETag": etag,
            "Cache-Control": "public, no-cache",
            **service.served_headers(suffix),
        }
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(markdown, media_type=service.EVIDENCE_FILES[suffix][1], headers=headers)
    row = service.get_evidence(db_session=db_session, evidence_id=evidence_id)
    file_name, media_type = service.EVIDENCE_FILES[suffix]
    # Checked on every request: bytes altered in the store answer 409, never a cached copy.
    data = service.checked_bytes(
        store=store, evidence_id=evidence_id, file_name=file_name, entry=row.files.get(file_name)
    )
    headers = {
        "Cache-Control": "public, max-age=31536000, immutable",
        **service.served_headers(suffix),
    }
    if suffix == ".zip":
        headers["Content-Disposition"] = f'attachment; filename="coldbench-{evidence_id}.zip"'
    return Response(data, media_type=media_type, headers=headers)
