"""Page routes: thin, calling the same service functions as the JSON API.

Identity: a submitter types their API key once at /login; it is checked by the auth service
and the browser keeps a signed session cookie naming the key's id (HttpOnly, SameSite=Lax).
Every POST carries the CSRF token of the double-submit cookie in a hidden field.
"""

from __future__ import annotations

import gzip
import logging
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from pydantic import ValidationError
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import ApiKey
from coldbench.api.database import utcnow
from coldbench.api.deps import DatabaseDep, SessionDep, SettingsDep
from coldbench.api.errors import Invalid, NotFound, ServiceError
from coldbench.api.evidence import page as evidence_pages
from coldbench.api.evidence import service as evidence_service
from coldbench.api.github import service as github_service
from coldbench.api.github.schemas import PullRequestAsk
from coldbench.api.hosts import matching
from coldbench.api.hosts import service as host_service
from coldbench.api.jobs import service as job_service
from coldbench.api.pages import form as job_form
from coldbench.api.pages import signing
from coldbench.api.pages.outcome import job_outcome
from coldbench.api.pages.templates import templates
from coldbench.api.pages.timing import job_timing
from coldbench.api.reproductions import service as reproduction_service
from coldbench.api.routing import StrictJSONRoute
from coldbench.api.settings import Settings
from coldbench.api.transactions import Database
from coldbench.evidence.bundles.bundle import BundleError
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.rendering.markdown import answer_sentences, time_spent_lines, verdict_rows
from coldbench.evidence.spec.engine_flags import ADAPTER_FLAGS
from coldbench.evidence.spec.job_options import service_payload

log = logging.getLogger(__name__)

router = APIRouter(route_class=StrictJSONRoute, include_in_schema=False)

# Pages are same-origin only: nothing is ever fetched from elsewhere, even by a bug.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


# --- identity and CSRF -------------------------------------------------------------------


def _secret(request: Request) -> bytes:
    state = request.app.state
    if getattr(state, "web_secret", None) is None:
        state.web_secret = signing.web_secret(state.settings)
    return state.web_secret


def _session_id(request: Request, settings: Settings) -> str | None:
    return signing.session_id_of(
        _secret(request), request.cookies.get(signing.SESSION_COOKIE), settings.web_session_ttl_s
    )


def _current_key(request: Request, db_session: Session, settings: Settings) -> ApiKey | None:
    session_id = _session_id(request, settings)
    if session_id is None:
        return None
    return auth_service.web_session_key(db_session=db_session, session_id=session_id)


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='/')}", status_code=303)


def _safe_next(target: str | None) -> str:
    """Only a path on this site: never `//host` or a scheme (an open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _csrf_for(request: Request, key: ApiKey | None) -> tuple[str, bool]:
    """(token, whether the cookie must be set): the cookie's token while it is still valid."""
    cookie = request.cookies.get(signing.CSRF_COOKIE)
    session_id = key.id if key else None
    if cookie and signing.csrf_token_valid(_secret(request), cookie, session_id):
        return cookie, False
    return signing.csrf_token(_secret(request), session_id), True


def _csrf_ok(request: Request, fields: Any, key: ApiKey | None) -> bool:
    return signing.csrf_ok(
        _secret(request),
        request.cookies.get(signing.CSRF_COOKIE),
        str(fields.get(signing.CSRF_FIELD, "")),
        key.id if key else None,
    )


def _set_cookie(request: Request, response: Response, name: str, value: str, **extra: Any) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="lax" if name == signing.SESSION_COOKIE else "strict",
        secure=request.url.scheme == "https",
        path="/",
        **extra,
    )


def _page(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    key: ApiKey | None,
    status_code: int = 200,
    csrf: tuple[str, bool] | None = None,
) -> HTMLResponse:
    token, is_new = csrf or _csrf_for(request, key)
    response = templates().TemplateResponse(
        request,
        template,
        {"submitter": key, "csrf_token": token, "csrf_field": signing.CSRF_FIELD, **context},
        status_code=status_code,
    )
    if is_new:
        _set_cookie(request, response, signing.CSRF_COOKIE, token)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _forbidden(request: Request, key: ApiKey | None) -> HTMLResponse:
    return _page(
        request,
        "error.html",
        {
            "title": "Form expired",
            "message": "The form's security token is missing or does not match: "
            "go back, reload the page and submit again.",
        },
        key=key,
        status_code=403,
    )


def wants_html(request: Request) -> bool:
    """A browser navigating (its Accept names text/html), not an API client."""
    return "text/html" in request.headers.get("accept", "")


def error_page(request: Request, title: str, message: str, *, status_code: int) -> HTMLResponse:
    """A page saying what went wrong, for a public page's visitor (no session needed)."""
    return _page(
        request,
        "error.html",
        {"title": title, "message": message},
        key=None,
        status_code=status_code,
    )


def _not_found(request: Request, key: ApiKey | None, message: str) -> HTMLResponse:
    return _page(
        request, "error.html", {"title": "Not found", "message": message}, key=key, status_code=404
    )


# --- login -------------------------------------------------------------------------------


@router.get("/login")
def login_form(request: Request, db_session: SessionDep, settings: SettingsDep, next: str = "/"):
    key = _current_key(request, db_session, settings)
    return _page(request, "login.html", {"next": _safe_next(next), "error": None}, key=key)


@router.post("/login")
async def login(request: Request, db_session: SessionDep, settings: SettingsDep):
    fields = await request.form()
    if not _csrf_ok(request, fields, None):
        return _forbidden(request, None)
    target = _safe_next(str(fields.get("next", "/")))
    token = str(fields.get("api_key", "")).strip()
    key = auth_service.authenticate_submitter(db_session=db_session, token=token)
    if key is None:
        return _page(
            request,
            "login.html",
            {
                "next": target,
                "error": "That API key is unknown or revoked: check it, or ask an admin for "
                "one (coldbench admin apikey NAME).",
            },
            key=None,
            status_code=401,
        )
    response = RedirectResponse(target, status_code=303)
    _set_cookie(
        request,
        response,
        signing.SESSION_COOKIE,
        signing.session_cookie(
            _secret(request), auth_service.start_web_session(db_session=db_session, key=key)
        ),
        max_age=settings.web_session_ttl_s,
    )
    # A new CSRF token bound to the new session; the login form's one stops working.
    _set_cookie(
        request, response, signing.CSRF_COOKIE, signing.csrf_token(_secret(request), key.id)
    )
    return response


@router.post("/logout")
async def logout(request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if not _csrf_ok(request, await request.form(), key):
        return _forbidden(request, key)
    session_id = _session_id(request, settings)
    if session_id is not None:
        # Ended on the server: a copy of the cookie kept anywhere opens nothing from now on.
        auth_service.end_web_session(db_session=db_session, session_id=session_id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(signing.SESSION_COOKIE, path="/")
    response.delete_cookie(signing.CSRF_COOKIE, path="/")
    return response


# --- the job form --------------------------------------------------------------------------


def _form_context(request: Request, db_session: Session, form: job_form.JobForm) -> dict[str, Any]:
    hosts = host_service.list_hosts(db_session=db_session)
    repositories: dict[str, set[str]] = {}
    models: set[str] = set()
    labels: set[str] = set()
    for host in hosts:
        for name, offer in matching.repository_offers(host).items():
            repositories.setdefault(name, set()).update(offer.recipes)
        models.update(host.models)
        labels.update(matching.effective_labels(host))
    return {
        "form": form,
        "hosts": hosts,
        "repositories": {name: sorted(recipes) for name, recipes in sorted(repositories.items())},
        # What the inputs that take a name offer as they are typed (job_form's `suggestions`).
        "suggestions": {
            "recipes": sorted({r for recipes in repositories.values() for r in recipes}),
            "models": ["preset:tiny", *sorted(models)],
            "labels": sorted(labels),
        },
        "adapters": job_form.adapter_choices(matching.adapters_by_repository(hosts)),
        "presets": job_form.CONTEXT_PRESETS,
        "modes": job_form.MODE_LABELS,
        "fields": job_form.form_fields(),
        "plain_fields": job_form.plain_fields(),
        "fields_by_modes": job_form.fields_by_modes(),
        "mode_notes": job_form.MODE_NOTES,
        "one_configuration": not job_form.uses_candidate_rows(form.mode, form.values),
        "variant_rows": range(job_form.VARIANT_ROWS),
        "form_error": job_form.FORM_ERROR,
        "rounds_by_family": job_form.rounds_by_family(),
        "engine_flags": ADAPTER_FLAGS,
        # The repositories answered on GitHub (api/github): the pull-request field's examples.
        "pull_request_repositories": sorted(request.app.state.github.repositories)
        if request.app.state.github is not None
        else [],
    }


@router.get("/")
def new_job(request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    context = _form_context(request, db_session, job_form.blank_form())
    return _page(request, "form.html", context, key=key)


@router.post("/")
async def submit_job(
    request: Request, db: DatabaseDep, db_session: SessionDep, settings: SettingsDep
):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    fields = await request.form()
    if not _csrf_ok(request, fields, key):
        return _forbidden(request, key)
    form = job_form.read_form(fields, [str(v) for v in fields.getlist("contexts")])
    if form.values["pull_request"]:
        return await _submit_pull_request(request, db, db_session, settings, form, key)
    hosts = host_service.list_hosts(db_session=db_session)
    spec, rows = job_form.build_spec(
        form, matching.adapters_by_repository(hosts), limits=settings.spec_limits
    )
    if spec is not None and not form.errors:
        try:
            job = job_service.create_job(
                db_session=db_session,
                settings=settings,
                payload=service_payload(spec),
                submitted_by=key.id,
            )
        except Invalid as error:
            db_session.rollback()
            for field, message in error.problems:
                form.add_error(job_form.form_field(field, rows), message)
        else:
            log.info("job %s submitted from the form by key %s", job.id, key.id)
            return RedirectResponse(f"/jobs/{job.id}", status_code=303)
    context = _form_context(request, db_session, form)
    return _page(request, "form.html", context, key=key, status_code=422)


async def _submit_pull_request(
    request: Request,
    db: Database,
    db_session: Session,
    settings: Settings,
    form: job_form.JobForm,
    key: ApiKey,
) -> Response:
    """The form's pull-request field: the job on the PR's commits, as `coldbench submit --pr`
    asks for it (api/github); a refusal is shown beside the field."""
    config = request.app.state.github
    try:
        if config is None:
            raise Invalid("the GitHub integration is not configured (COLDBENCH_GITHUB_CONFIG)")
        try:
            asked = PullRequestAsk(
                pull_request=form.values["pull_request"],
                options=job_form.pull_request_options(form),
            )
        except ValidationError:
            raise Invalid("write the pull request as OWNER/REPO#N") from None
        job, pull_request_id = await github_service.ask_for_pull_request(
            db=db, settings=settings, config=config, asked=asked, asked_by=f"API key {key.name}"
        )
    except ServiceError as error:
        form.add_error("pull_request", error.message)
        context = _form_context(request, db_session, form)
        return _page(request, "form.html", context, key=key, status_code=422)
    dispatch.send_task("github_answer_pull_request", pull_request_id)
    log.info("job %s for %s submitted from the form by key %s", job.id, asked.pull_request, key.id)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


# --- hosts and jobs ----------------------------------------------------------------------


@router.get("/hosts")
def hosts_page(request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    hosts = host_service.list_hosts(db_session=db_session)
    context = {
        "hosts": hosts,
        "auto_labels": {host.id: matching.auto_labels(host) for host in hosts},
        "calibrations": {host.id: host_service.calibration_lines(host) for host in hosts},
        "health": {host.id: host_service.host_health(host, settings=settings) for host in hosts},
        "current_runs": host_service.current_runs(db_session=db_session),
        "lease_ttl_s": settings.lease_ttl_s,
    }
    return _page(request, "hosts.html", context, key=key)


@router.get("/jobs")
def jobs_page(request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    jobs = job_service.list_jobs(db_session=db_session, limit=100)
    outcomes = {job.id: job_outcome(job.state, job.reason, job.summary) for job in jobs}
    return _page(request, "jobs.html", {"jobs": jobs, "outcomes": outcomes}, key=key)


def _job_context(db_session: Session, job_id: str, settings: Settings) -> dict[str, Any]:
    job = job_service.job_detail(db_session=db_session, job_id=job_id, settings=settings)
    invalid = [
        {**cell, "run_id": run.id, "host": run.host_name}
        for run in job.runs
        for cell in (run.progress or {}).get("invalid", [])
    ]
    answer = None
    summary = job_service.job_summary(db_session=db_session, job_id=job_id)
    if job.evidence_id and summary:
        # The evidence page's headline and verdict table, from the same summary.
        answer = {
            "sentences": answer_sentences(summary, compact=len(summary.variants) > 6),
            "rows": verdict_rows(summary),
            "time_spent": time_spent_lines(summary),
            # a warm canary judged cold (evidence/analysis/canary.py): said before any verdict
            "evidence_invalid": list(summary.evidence_invalid or []),
        }
    is_final = JobState(job.state).is_final
    return {
        "job": job,
        "invalid": invalid,
        "is_final": is_final,
        "answer": answer,
        "rounds_warning": job.rounds_warning,
        "notice": job.notice,
        "outcome": job_outcome(
            job.state, job.reason, job_service.get_job(db_session=db_session, job_id=job_id).summary
        ),
        "timing": job_timing(job, now=utcnow(), lease_ttl_s=settings.lease_ttl_s),
    }


@router.get("/jobs/{job_id}")
def job_page(job_id: str, request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    try:
        context = _job_context(db_session, job_id, settings)
    except NotFound as error:
        return _not_found(request, key, error.message)
    return _page(request, "job.html", context, key=key)


@router.get("/jobs/{job_id}/progress.json")
def job_progress(job_id: str, request: Request, db_session: SessionDep, settings: SettingsDep):
    """What the job page's script polls: the state and the re-rendered progress section."""
    key = _current_key(request, db_session, settings)
    if key is None:
        return JSONResponse({"detail": "log in again at /login"}, status_code=401)
    try:
        context = _job_context(db_session, job_id, settings)
    except NotFound as error:
        return JSONResponse({"detail": error.message}, status_code=404)
    html = templates().get_template("_job_progress.html").render(**context)
    job = context["job"]
    return JSONResponse(
        {
            "state": job.state,
            "is_final": context["is_final"],
            "evidence_url": job.evidence_url,
            "html": html,
        },
        headers={"Cache-Control": "no-store"},
    )


@router.post("/jobs/{job_id}/cancel")
async def cancel_job(job_id: str, request: Request, db_session: SessionDep, settings: SettingsDep):
    key = _current_key(request, db_session, settings)
    if key is None:
        return _login_redirect(request)
    if not _csrf_ok(request, await request.form(), key):
        return _forbidden(request, key)
    try:
        job_service.cancel_job(db_session=db_session, job_id=job_id, submitted_by=key.id)
    except ServiceError as error:
        return _page(
            request,
            "error.html",
            {"title": "Cannot cancel", "message": error.message},
            key=key,
            status_code=error.status_code,
        )
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


# --- evidence and static files -----------------------------------------------------------


def evidence_page(request: Request, db_session: Session, store: Any, evidence_id: str) -> Response:
    """`/e/{id}`: the report with plotly.js from /static, copy-Markdown and download buttons:
    the page stored at publishing, or rendered now for evidence published without one."""
    row = evidence_service.get_evidence(db_session=db_session, evidence_id=evidence_id)
    page_url = evidence_service.evidence_page_url(str(request.base_url), evidence_id)
    # Stored bytes are checked on each request: altered bytes answer 409, not a page.
    stored = row.files.get(evidence_pages.PAGE_FILE)
    try:
        if stored is not None:
            page = evidence_pages.stored_page(
                evidence_service.checked_bytes(
                    store=store,
                    evidence_id=evidence_id,
                    file_name=evidence_pages.PAGE_FILE,
                    entry=stored,
                ),
                stored_sha256=stored["sha256"],
                manifest_sha256=row.manifest_sha256,
                page_url=page_url,
            )
        else:
            view = evidence_service.bundle_view(
                store=store, evidence_id=evidence_id, entry=row.files.get("bundle.zip")
            )
            page = evidence_pages.render_page(evidence_id, view, page_url)
    except (BundleError, KeyError, ValueError):
        # A bundle this version cannot re-render (older format, a damaged zip): its own
        # report.html, as is, once its digest is checked too.
        log.exception("evidence %s: page not rendered; serving the bundle's report", evidence_id)
        report = evidence_service.checked_bytes(
            store=store,
            evidence_id=evidence_id,
            file_name="report.html",
            entry=row.files.get("report.html"),
        )
        return Response(
            report,
            media_type="text/html; charset=utf-8",
            headers={"Cache-Control": "no-cache", **evidence_service.served_headers("")},
        )
    comparison = reproduction_service.host_comparison(
        db_session=db_session, store=store, evidence_id=evidence_id
    )
    if comparison is not None:
        # Hosts that reproduced the evidence since: their section, and an ETag naming them.
        rows = reproduction_service.reproductions_of(db_session=db_session, evidence_id=evidence_id)
        page = evidence_pages.EvidencePage(
            html=reproduction_service.with_reproductions(page.html, comparison),
            etag=f'{page.etag[:-1]}-{reproduction_service.reproductions_digest(rows)}"',
        )
    headers = {
        "ETag": page.etag,
        # Reproductions may add hosts to the page: a cache revalidates (the ETag answers 304).
        "Cache-Control": "public, no-cache",
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
    }
    if request.headers.get("if-none-match") == page.etag:
        return Response(status_code=304, headers=headers)
    return Response(page.html, media_type="text/html; charset=utf-8", headers=headers)


_plotly_cache: dict[str, bytes] = {}


@router.get("/static/plotly.min.js")
def plotly_js(request: Request):
    """plotly.js from the installed plotly package (gzip when the browser takes it)."""
    from coldbench.evidence.rendering.report import plotly_js as plotly_source

    if "raw" not in _plotly_cache:
        _plotly_cache["raw"] = plotly_source().encode("utf-8")
    headers = {
        "Cache-Control": "public, max-age=86400",
        "ETag": f'"plotly-{len(_plotly_cache["raw"])}"',
        "Vary": "Accept-Encoding",
    }
    if request.headers.get("if-none-match") == headers["ETag"]:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        if "gzip" not in _plotly_cache:
            _plotly_cache["gzip"] = gzip.compress(_plotly_cache["raw"], compresslevel=6)
        headers["Content-Encoding"] = "gzip"
        return Response(_plotly_cache["gzip"], media_type="text/javascript", headers=headers)
    return Response(_plotly_cache["raw"], media_type="text/javascript", headers=headers)
