"""FastAPI dependencies: the session, the settings, the store and who is calling."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from coldbench.api.artifacts.store import ArtifactStore
from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import ApiKey
from coldbench.api.errors import NotAuthenticated
from coldbench.api.hosts.models import Host
from coldbench.api.settings import Settings
from coldbench.api.transactions import Database


async def get_db(request: Request) -> AsyncIterator[Session]:
    """A session per request, opened and (usually) closed on the event loop.

    Async on purpose: a sync generator dependency costs two trips through the thread pool per
    request (enter and exit), a fifth of a small request's server CPU under load. Creating a
    session does no I/O; closing one does only while a transaction is open (its rollback), and
    only then goes to a thread, shielded so that a cancelled request still returns its
    connection.
    """
    db_session = request.app.state.sessionmaker()
    try:
        yield db_session
    finally:
        if db_session.in_transaction():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(db_session.close)
        else:
            db_session.close()


# Async, as every dependency of a hot path: FastAPI runs a sync dependency in the thread
# pool, a hand-off per request even for reading an attribute.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


async def get_database(request: Request) -> Database:
    """The async engine's transactions (api/transactions.py); tests replace it with their
    rolled-back session."""
    return request.app.state.database


SessionDep = Annotated[Session, Depends(get_db)]
DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]

_bearer = HTTPBearer(auto_error=False)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def bearer_token(credentials: BearerDep) -> str:
    if credentials is None or not credentials.credentials:
        raise NotAuthenticated("missing Authorization: Bearer <token>")
    return credentials.credentials


def get_current_worker(db_session: SessionDep, credentials: BearerDep) -> Host:
    host = auth_service.authenticate_worker(db_session=db_session, token=bearer_token(credentials))
    if host is None:
        raise NotAuthenticated(auth_service.WORKER_REFUSAL)
    return host


@dataclass(frozen=True)
class BearerClaim:
    """A bearer token of the expected kind and the id it names, not yet checked: the
    transaction that reads that row checks it (a lease's claim, a submission's group commit),
    so the request reads it once."""

    token: str
    id: str


def _bearer_claim(kind: str, refusal: str) -> Callable[..., Awaitable[BearerClaim]]:
    async def dependency(credentials: BearerDep) -> BearerClaim:
        token = bearer_token(credentials)
        claimed_id = auth_service.token_id(token, kind)
        if claimed_id is None:
            raise NotAuthenticated(refusal)
        return BearerClaim(token, claimed_id)

    return dependency


def get_current_submitter(db_session: SessionDep, credentials: BearerDep) -> ApiKey:
    key = auth_service.authenticate_submitter(
        db_session=db_session, token=bearer_token(credentials)
    )
    if key is None:
        raise NotAuthenticated("invalid API key")
    return key


def require_admin(settings: SettingsDep, credentials: BearerDep) -> None:
    if not settings.admin_token_sha256:
        raise NotAuthenticated("the admin API is disabled: set COLDBENCH_ADMIN_TOKEN_SHA256")
    if not auth_service.is_admin(
        token=bearer_token(credentials), admin_token_sha256=settings.admin_token_sha256
    ):
        raise NotAuthenticated("invalid admin token")


CurrentWorker = Annotated[Host, Depends(get_current_worker)]
WorkerClaim = Annotated[BearerClaim, Depends(_bearer_claim("cbw", auth_service.WORKER_REFUSAL))]
SubmitterClaim = Annotated[BearerClaim, Depends(_bearer_claim("cbk", "invalid API key"))]
CurrentSubmitter = Annotated[ApiKey, Depends(get_current_submitter)]
AdminKey = Annotated[None, Depends(require_admin)]
