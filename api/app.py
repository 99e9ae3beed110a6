"""The FastAPI application: JSON API under /api/v1, evidence pages, /healthz and /metrics."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coldbench.api import dispatch
from coldbench.api.artifacts.router import router as artifacts_router
from coldbench.api.artifacts.service import total_artifact_bytes
from coldbench.api.artifacts.store import open_store
from coldbench.api.auth.router import router as auth_router
from coldbench.api.database import (
    database_unavailable,
    make_engine,
    make_sessionmaker,
    upgrade_database,
)
from coldbench.api.deps import DatabaseDep, SessionDep
from coldbench.api.errors import ServiceError
from coldbench.api.evidence.router import router as evidence_router
from coldbench.api.github.config import load_github_config
from coldbench.api.github.router import router as github_router
from coldbench.api.hosts.router import router as hosts_router
from coldbench.api.jobs.router import router as jobs_router
from coldbench.api.pages.router import router as pages_router
from coldbench.api.pages.templates import web_dir
from coldbench.api.rehearsal import rehearse
from coldbench.api.reproductions.router import router as reproductions_router
from coldbench.api.routing import (
    BodyLimitMiddleware,
    CompressionMiddleware,
    DoorMiddleware,
    DoorRefused,
    StrictJSONRoute,
    finite_or_text,
)
from coldbench.api.runs import expiry
from coldbench.api.runs.models import Run
from coldbench.api.runs.router import router as runs_router
from coldbench.api.runs.wakeup import WorkSignal, listen_for_work, register_local
from coldbench.api.settings import Settings, get_settings
from coldbench.api.transactions import AsyncDatabase, Execute, Program, make_async_engine
from coldbench.evidence.contract.protocol import API_PREFIX, ErrorBody, FieldError, RunState

log = logging.getLogger(__name__)

ARTIFACT_PATH = re.compile(rf"{API_PREFIX}/runs/[^/]+/artifacts/[^/]+")
# A reproduction's bundle zip: read under the artifacts' limit too.
REPRODUCTION_PATH = re.compile(rf"{API_PREFIX}/evidence/[^/]+/reproductions")
# What agents call in their loop: answered uncompressed (CompressionMiddleware).
WORKER_PROTOCOL_PATH = re.compile(
    rf"{API_PREFIX}/(leases|workers/(register|heartbeat)|runs/[^/]+/(artifacts/[^/]+|complete))$"
)


class _RequestCounter:
    """Counts requests by method, route template and status.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hides a
    client's disconnect from the endpoint, and a long-polling lease must see it (a run claimed
    for an agent that left would wait for its lease to expire).
    """

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            # The route template, not the path: run ids must not explode the label set.
            template = getattr(scope.get("route"), "path", "unmatched")
            self.counter.labels(scope["method"], template, str(status)).inc()


def _install_metrics(app: FastAPI) -> None:
    registry = CollectorRegistry()
    requests = Counter(
        "coldbench_http_requests",
        "HTTP requests by method, route and status",
        ["method", "route", "status"],
        registry=registry,
    )
    runs_by_state = Gauge("coldbench_runs", "Runs by state", ["state"], registry=registry)
    artifact_bytes = Gauge(
        "coldbench_artifact_bytes", "Bytes of all stored artifacts", registry=registry
    )

    app.add_middleware(_RequestCounter, counter=requests)

    @app.get("/metrics", include_in_schema=False)
    def metrics(db_session: SessionDep) -> PlainTextResponse:
        counts = dict(
            db_session.execute(sa.select(Run.state, sa.func.count()).group_by(Run.state)).all()
        )
        for state in RunState:
            runs_by_state.labels(state).set(counts.get(state, 0))
        artifact_bytes.set(total_artifact_bytes(db_session=db_session))
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


_SELECT_ONE = sa.select(sa.literal(1))


def _select_one() -> Program[None]:
    yield Execute(_SELECT_ONE)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if settings.is_embedded:
        # The embedded default owns its SQLite file: bring it to the current schema.
        upgrade_database(settings.sqlalchemy_url)
    # Two engines on one database: the async one for the requests written as programs of
    # statements (leases, heartbeats, uploads, completions, submissions: api/transactions.py),
    # the sync one for the rest (pages, lists, registration, the periodic sweep), each with a
    # fixed number of connections (Settings.db_async_pool_size, db_sync_pool_size).
    # No request waits on either longer than Settings.db_request_timeout_s.
    is_sqlite = settings.sqlalchemy_url.startswith("sqlite")
    engine = make_engine(
        settings.sqlalchemy_url,
        timeout_s=settings.db_request_timeout_s,
        **({} if is_sqlite else {"pool_size": settings.db_sync_pool_size, "max_overflow": 0}),
    )
    async_engine = make_async_engine(
        settings.sqlalchemy_url,
        timeout_s=settings.db_request_timeout_s,
        **({} if is_sqlite else {"pool_size": settings.db_async_pool_size, "max_overflow": 0}),
    )

    work_signal = WorkSignal()
    register_local(work_signal)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        # Before the first request: the first completion would otherwise pay for it.
        dispatch.prepare()
        if settings.rehearse_at_start:
            await rehearse(app.state.database, settings)
        # An upload cut by a kill of this server (or a replica) left its spool file.
        swept = app.state.store.sweep_temporary(older_than_s=settings.upload_tmp_max_age_s)
        if swept:
            log.info("removed %d abandoned upload temporaries", len(swept))
        background = [
            asyncio.create_task(
                expiry.sweep_leases(sessionmaker=app.state.sessionmaker, settings=settings)
            )
        ]
        if engine.dialect.name == "postgresql":
            background.append(
                asyncio.create_task(listen_for_work(settings.sqlalchemy_url, work_signal))
            )
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await async_engine.dispose()
            engine.dispose()

    app = FastAPI(
        lifespan=lifespan,
        title="coldbench",
        summary="Cold-prefill benchmark jobs, worker leases, checksummed evidence.",
        version="1",
    )
    # Every route parses JSON strictly (api/routing.py), also those defined on the app itself.
    app.router.route_class = StrictJSONRoute
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.database = AsyncDatabase(
        async_engine, app.state.sessionmaker, bulk_max=settings.db_bulk_transactions_max
    )
    app.state.store = open_store(settings)
    app.state.work_signal = work_signal
    app.state.github = (
        load_github_config(settings.github_config) if settings.github_config else None
    )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
        # The default handler echoes each input; a non-finite float there cannot be encoded.
        errors = [
            {key: value for key, value in item.items() if key in ("type", "loc", "msg", "ctx")}
            for item in error.errors()
        ]
        return JSONResponse({"detail": finite_or_text(jsonable_encoder(errors))}, status_code=422)

    @app.exception_handler(DoorRefused)
    async def _door_refused(_request: Request, error: DoorRefused) -> JSONResponse:
        # Text the door refuses (api/routing.py): the field and what is wrong, never the text.
        body = ErrorBody(detail=str(error.detail), field=error.field)
        return JSONResponse(body.model_dump(exclude_none=True), status_code=422)

    @app.exception_handler(sa.exc.SQLAlchemyError)
    async def _database_error(request: Request, error: sa.exc.SQLAlchemyError) -> JSONResponse:
        # The sync sessions' (pages, lists, registration); the async engine's transactions
        # raise DatabaseUnavailable themselves (api/transactions.py).
        unavailable = database_unavailable(error)
        if unavailable is None:
            raise error
        log.warning("%s %s: %s", request.method, request.url.path, unavailable.message)
        return await _service_error(request, unavailable)

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, error: ServiceError) -> JSONResponse:
        headers: dict[str, str] | None = None
        if error.status_code == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        elif error.status_code == 503:
            headers = {"Retry-After": "1"}
        body = ErrorBody(
            detail=error.message,
            field=error.field,
            errors=[FieldError(field=field, detail=text) for field, text in error.problems]
            if len(error.problems) > 1
            else None,
        )
        return JSONResponse(
            body.model_dump(exclude_none=True), status_code=error.status_code, headers=headers
        )

    for router in (
        hosts_router,
        runs_router,
        artifacts_router,
        jobs_router,
        auth_router,
        github_router,
        reproductions_router,
    ):
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(evidence_router)
    app.include_router(pages_router)
    app.mount("/static", StaticFiles(directory=web_dir() / "static"), name="static")

    @app.get("/healthz", include_in_schema=False)
    def healthz(db_session: SessionDep) -> dict[str, str]:
        db_session.execute(sa.text("SELECT 1"))
        return {"status": "ok"}

    @app.get("/healthz/pool", include_in_schema=False)
    async def healthz_pool(db: DatabaseDep) -> dict[str, str]:
        """One `SELECT 1` through the async engine's pool, which the agents' requests and
        submissions use (healthz's is the sync one): a probe of that pool, and the floor that
        benchmarks/service_load.py measures leases and submissions against in the same run
        (the stack's own cost of a request with one round trip, under the same load)."""
        await db.read(_select_one)
        return {"status": "ok"}

    _install_metrics(app)

    def body_limit(scope: Scope) -> int:
        # Artifact uploads stream to the store under their own, larger limit.
        if scope["method"] == "PUT" and ARTIFACT_PATH.fullmatch(scope["path"]):
            return settings.max_artifact_bytes
        if scope["method"] == "POST" and REPRODUCTION_PATH.fullmatch(scope["path"]):
            return settings.max_artifact_bytes
        return settings.max_request_body_bytes

    # Innermost of these three: the door reads a JSON body whole, within the body limit.
    app.add_middleware(DoorMiddleware)
    app.add_middleware(CompressionMiddleware, skip=WORKER_PROTOCOL_PATH)
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limit)
    return app
