"""The API process's rehearsal at start: one agent cycle's transactions, rolled back.

Why: the first request of each kind paid for what every later one reuses. SQLAlchemy compiles
a statement on its first execution (its cache is the engine's: once per process), and asyncpg
prepares it on each connection the first time that connection runs it, so the first request of
each kind costs several times the CPU of the next (`benchmarks/request_cost.py` prints both).
Under load the first times come together: many agents' first leases, all at once on a new
server, would wait for one claim transaction that compiles and prepares everything.

So before the server takes its first request, `rehearse` runs the statements of a whole agent
cycle, as the requests run them (the same programs, the same parameters' shapes, tokens
checked): an API key and a host of its own, a job submitted for a model no real host has, its
run claimed by that host, two heartbeats, the two uploads' checks and rows, the completion. It
runs on every connection of the async pool at once (the first alone, so each statement is
compiled once) and each transaction is rolled back: nothing it wrote is ever seen by another
transaction, and its `pg_notify` is never delivered (PostgreSQL sends a notification at commit).

Imports: api services and transactions only (as the routers do); nothing here is HTTP.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from coldbench.api.artifacts import service as artifact_service
from coldbench.api.artifacts.store import StoredBlob
from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import ApiKey
from coldbench.api.database import utcnow
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.runs import claim as run_claim
from coldbench.api.runs import completion, heartbeat
from coldbench.api.settings import Settings
from coldbench.api.transactions import AsyncDatabase, Execute, Program
from coldbench.evidence.contract.protocol import RunState

log = logging.getLogger(__name__)

_RECORDS = b'{"schema": "coldbench.record/1"}\n'
_PROVENANCE = b'{"schema": "coldbench.provenance/1"}'


@dataclass(frozen=True)
class Rehearsed:
    """How far one rehearsal went: the last step it reached ("completed" when all ran)."""

    reached: str


def agent_cycle_program(settings: Settings, dialect: str) -> Program[Rehearsed]:
    """One agent cycle's transactions as one program, to be rolled back (`rehearse`)."""
    key_id, host_id = auth_service.new_id(), auth_service.new_id()
    key = f"cbk_{key_id}_{secrets.token_urlsafe(24)}"
    secret = f"cbw_{host_id}_{secrets.token_urlsafe(24)}"
    # A model no real host has: the rehearsal's host is offered no real run, and no real host
    # could be offered its run (which no other transaction sees anyway).
    model = f"rehearsal-{secrets.token_hex(8)}"
    now = utcnow()
    yield Execute(
        sa.insert(ApiKey),
        {
            "id": key_id,
            "name": "rehearsal",
            "key_sha256": auth_service.token_digest(key),
            "created_at": now,
        },
    )
    fingerprint = {"hostname": "rehearsal", "backend": "cpu"}
    yield Execute(
        sa.insert(Host),
        {
            "id": host_id,
            "name": f"rehearsal-{host_id}",
            "secret_sha256": auth_service.token_digest(secret),
            "fingerprint": fingerprint,
            "models": [model],
            "created_at": now,
        },
    )
    payload = {
        "schema": "coldbench.job/1",
        "mode": "ab",
        "variants": [{"name": "base", "flags": {}}, {"name": "cand", "flags": {}}],
        "contexts": [64],
        "rounds": 2,
        "model": model,
    }
    submission = job_service.Submission(settings, payload, key_id, dialect, token=key)
    (submitted,) = yield from job_service.submit_group_program([submission])
    if isinstance(submitted, Exception):
        raise submitted
    claim = run_claim.ClaimRequest(
        host_id=host_id,
        # What an agent reports with each lease (worker/agent.py): on SQLite the host's row is
        # written with one statement per set of columns reported.
        report=run_claim.HostReport(fingerprint=fingerprint, repositories={}, models=[model]),
        settings=settings,
        dialect=dialect,
        token=secret,
    )
    (claimed,) = yield from run_claim.claim_group_program([claim])
    if isinstance(claimed, Exception):
        raise claimed
    if claimed.lease is None:
        # More queued runs than a claim reads lie before it: the rest of the cycle is left to
        # the first real requests.
        return Rehearsed("claimed nothing")
    run_id, attempt = claimed.lease.run_id, claimed.lease.attempt
    for progress in (None, {"cells_done": 0, "cells": 2}):
        yield from heartbeat.heartbeat_program(
            settings=settings,
            host_id=host_id,
            run_id=run_id,
            attempt=attempt,
            progress=progress,
            token=secret,
            dialect=dialect,
        )
    files: dict[str, Any] = {}
    for name, content in (("records.jsonl", _RECORDS), ("provenance.json", _PROVENANCE)):
        sha256 = hashlib.sha256(content).hexdigest()
        upload = {"host_id": host_id, "run_id": run_id, "attempt": attempt, "name": name}
        yield from artifact_service.upload_check_program(**upload, sha256=sha256, token=secret)
        blob = StoredBlob(sha256, len(content), f"rehearsal/{sha256}")
        yield from artifact_service.record_upload_program(**upload, blob=blob)
        files[name] = {"sha256": sha256, "bytes": len(content)}
    written = yield from completion.complete_program(
        host_id=host_id,
        run_id=run_id,
        attempt=attempt,
        status="succeeded",
        reason=None,
        manifest={"format": "coldbench.evidence/1", "files": files, "provenance": {}},
        dialect=dialect,
        token=secret,
    )
    if not isinstance(written, completion.CompletionWritten):
        return Rehearsed("completion refused as late")
    assert written.completed.state == RunState.COMPLETED
    return Rehearsed("completed")


async def rehearse(database: AsyncDatabase, settings: Settings) -> Rehearsed | None:
    """Rehearse an agent cycle on each of the async pool's connections, rolled back; None
    (logged) when it failed: the server still starts, and its first requests pay as before."""
    connections = 1 if database.dialect_name == "sqlite" else settings.db_async_pool_size
    started = time.perf_counter()
    try:
        outcomes = await database.rehearse(
            lambda: agent_cycle_program(settings, database.dialect_name), connections
        )
    except Exception:
        log.warning("the start-up rehearsal failed; serving without it", exc_info=True)
        return None
    reached = outcomes[0]
    log.info(
        "rehearsed an agent cycle on %d connections in %.0f ms: %s",
        connections,
        (time.perf_counter() - started) * 1000,
        reached.reached,
    )
    return reached
