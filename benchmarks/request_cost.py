"""The API process's CPU per request, by kind, one request at a time, in this process.

`service_load.py` measures the service as agents see it (latency under load, a real server
process); this script answers where a request's CPU goes. It builds the app on a fresh
PostgreSQL database (the async engine, as `coldbench server` does), calls it through ASGI
directly (no sockets, no HTTP parsing: uvicorn's share is not in these figures) and, for each
kind, times `--requests` requests one after another:

- `submit`: POST /api/v1/jobs;
- `lease`: POST /api/v1/leases, each from a host that holds no run, with work queued;
- `heartbeat`: POST /api/v1/workers/heartbeat of a leased run;
- `upload`: PUT of records.jsonl to a leased run;
- `complete`: POST /api/v1/runs/{id}/complete (its Celery message goes to Redis).

It prints CPU milliseconds per request (process time, so it counts every thread) and of the
first request of each kind (what a fresh server pays once: compiling and preparing statements,
unless it rehearsed them at start, api/rehearsal.py), the database round trips per request
(statements, BEGIN, COMMIT: a count, the same on any machine, where the CPU figures vary with
how busy it is) and, with `--profile KIND`, that kind's costliest functions under cProfile
(which slows everything about twofold: read its shares, not its times).

    python -m benchmarks.request_cost --requests 200
    python -m benchmarks.request_cost --requests 200 --profile lease
    python -m benchmarks.request_cost --checkout ../older-worktree   # another commit's app
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import json
import os
import pstats
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
# Set in the process that measures another checkout's app (`--checkout`), so it does not start
# one more.
_CHECKOUT_CHILD = "COLDBENCH_REQUEST_COST_CHECKOUT"

KINDS = ("submit", "lease", "heartbeat", "upload", "complete")
PROVENANCE = b'{"schema": "coldbench.provenance/1"}'
PROVENANCE_SHA256 = hashlib.sha256(PROVENANCE).hexdigest()


async def call(
    app: Any, method: str, path: str, token: str, body: bytes = b"", **headers: str
) -> tuple[int, bytes]:
    """One request through the ASGI interface: (status, body)."""
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    status = 0
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def job_spec() -> dict[str, Any]:
    return {
        "schema": "coldbench.job/1",
        "mode": "ab",
        "variants": [{"name": "base", "flags": {}}, {"name": "cand", "flags": {}}],
        "contexts": [64, 128],
        "rounds": 2,
        "decode_tokens": 2,
        "model": "bench-model",
    }


def fingerprint(name: str) -> dict[str, Any]:
    return {"hostname": name, "backend": "cpu", "os": "Linux 6.1", "cores": 2}


class RoundTrips:
    """Round trips to the database of both of the app's engines: statements, and BEGIN and
    COMMIT or ROLLBACK where a transaction is open (the autocommit reads send neither). A
    count, not a time: the same on any machine, however busy."""

    def __init__(self, *engines: sa.Engine) -> None:
        self.count = 0
        for engine in engines:
            sa.event.listen(engine, "before_cursor_execute", self._statement)
            for name in ("begin", "commit", "rollback"):
                sa.event.listen(engine, name, self._transaction)

    def _statement(self, *_: Any) -> None:
        self.count += 1

    def _transaction(self, connection: sa.Connection) -> None:
        if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.count += 1


async def measure(
    app: Any, settings: Any, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """CPU milliseconds per request, of the first request, and database round trips per
    request, by kind."""
    from coldbench.api.auth import service as auth_service
    from coldbench.api.hosts import service as host_service

    n = args.requests
    sessions = app.state.sessionmaker
    with sessions() as db_session:
        key = auth_service.create_api_key(db_session=db_session, name="cost")
        hosts = []
        for index in range(n):
            token = auth_service.create_enrollment_token(db_session=db_session)
            name = f"cost-{index:04d}"
            host, secret = host_service.register_host(
                db_session=db_session,
                enrollment_token=token,
                name=name,
                fingerprint=fingerprint(name),
                labels=[],
                repositories={},
                models=["bench-model"],
            )
            hosts.append((host.id, secret, name))
    spec = json.dumps(job_spec()).encode()
    leases: list[tuple[str, int, str]] = []
    records = b'{"schema": "coldbench.record/1"}\n' * 8
    digest = hashlib.sha256(records).hexdigest()

    async def submit(_: int) -> None:
        status, body = await call(app, "POST", "/api/v1/jobs", key, spec)
        assert status == 201, body

    async def lease(i: int) -> None:
        _, secret, name = hosts[i]
        body = json.dumps({"fingerprint": fingerprint(name), "wait_s": 0}).encode()
        status, answer = await call(app, "POST", "/api/v1/leases", secret, body)
        assert status == 200, answer
        got = json.loads(answer)
        leases.append((got["run_id"], got["attempt"], secret))

    async def heartbeat(i: int) -> None:
        run_id, attempt, secret = leases[i]
        body = json.dumps({"run_id": run_id, "attempt": attempt, "progress": None}).encode()
        status, answer = await call(app, "POST", "/api/v1/workers/heartbeat", secret, body)
        assert status == 200, answer

    async def upload(i: int) -> None:
        run_id, attempt, secret = leases[i]
        path = f"/api/v1/runs/{run_id}/artifacts/records.jsonl?attempt={attempt}"
        status, answer = await call(app, "PUT", path, secret, records, x_content_sha256=digest)
        assert status in (200, 201), answer

    async def provenance(i: int) -> None:
        run_id, attempt, secret = leases[i]
        path = f"/api/v1/runs/{run_id}/artifacts/provenance.json?attempt={attempt}"
        status, answer = await call(
            app, "PUT", path, secret, PROVENANCE, x_content_sha256=PROVENANCE_SHA256
        )
        assert status in (200, 201), answer

    async def complete(i: int) -> None:
        run_id, attempt, secret = leases[i]
        manifest = {
            "format": "coldbench.evidence/1",
            "files": {
                "records.jsonl": {"sha256": digest, "bytes": len(records)},
                "provenance.json": {"sha256": PROVENANCE_SHA256, "bytes": len(PROVENANCE)},
            },
            "provenance": {},
        }
        body = json.dumps(
            {"attempt": attempt, "status": "succeeded", "reason": None, "manifest": manifest}
        ).encode()
        status, answer = await call(app, "POST", f"/api/v1/runs/{run_id}/complete", secret, body)
        assert status == 200, answer

    steps: dict[str, Callable[[int], Awaitable[None]]] = {
        "submit": submit,
        "lease": lease,
        "heartbeat": heartbeat,
        "upload": upload,
        "complete": complete,
    }
    figures: dict[str, float] = {}
    first: dict[str, float] = {}  # the first request of each kind the server answers
    round_trips: dict[str, float] = {}
    counter = RoundTrips(app.state.engine, app.state.database.engine.sync_engine)
    for kind in KINDS:
        if kind == "complete":  # its other required file, not timed
            for i in range(n):
                await provenance(i)
        profiler = cProfile.Profile(time.process_time) if args.profile == kind else None
        counted = counter.count
        started = time.process_time()
        if profiler:
            profiler.enable()
        for i in range(n):
            await steps[kind](i)
            if i == 0:
                first[kind] = (time.process_time() - started) * 1000
        if profiler:
            profiler.disable()
        figures[kind] = (time.process_time() - started) / n * 1000
        round_trips[kind] = (counter.count - counted) / n
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
            print(out.getvalue())
    return figures, first, round_trips


def _code_root() -> Path | None:
    """The checkout whose `coldbench` this Python imports (None: none it can import)."""
    try:
        import coldbench
    except ImportError:
        return None
    return Path(coldbench.__file__).resolve().parent.parent


def _measure_in(checkout: Path) -> int:
    """This script again, in a Python that imports `checkout`'s coldbench: its path first on
    PYTHONPATH and none of its own (`-P`: neither the working directory nor this folder)."""
    if os.environ.get(_CHECKOUT_CHILD) == str(checkout):
        raise SystemExit(f"--checkout {checkout}: no coldbench package there to import")
    env = {**os.environ, "PYTHONPATH": str(checkout), _CHECKOUT_CHILD: str(checkout)}
    command = [sys.executable, "-P", str(Path(__file__).resolve()), *sys.argv[1:]]
    return subprocess.run(command, env=env, check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind")
    parser.add_argument("--profile", choices=KINDS, help="cProfile this kind")
    parser.add_argument("--top", type=int, default=40, help="functions shown with --profile")
    parser.add_argument("--sort", default="tottime", help="pstats order: tottime, cumulative")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "COLDBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--redis", default=os.environ.get("COLDBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=REPO,
        help="measure this checkout's app (e.g. a git worktree of an older commit)",
    )
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    if _code_root() != checkout:
        return _measure_in(checkout)

    name = f"coldbench_cost_{secrets.token_hex(4)}"
    prefix = f"coldbench-cost-{secrets.token_hex(4)}:"
    admin = sa.create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(args.postgres).set(database=name).render_as_string(False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(
                COLDBENCH_DATABASE_URL=url,
                COLDBENCH_REDIS_URL=args.redis,
                COLDBENCH_CELERY_KEY_PREFIX=prefix,
                COLDBENCH_STATE_DIR=str(Path(tmp) / "state"),
                COLDBENCH_ARTIFACT_DIR=str(Path(tmp) / "artifacts"),
            )
            from coldbench.api.app import create_app
            from coldbench.api.database import upgrade_database
            from coldbench.api.settings import get_settings

            settings = get_settings()
            upgrade_database(settings.sqlalchemy_url)
            app = create_app(settings)

            async def run() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
                async with app.router.lifespan_context(app):
                    return await measure(app, settings, args)

            figures, first, round_trips = asyncio.run(run())
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
        import redis  # the completions' Celery messages, never consumed here

        broker = redis.Redis.from_url(args.redis)
        keys = list(broker.scan_iter(match=f"{prefix}*"))
        if keys:
            broker.delete(*keys)
        broker.close()
    for kind, cpu_ms in figures.items():
        print(
            f"{kind:10s} {cpu_ms:6.2f} ms CPU per request (the first {first[kind]:6.2f}), "
            f"{round_trips[kind]:5.2f} database round trips"
        )
    print(
        json.dumps(
            {
                **{f"{kind}_cpu_ms": round(v, 3) for kind, v in figures.items()},
                **{f"{kind}_first_cpu_ms": round(v, 3) for kind, v in first.items()},
                **{f"{kind}_round_trips": round(v, 2) for kind, v in round_trips.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
