"""Load on the central service: simulated agents against a real `coldbench server`.

Starts, on loopback, a fresh PostgreSQL database, `coldbench server` (one process) and a
`coldbench celery worker` on Redis, then:

0. cold: the server's first `--submitters` submissions, all at once (every statement is
   compiled and prepared on its first use in a process): their slowest is reported apart;
1. submit: `--submitters` concurrent submitters (25) post `--jobs` jobs (work for the agents);
2. list: 50 concurrent `GET /api/v1/jobs`, four times;
3. agents: `--workers` simulated agents (50) register, then for `--seconds` lease (long-poll),
   heartbeat, upload records.jsonl and provenance.json and complete, while one submitter keeps
   work queued;
4. drain: waits until Celery has ingested every completed run, then counts what was lost or
   duplicated from the database;
5. one at a time: `--single` sequential cycles of one more agent (submit, list, lease with
   work queued, heartbeat, two uploads, complete), each request alone on the server: its
   latency and the server's CPU per request, what a request costs without queueing;
6. render: the report of a job of `--render-cells` cells (10,000), analysed and published
   (zip and evidence page) by the same code Celery runs (wall and CPU seconds), then the first
   request of its page, and side by side the first request of the same evidence without its
   stored page (the server renders it).

Beside phases 1 and 3 one more client asks `GET /healthz/pool` (one `SELECT 1` through the
async engine's pool that leases and submissions use) about every 20 ms: the floor of a request
with one round trip on this stack under the same load, measured in the same run. Leases and
submissions are reported against it as ratios (`lease_p99_over_floor`, ...): on a shared
machine an absolute p99 follows whatever else runs, the ratio much less.

It stops by itself (every phase is bounded) and prints the figures, then one JSON line.

    python -m benchmarks.service_load --workers 50 --seconds 30

Needs PostgreSQL (`--postgres`, a server URL; a database is created and dropped) and Redis
(`--redis`; keys carry a fresh prefix and are deleted afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
MODEL = "bench-model"
VARIANTS = ("base", "cand")
CONTEXTS = (64, 128)
ROUNDS = 2
LAG_SAMPLE_S = 0.005
# Leases that start this long after the first are the settled state (see lease_settled_p99_ms)
SETTLED_S = 5.0


# --- helpers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def ms(value: float) -> float | None:
    """Milliseconds, or None where nothing was measured."""
    return None if value != value else round(value * 1000, 1)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def job_spec(hosts: int = 1, rounds: int = ROUNDS, contexts: tuple[int, ...] = CONTEXTS) -> dict:
    return {
        "schema": "coldbench.job/1",
        "mode": "ab",
        "variants": [{"name": VARIANTS[0], "flags": {}}, {"name": VARIANTS[1], "flags": {}}],
        "contexts": list(contexts),
        "rounds": rounds,
        "decode_tokens": 2,
        "model": MODEL,
        "hosts": hosts,
    }


def record(run_id: str, variant: str, round_: int, context: int, order: int, tps: float) -> dict:
    now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC).isoformat()
    warmup = round_ < 0
    return {
        "schema": "coldbench.record/1",
        "run_id": run_id,
        "variant": variant,
        "round": round_,
        "order": order,
        "context_tokens": context,
        "prompt_tokens": context,
        "prompt_sha256": sha256_hex(f"{round_}-{context}".encode()),
        "cached_tokens": 0,
        "prefill_s": context / tps,
        "prefill_tps": tps,
        "decode_tokens": 2,
        "decode_s": 0.02,
        "decode_tps": 100.0,
        "output_sha256": sha256_hex(b"out"),
        "output_head": [1, 2],
        "peak_memory_bytes": 1 << 20,
        "counters": {"chunks": 1},
        "started_at": now,
        "ended_at": now,
        "status": "warmup" if warmup else "ok",
        "reason": "warm-up" if warmup else None,
    }


def records_jsonl(
    run_id: str, *, rounds: int = ROUNDS, contexts: tuple[int, ...] = CONTEXTS
) -> tuple[bytes, int]:
    """(records.jsonl, number of measured cells): one warm-up per variant, then every cell."""
    lines = [record(run_id, v, -1, 16, -1, 1000.0) for v in VARIANTS]
    order = 0
    for round_ in range(rounds):
        for context in contexts:
            for index, variant in enumerate(VARIANTS):
                tps = 1000.0 * (1.05 if index else 1.0) + (order % 7)
                lines.append(record(run_id, variant, round_, context, order, tps))
                order += 1
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines), order


def provenance_json(run_id: str) -> bytes:
    return json.dumps(
        {
            "schema": "coldbench.provenance/1",
            "run_id": run_id,
            "created_at": "2026-12-01T09:00:00+00:00",
            "host": {"hostname": "bench", "backend": "cpu"},
            "software": {"python": sys.version.split()[0]},
            "targets": [{"variant": v} for v in VARIANTS],
            "model": {"name": MODEL},
        },
        sort_keys=True,
    ).encode()


def fingerprint(name: str) -> dict[str, Any]:
    return {"hostname": name, "backend": "cpu", "os": "Linux 6.1", "cores": 2}


# --- the service as processes --------------------------------------------------------------


@dataclass
class Service:
    url: str
    database_url: str
    env: dict[str, str]
    tmp: Path
    admin_token: str
    checkout: Path
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)
    # every API process's URL (`--server-processes`); `url` is the first's
    urls: list[str] = field(default_factory=list)
    servers: list[subprocess.Popen[Any]] = field(default_factory=list)

    def start(self, name: str, *args: str) -> subprocess.Popen[Any]:
        with open(self.tmp / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "coldbench", *args],
                env=self.env,
                cwd=self.checkout,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


@contextlib.contextmanager
def running_service(
    postgres: str,
    redis_url: str,
    tmp: Path,
    checkout: Path = REPO,
    extra_env: dict[str, str] | None = None,
    server_workers: int = 1,
    server_processes: int = 1,
) -> Iterator[Service]:
    """Server and Celery worker from `checkout` (its code on PYTHONPATH, started in it).

    `server_processes` > 1: that many `coldbench server` processes over the one database, each
    on its own port and in its own session, as API replicas behind a proxy are deployed
    (docs/DEPLOY.md); the load spreads its agents and submitters over them in turn, as a
    proxy's round robin would, without a proxy's process on the cores."""
    import redis

    name = f"coldbench_load_{secrets.token_hex(4)}"
    admin = sa.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    database_url = sa.engine.make_url(postgres).set(database=name).render_as_string(False)
    prefix = f"coldbench-load-{secrets.token_hex(4)}:"
    admin_token = secrets.token_urlsafe(24)
    ports = [free_port() for _ in range(server_processes)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
    env.update(
        PYTHONPATH=str(checkout),
        COLDBENCH_DATABASE_URL=database_url,
        COLDBENCH_REDIS_URL=redis_url,
        COLDBENCH_CELERY_KEY_PREFIX=prefix,
        COLDBENCH_STATE_DIR=str(tmp / "state"),
        COLDBENCH_ARTIFACT_DIR=str(tmp / "artifacts"),
        COLDBENCH_ADMIN_TOKEN_SHA256=sha256_hex(admin_token.encode()),
        COLDBENCH_MAX_HOSTS_PER_JOB="16",
    )
    env.update(extra_env or {})
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    service = Service(urls[0], database_url, env, tmp, admin_token, checkout, urls=urls)
    try:
        # The checkout's own migrations (a baseline may be older than this one).
        subprocess.run(
            [sys.executable, "-m", "coldbench", "db", "upgrade"],
            env=env,
            cwd=checkout,
            check=True,
            capture_output=True,
        )
        for index, port in enumerate(ports):
            service.servers.append(
                service.start(
                    "server" if index == 0 else f"server-{index}",
                    "server",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                    *(["--workers", str(server_workers)] if server_workers > 1 else []),
                )
            )
        service.start("celery", "celery", "worker", "--pool", "solo", "--loglevel", "WARNING")
        deadline = time.monotonic() + 60
        for url in urls:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit((tmp / "server.log").read_text()[-3000:])
                time.sleep(0.3)
        yield service
    finally:
        service.stop_all()
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
        broker = redis.Redis.from_url(redis_url)
        keys = list(broker.scan_iter(match=f"{prefix}*"))
        if keys:
            broker.delete(*keys)
        broker.close()


# --- the load ------------------------------------------------------------------------------


@dataclass
class Figures:
    submit_s: list[float] = field(default_factory=list)
    # the first submissions after the server started (each statement compiled and prepared
    # on first use): reported apart from the p99 at `submitters` in flight
    cold_submit_s: list[float] = field(default_factory=list)
    submit_under_load_s: list[float] = field(default_factory=list)
    list_s: list[float] = field(default_factory=list)
    lease_s: list[float] = field(default_factory=list)  # lease requests that returned a run
    burst_s: list[float] = field(default_factory=list)  # each agent's first lease, all at once
    # every lease after an agent's first: the steady state, without the burst of 50 at once
    steady_s: list[float] = field(default_factory=list)
    # (start, seconds) of every lease that returned a run, start on time.perf_counter()
    lease_spans: list[tuple[float, float]] = field(default_factory=list)
    # (when, seconds late) of the load generator's own event loop, sampled every 5 ms during
    # the agent phase: a request's measured latency includes the time this loop was late
    generator_lag: list[tuple[float, float]] = field(default_factory=list)
    empty_leases: int = 0
    uploads: int = 0
    completes: int = 0
    heartbeats: int = 0
    errors: list[str] = field(default_factory=list)
    # (run_id, attempt) -> agents that received it; measured cells per completed run
    leased_to: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)
    submitted_jobs: list[str] = field(default_factory=list)
    # fewest jobs submitted and not yet leased seen by the top-up during the agent phase
    min_queued: int = 1 << 30
    # GET /healthz/pool (one SELECT 1 through the same pool) during phase 1 and phase 3
    floor_submit_s: list[float] = field(default_factory=list)
    floor_agents_s: list[float] = field(default_factory=list)


class LoadResponse:
    """What the load reads of an answer: status, body, json()."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise httpx.HTTPStatusError(
                f"{self.status_code} {self.text[:200]}",
                request=None,  # type: ignore[arg-type]
                response=None,  # type: ignore[arg-type]
            )


class LoadClient:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams, for the load phases.

    Why not httpx: on this 2-core machine the load generator shares the cores with the server,
    PostgreSQL and Celery, and its CPU shows up as the server's latency; httpx's AsyncClient
    costs several times this client's CPU per request. It speaks just what the server answers:
    Content-Length bodies (JSON, 204)
    on kept-alive connections, one request at a time per connection. A broken connection
    raises httpx.TransportError, which `send` retries as before.
    """

    def __init__(self, base_url: str) -> None:
        url = httpx.URL(base_url)
        self.host, self.port = str(url.host), int(url.port or 80)
        self.host_header = f"{self.host}:{self.port}".encode()
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        for _reader, writer in self.idle:
            writer.close()
        self.idle.clear()

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> LoadResponse:
        if params:
            url = f"{url}?{'&'.join(f'{k}={v}' for k, v in params.items())}"
        body = b""
        head = [f"{method} {url} HTTP/1.1".encode(), b"Host: " + self.host_header]
        if json is not None:
            body = _json_dumps(json).encode()
            head.append(b"Content-Type: application/json")
        elif content is not None:
            body = content
        if body or method in ("POST", "PUT"):
            head.append(b"Content-Length: " + str(len(body)).encode())
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}".encode())
        message = b"\r\n".join(head) + b"\r\n\r\n" + body
        while self.idle:
            reader, writer = self.idle.pop()
            # Closed by the server meanwhile (its keep-alive timeout): not a failed request.
            if not (reader.at_eof() or writer.is_closing()):
                break
            writer.close()
        else:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as error:
                raise httpx.ConnectError(repr(error)) from error
        try:
            writer.write(message)
            response, keep = await asyncio.wait_for(_read_response(reader), timeout)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            writer.close()
            raise httpx.RemoteProtocolError(repr(error)) from error
        except TimeoutError as error:
            writer.close()
            raise httpx.ReadTimeout(repr(error)) from error
        except BaseException:
            writer.close()
            raise
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return response


def _json_dumps(value: Any) -> str:
    return json.dumps(value)


async def _read_response(reader: asyncio.StreamReader) -> tuple[LoadResponse, bool]:
    """One answer with a Content-Length body (or none); whether the connection stays open."""
    status_line = await reader.readuntil(b"\r\n")
    if not status_line:
        raise ValueError("connection closed")
    status = int(status_line.split(b" ", 2)[1])
    length, keep = 0, True
    while True:
        line = await reader.readuntil(b"\r\n")
        if line == b"\r\n":
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            keep = False
        elif name == b"transfer-encoding":
            raise ValueError("chunked answers are not read by this client")
    content = await reader.readexactly(length) if length else b""
    return LoadResponse(status, content), keep


async def send(client: LoadClient, method: str, url: str, **kwargs: Any) -> LoadResponse:
    """One request, sent again (up to 3 times) when the connection broke before an answer: a
    kept-alive connection the server closed meanwhile is a client-side hiccup, not a result.
    Every call the agents make is idempotent on the server (the same upload, the same
    complete); a lease lost this way would show as a run left leased (counted as lost)."""
    for attempt in range(3):
        try:
            return await client.request(method, url, **kwargs)
        except httpx.TransportError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


FLOOR_EVERY_S = 0.02


async def probe_floor(
    client: LoadClient, into: list[float], errors: list[str], stop: asyncio.Event
) -> None:
    """`GET /healthz/pool` one at a time, every FLOOR_EVERY_S, until `stop`: the floor the
    leases and submissions of the same phase are compared with."""
    while not stop.is_set():
        started = time.perf_counter()
        response = await send(client, "GET", "/healthz/pool")
        if response.status_code == 200:
            into.append(time.perf_counter() - started)
        elif response.status_code != 404:  # 404: a checkout without the route (a baseline)
            errors.append(f"floor: {response.status_code}")
        await asyncio.sleep(FLOOR_EVERY_S)


@contextlib.asynccontextmanager
async def floor_beside(client: LoadClient, into: list[float], errors: list[str]) -> Any:
    """The floor probed for as long as the block runs."""
    stop = asyncio.Event()
    task = asyncio.create_task(probe_floor(client, into, errors, stop))
    try:
        yield
    finally:
        stop.set()
        await task


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)


async def submit(
    client: LoadClient, key: str, spec: dict, into: list[float], errors: list[str]
) -> str | None:
    """A job's id, or None (the error recorded)."""
    started = time.perf_counter()
    try:
        response = await send(
            client, "POST", "/api/v1/jobs", json=spec, headers={"Authorization": f"Bearer {key}"}
        )
    except httpx.HTTPError as error:
        errors.append(f"submit: {error!r}")
        return None
    into.append(time.perf_counter() - started)
    if response.status_code != 201:
        errors.append(f"submit: {response.status_code} {response.text[:300]}")
        return None
    return str(response.json()["id"])


async def agent(
    client: LoadClient,
    name: str,
    secret: str,
    figures: Figures,
    stop_at: float,
    measure_s: float,
) -> None:
    auth = {"Authorization": f"Bearer {secret}"}
    first = True
    while time.monotonic() < stop_at:
        try:
            await agent_cycle(client, name, auth, figures, measure_s, first)
            first = False
        except httpx.HTTPError as error:
            figures.errors.append(f"{name}: {error!r}")
            await asyncio.sleep(0.5)


async def agent_cycle(
    client: LoadClient,
    name: str,
    auth: dict[str, str],
    figures: Figures,
    measure_s: float,
    first: bool,
) -> None:
    """One lease and, when it brings a run, its heartbeat, `measure_s` of simulated measuring
    (a real run takes minutes), the uploads and the completion."""
    body = {"fingerprint": fingerprint(name), "wait_s": 5}
    started = time.perf_counter()
    try:
        response = await send(client, "POST", "/api/v1/leases", json=body, headers=auth, timeout=30)
    except httpx.HTTPError as error:
        figures.errors.append(f"lease: {error!r}")
        await asyncio.sleep(0.5)
        return
    if response.status_code == 204:
        figures.empty_leases += 1
        return
    if response.status_code != 200:
        figures.errors.append(f"lease: {response.status_code} {response.text[:200]}")
        await asyncio.sleep(0.5)
        return
    figures.lease_s.append(time.perf_counter() - started)
    figures.lease_spans.append((started, figures.lease_s[-1]))
    if first:
        figures.burst_s.append(figures.lease_s[-1])
    else:
        figures.steady_s.append(figures.lease_s[-1])
    lease = response.json()
    run_id, attempt = lease["run_id"], lease["attempt"]
    figures.leased_to.setdefault((run_id, attempt), []).append(name)
    beat = await send(
        client,
        "POST",
        "/api/v1/workers/heartbeat",
        json={"run_id": run_id, "attempt": attempt, "progress": None},
        headers=auth,
    )
    figures.heartbeats += 1
    if beat.status_code != 200:
        figures.errors.append(f"heartbeat: {beat.status_code} {beat.text[:200]}")
    await asyncio.sleep(measure_s * (0.5 + random.random()))
    records, cells = records_jsonl(run_id)
    files = {"records.jsonl": records, "provenance.json": provenance_json(run_id)}
    for file_name, content in files.items():
        put = await send(
            client,
            "PUT",
            f"/api/v1/runs/{run_id}/artifacts/{file_name}",
            params={"attempt": attempt},
            content=content,
            headers={**auth, "X-Content-SHA256": sha256_hex(content)},
        )
        if put.status_code not in (200, 201):
            figures.errors.append(f"upload: {put.status_code} {put.text[:200]}")
        figures.uploads += 1
    manifest = {
        "format": "coldbench.evidence/1",
        "files": {n: {"sha256": sha256_hex(b), "bytes": len(b)} for n, b in files.items()},
        "provenance": {},
    }
    done = await send(
        client,
        "POST",
        f"/api/v1/runs/{run_id}/complete",
        json={"attempt": attempt, "status": "succeeded", "reason": None, "manifest": manifest},
        headers=auth,
    )
    if done.status_code == 200:
        figures.completes += 1
        figures.measured[run_id] = cells
    else:
        figures.errors.append(f"complete: {done.status_code} {done.text[:200]}")


async def load(service: Service, args: argparse.Namespace, figures: Figures) -> dict[str, float]:
    # One client per API process; agent i and the i-th submitter talk to process i mod N.
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(LoadClient(url)) for url in service.urls]
        client = clients[0]
        admin = {"Authorization": f"Bearer {service.admin_token}"}
        key = (
            await send(
                client, "POST", "/api/v1/admin/apikeys", json={"name": "load"}, headers=admin
            )
        ).json()["key"]
        tokens = [
            (
                await send(client, "POST", "/api/v1/admin/enrollments", json={}, headers=admin)
            ).json()["token"]
            for _ in range(args.workers)
        ]

        async def register(index: int) -> tuple[str, str]:
            name = f"load-{index:03d}"
            for _ in range(5):
                response = await send(
                    client,
                    "POST",
                    "/api/v1/workers/register",
                    json={"name": name, "fingerprint": fingerprint(name), "models": [MODEL]},
                    headers={"Authorization": f"Bearer {tokens[index]}"},
                )
                # 50 registrations at once wait for the sync pool's 8 connections; on a busy
                # machine some wait past the request timeout and are told to retry (503,
                # Retry-After: 1), as an agent does. Set-up, not a measured figure.
                if response.status_code != 503:
                    break
                await asyncio.sleep(1)
            response.raise_for_status()
            return name, str(response.json()["secret"])

        agents = await asyncio.gather(*(register(i) for i in range(args.workers)))

        # 0. one round of `submitters` submissions, the server's first: reported apart
        async def submit_one(index: int, latencies: list[float]) -> None:
            """One job through submitter `index`'s client, its latency kept in `latencies`."""
            job_id = await submit(
                clients[index % len(clients)], key, job_spec(), latencies, figures.errors
            )
            if job_id is not None:
                figures.submitted_jobs.append(job_id)

        await asyncio.gather(
            *(submit_one(i, figures.cold_submit_s) for i in range(args.submitters))
        )

        # 1. submissions at `submitters` in flight
        remaining = list(range(args.jobs))

        async def submitter(index: int) -> None:
            while remaining:
                remaining.pop()
                await submit_one(index, figures.submit_s)

        started = time.perf_counter()
        async with floor_beside(client, figures.floor_submit_s, figures.errors):
            await asyncio.gather(*(submitter(i) for i in range(args.submitters)))
        submit_wall = time.perf_counter() - started

        # 2. 50 concurrent job lists, four times
        async def list_jobs(index: int) -> None:
            t0 = time.perf_counter()
            response = await send(
                clients[index % len(clients)],
                "GET",
                "/api/v1/jobs",
                params={"limit": 100},
                headers={"Authorization": f"Bearer {key}"},
            )
            figures.list_s.append(time.perf_counter() - t0)
            if response.status_code != 200:
                figures.errors.append(f"list: {response.status_code}")

        for _ in range(4):
            await asyncio.gather(*(list_jobs(i) for i in range(50)))

        # 3. agents for `seconds`, `--topup` submitters keeping work queued (one could not:
        # at a few hundred ms a submission under this load, the agents emptied the queue and
        # waited for work, which is not what a claim "with work queued" measures)
        stop_at = time.monotonic() + args.seconds

        async def top_up(index: int) -> None:
            while time.monotonic() < stop_at:
                outstanding = len(figures.submitted_jobs) - len(figures.leased_to)
                figures.min_queued = min(figures.min_queued, outstanding)
                if outstanding < 2 * args.workers:
                    await submit_one(index, figures.submit_under_load_s)
                else:
                    await asyncio.sleep(0.05)

        async def sample_lag() -> None:
            while time.monotonic() < stop_at:
                before = time.perf_counter()
                await asyncio.sleep(LAG_SAMPLE_S)
                figures.generator_lag.append((before, time.perf_counter() - before - LAG_SAMPLE_S))

        started = time.perf_counter()
        async with floor_beside(client, figures.floor_agents_s, figures.errors):
            await asyncio.gather(
                sample_lag(),
                *(top_up(i) for i in range(args.topup)),
                *(
                    agent(clients[i % len(clients)], name, secret, figures, stop_at, args.measure_s)
                    for i, (name, secret) in enumerate(agents)
                ),
            )
        agents_wall = time.perf_counter() - started
    return {"submit_wall_s": submit_wall, "agents_wall_s": agents_wall}


def drain(service: Service, figures: Figures, timeout_s: float) -> dict[str, Any]:
    """Wait for ingest of every completed run; count lost and duplicated from the database."""
    engine = sa.create_engine(service.database_url)
    deadline = time.monotonic() + timeout_s
    try:
        with engine.connect() as connection:
            while True:
                pending = connection.execute(
                    sa.text("select count(*) from runs where state = 'completed'")
                ).scalar_one()
                connection.commit()
                if pending == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            runs = {
                row.id: row
                for row in connection.execute(
                    sa.text("select id, state, attempt, completed_at, processed_at from runs")
                )
            }
            cells = dict(
                connection.execute(
                    sa.text(
                        "select run_id, count(*) from cells where status != 'warmup' "
                        "group by run_id"
                    )
                ).all()
            )
            distinct_cells = dict(
                connection.execute(
                    sa.text(
                        "select run_id, count(distinct (variant, round, context_tokens)) "
                        "from cells where status != 'warmup' group by run_id"
                    )
                ).all()
            )
            attempts = dict(
                connection.execute(
                    sa.text("select run_id, count(*) from run_attempts group by run_id")
                ).all()
            )
            window = connection.execute(
                sa.text(
                    "select min(completed_at), max(processed_at) from runs "
                    "where state = 'processed'"
                )
            ).one()
    finally:
        engine.dispose()
    # Lost: a run an agent completed that was not ingested, or a measured cell missing; a run
    # left leased with nobody working on it.
    lost_runs = sum(1 for run_id in figures.measured if runs[run_id].state != "processed")
    lost_cells = sum(max(0, n - cells.get(run_id, 0)) for run_id, n in figures.measured.items())
    stranded = sum(1 for run in runs.values() if run.state == "leased")
    # Duplicated: one (run, attempt) leased to two agents, a run leased twice without an
    # expiry, or a measured cell stored twice.
    dup_leases = sum(1 for holders in figures.leased_to.values() if len(holders) > 1)
    dup_attempts = sum(1 for run_id in figures.measured if attempts.get(run_id, 0) > 1)
    dup_cells = sum(cells[r] - distinct_cells[r] for r in cells)
    ingested = sum(cells.values())
    ingest_s = (window[1] - window[0]).total_seconds() if window[0] and window[1] else float("nan")
    return {
        "lost_runs": lost_runs + stranded,
        "lost_records": lost_cells,
        "dup_leases": dup_leases + dup_attempts,
        "dup_records": dup_cells,
        "ingested_records": ingested,
        "ingest_records_per_s": ingested / ingest_s if ingest_s and ingest_s > 0 else 0.0,
        "not_ingested_in_time": sum(1 for r in runs.values() if r.state == "completed"),
    }


def db_sessions(service: Service) -> int:
    """Sessions ever opened on the service's database (PostgreSQL 14+ counts them)."""
    name = sa.engine.make_url(service.database_url).database
    engine = sa.create_engine(service.database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            # This connection's own session is counted when it ends: the next call sees it.
            return int(
                connection.execute(
                    sa.text(
                        "select coalesce(sessions, 0) from pg_stat_database where datname = :n"
                    ),
                    {"n": name},
                ).scalar_one()
            )
    finally:
        engine.dispose()


ALONE_KINDS = ("submit", "list", "lease", "heartbeat", "upload", "complete")


def one_at_a_time(service: Service, cycles: int) -> dict[str, float | None]:
    """`cycles` sequential cycles of one more agent, each request alone on the idle server:
    p50 and p99 latency per kind, and server CPU per request of that kind (the process's CPU
    over all requests of the kind, divided: /proc counts in 10 ms ticks)."""
    client = httpx.Client(base_url=service.url, timeout=60)
    server_pid = service.processes[0].pid
    admin = {"Authorization": f"Bearer {service.admin_token}"}
    key = client.post("/api/v1/admin/apikeys", json={"name": "alone"}, headers=admin).json()
    submitter = {"Authorization": f"Bearer {key['key']}"}
    token = client.post("/api/v1/admin/enrollments", json={}, headers=admin).json()["token"]
    name = "alone"
    registered = client.post(
        "/api/v1/workers/register",
        json={"name": name, "fingerprint": fingerprint(name), "models": [MODEL]},
        headers={"Authorization": f"Bearer {token}"},
    )
    registered.raise_for_status()
    auth = {"Authorization": f"Bearer {registered.json()['secret']}"}
    latency: dict[str, list[float]] = {kind: [] for kind in ALONE_KINDS}
    cpu: dict[str, float] = dict.fromkeys(ALONE_KINDS, 0.0)

    def timed(kind: str, method: str, url: str, **kwargs: Any) -> httpx.Response:
        cpu_before, started = cpu_s(server_pid), time.perf_counter()
        response = client.request(method, url, **kwargs)
        latency[kind].append(time.perf_counter() - started)
        cpu[kind] += cpu_s(server_pid) - cpu_before
        if response.status_code >= 300:
            raise SystemExit(f"one at a time: {kind} {response.status_code} {response.text[:300]}")
        return response

    try:
        for _ in range(cycles):
            timed("submit", "POST", "/api/v1/jobs", json=job_spec(), headers=submitter)
            timed("list", "GET", "/api/v1/jobs", params={"limit": 100}, headers=submitter)
            lease = timed(
                "lease",
                "POST",
                "/api/v1/leases",
                json={"fingerprint": fingerprint(name), "wait_s": 5},
                headers=auth,
            ).json()
            run_id, attempt = lease["run_id"], lease["attempt"]
            timed(
                "heartbeat",
                "POST",
                "/api/v1/workers/heartbeat",
                json={"run_id": run_id, "attempt": attempt, "progress": None},
                headers=auth,
            )
            files = {
                "records.jsonl": records_jsonl(run_id)[0],
                "provenance.json": provenance_json(run_id),
            }
            for file_name, content in files.items():
                timed(
                    "upload",
                    "PUT",
                    f"/api/v1/runs/{run_id}/artifacts/{file_name}",
                    params={"attempt": attempt},
                    content=content,
                    headers={**auth, "X-Content-SHA256": sha256_hex(content)},
                )
            manifest = {
                "format": "coldbench.evidence/1",
                "files": {n: {"sha256": sha256_hex(b), "bytes": len(b)} for n, b in files.items()},
                "provenance": {},
            }
            timed(
                "complete",
                "POST",
                f"/api/v1/runs/{run_id}/complete",
                json={
                    "attempt": attempt,
                    "status": "succeeded",
                    "reason": None,
                    "manifest": manifest,
                },
                headers=auth,
            )
    finally:
        client.close()
    figures: dict[str, float | None] = {}
    for kind in ALONE_KINDS:
        values = latency[kind]
        figures[f"alone_{kind}_p50_ms"] = ms(statistics.median(values)) if values else None
        figures[f"alone_{kind}_p99_ms"] = ms(percentile(values, 99))
        figures[f"alone_{kind}_server_cpu_ms"] = (
            round(1000 * cpu[kind] / len(values), 2) if values else None
        )
    return figures


def render_report(service: Service, cells: int) -> dict[str, float]:
    """A job of `cells` measured cells (5 hosts x 2 variants x 10 contexts x rounds), analysed
    and rendered by the code the Celery tasks run; seconds of each step."""
    from sqlalchemy.dialects import postgresql

    from coldbench.api.artifacts.models import Artifact
    from coldbench.api.artifacts.store import LocalArtifactStore
    from coldbench.api.database import make_engine, make_sessionmaker
    from coldbench.api.evidence import service as evidence_service
    from coldbench.api.evidence.models import Evidence
    from coldbench.api.evidence.page import PAGE_FILE
    from coldbench.api.jobs.models import Job
    from coldbench.api.runs import ingest
    from coldbench.api.runs.models import Cell, Run

    hosts, contexts = 5, tuple(64 * (i + 1) for i in range(10))
    rounds = max(1, cells // (hosts * len(VARIANTS) * len(contexts)))
    store = LocalArtifactStore(service.tmp / "artifacts")
    engine = make_engine(service.database_url)
    sessionmaker = make_sessionmaker(engine)
    spec = job_spec(hosts=hosts, rounds=rounds, contexts=contexts)
    job_id = secrets.token_hex(8)
    with sessionmaker() as db_session:
        db_session.add(Job(id=job_id, spec=spec, spec_sha256="0" * 64, state="analyzing"))
        db_session.flush()
        for slot in range(hosts):
            run_id = secrets.token_hex(8)
            db_session.add(Run(id=run_id, job_id=job_id, slot=slot, attempt=1, state="processed"))
            db_session.flush()
            provenance = store.put_bytes(provenance_json(run_id))
            db_session.add(
                Artifact(
                    run_id=run_id,
                    attempt=1,
                    name="provenance.json",
                    sha256=provenance.sha256,
                    bytes=provenance.bytes,
                    storage_path=provenance.storage_path,
                )
            )
            raw, _ = records_jsonl(run_id, rounds=rounds, contexts=contexts)
            run = db_session.get(Run, run_id)
            rows, problems = ingest.parse_cells(raw, run)
            assert not problems, problems[:3]
            for start in range(0, len(rows), 2000):
                db_session.execute(postgresql.insert(Cell).values(rows[start : start + 2000]))
        db_session.commit()
        measured = db_session.scalar(
            sa.select(sa.func.count()).where(Cell.job_id == job_id, Cell.status != "warmup")
        )
    # A Celery worker prepares these when it starts (`coldbench.api.tasks.prepare_analysis`, on
    # `worker_init`): not part of a render.
    from coldbench.api.tasks import prepare_analysis

    prepare_analysis()

    with sessionmaker() as db_session:
        started, cpu_started = time.perf_counter(), time.process_time()
        ready = evidence_service.analyze_job(db_session=db_session, store=store, job_id=job_id)
        analyze_s, analyze_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        assert ready, db_session.get(Job, job_id).reason
        started, cpu_started = time.perf_counter(), time.process_time()
        evidence_id = evidence_service.render_evidence(
            db_session=db_session, store=store, job_id=job_id
        )
        publish_s = time.perf_counter() - started
        publish_cpu_s = time.process_time() - cpu_started
    started = time.perf_counter()
    page = httpx.get(f"{service.url}/e/{evidence_id}", timeout=60)
    serve_s = time.perf_counter() - started
    assert page.status_code == 200, page.status_code
    # Side by side: the same evidence without its stored page, rendered by the server on its
    # first request (the path of evidence published before page.html was stored).
    with sessionmaker() as db_session:
        row = db_session.get(Evidence, evidence_id)
        row.files = {name: entry for name, entry in row.files.items() if name != PAGE_FILE}
        db_session.commit()
    started = time.perf_counter()
    rendered = httpx.get(f"{service.url}/e/{evidence_id}", timeout=60)
    render_serve_s = time.perf_counter() - started
    assert rendered.status_code == 200, rendered.status_code
    engine.dispose()
    return {
        "render_cells": measured,
        "render_analyze_s": analyze_s,
        "render_analyze_cpu_s": analyze_cpu_s,
        "render_publish_s": publish_s,
        "render_publish_cpu_s": publish_cpu_s,
        "render_serve_s": serve_s,
        "render_serve_unstored_s": render_serve_s,
        "render_report_bytes": len(page.content),
    }


def cpu_s(pid: int) -> float:
    """User and system CPU seconds so far of a process and its children (a server started with
    `--workers N` serves from N child processes; Linux /proc)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if stat.parent.name == str(pid) or fields[1] == str(pid):
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class RunnableSampler:
    """Runnable processes on the machine, sampled every `every_s` during the agent phase: all
    of them, and the benchmark's own (this load generator, the server and Celery processes
    and their children, and the PostgreSQL backends of the benchmark's database). The load
    average counts the machine's; this says how much of it the benchmark itself makes.

    One thread per process is read (/proc/PID/stat): the server, Celery's solo worker and
    PostgreSQL's backends each do their work on one thread."""

    def __init__(self, roots: list[int], database: str, every_s: float = 0.25) -> None:
        self.roots, self.database, self.every_s = set(roots), database, every_s
        self.samples: list[tuple[int, int]] = []  # (runnable on the machine, the benchmark's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RunnableSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tag = f" {self.database} ".encode()
        while not self._stop.wait(self.every_s):
            states: dict[int, tuple[str, int]] = {}
            for stat in Path("/proc").glob("[0-9]*/stat"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = stat.read_text().rsplit(")", 1)[1].split()
                    states[int(stat.parent.name)] = (fields[0], int(fields[1]))
            ours = set(self.roots)
            for pid, (_, parent) in states.items():
                if parent in ours:
                    ours.add(pid)
            for pid, (state, _) in states.items():
                if state == "R" and pid not in ours:
                    with contextlib.suppress(OSError):
                        if tag in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "):
                            ours.add(pid)
            running = [pid for pid, (state, _) in states.items() if state == "R"]
            # /proc/PID/stat is the state of a process's first thread: this sampler's own
            # thread is not in these counts, the generator's event loop thread is.
            self.samples.append((len(running), sum(1 for pid in running if pid in ours)))

    def means(self) -> tuple[float | None, float | None]:
        if not self.samples:
            return None, None
        return (
            round(statistics.mean(total for total, _ in self.samples), 2),
            round(statistics.mean(own for _, own in self.samples), 2),
        )


def sched_s(pids: list[int]) -> tuple[float, float]:
    """(seconds on a core, seconds runnable and waiting for one) so far of every thread of
    `pids` (Linux /proc/PID/task/TID/schedstat, in ns): the wait is what contention for the
    cores costs a process, whatever its own code does."""
    ran = waited = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().split()
                ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran / 1e9, waited / 1e9


def measure(
    checkout: Path, args: argparse.Namespace, *, render: bool, processes: int = 1
) -> dict[str, Any]:
    """One full load against the server and Celery worker of `checkout` (`processes` API
    processes); the figures."""
    figures = Figures()
    with (
        tempfile.TemporaryDirectory(prefix="coldbench-load-") as tmp,
        running_service(
            args.postgres,
            args.redis,
            Path(tmp),
            checkout,
            dict(args.server_env),
            server_workers=args.server_workers,
            server_processes=processes,
        ) as service,
    ):
        server_pid = service.servers[0].pid
        server_pids = [proc.pid for proc in service.servers]
        if args.pin:
            # The server alone on core 0; this load generator and the Celery worker on core 1
            # (PostgreSQL and everything else on the machine stay where the kernel puts them).
            os.sched_setaffinity(server_pid, {0})
            os.sched_setaffinity(service.processes[-1].pid, {1})
            os.sched_setaffinity(0, {1})
        cpu_before = sum(cpu_s(pid) for pid in server_pids)
        sched_before = sched_s(server_pids)
        sessions_before = db_sessions(service)
        sampler = RunnableSampler(
            [os.getpid(), *(proc.pid for proc in service.processes)],
            str(sa.engine.make_url(service.database_url).database),
        )
        with sampler:
            walls = asyncio.run(load(service, args, figures))
        runnable, own_runnable = sampler.means()
        server_cpu = sum(cpu_s(pid) for pid in server_pids) - cpu_before
        sched_after = sched_s(server_pids)
        server_ran_s = sched_after[0] - sched_before[0]
        server_waited_s = sched_after[1] - sched_before[1]
        sessions = db_sessions(service) - sessions_before
        counted = drain(service, figures, args.drain_s)
        alone = one_at_a_time(service, args.single) if args.single > 0 else {}
        rendered = render_report(service, args.render_cells) if render else {}
        # The server logs at WARNING and above here: anything it said is worth reading.
        warnings = [
            line
            for log in sorted(Path(tmp).glob("server*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if "WARNING" in line or "ERROR" in line
        ]
    leases = len(figures.lease_s)
    origin = figures.lease_spans[0][0] if figures.lease_spans else 0.0
    lags = [lag for _, lag in figures.generator_lag]
    requests = (
        len(figures.submit_s)
        + len(figures.submit_under_load_s)
        + len(figures.list_s)
        + leases
        + figures.empty_leases
        + figures.heartbeats
        + figures.uploads
        + figures.completes
    )
    lease_p50 = ms(statistics.median(figures.lease_s)) if leases else None
    lease_p99 = ms(percentile(figures.lease_s, 99))
    submit_p50 = ms(statistics.median(figures.submit_s)) if figures.submit_s else None
    submit_p99 = ms(percentile(figures.submit_s, 99))
    submit_under_load_p99 = ms(percentile(figures.submit_under_load_s, 99))
    floor: dict[str, float | None] = {}
    for phase, samples in (("submit", figures.floor_submit_s), ("agents", figures.floor_agents_s)):
        floor[f"floor_{phase}_p50_ms"] = ms(statistics.median(samples)) if samples else None
        floor[f"floor_{phase}_p99_ms"] = ms(percentile(samples, 99)) if samples else None
        floor[f"floor_{phase}_requests"] = len(samples)
    return {
        "workers": args.workers,
        "server_processes": processes,
        **floor,
        # Against the floor of the same phase (GET /healthz/pool: one SELECT 1, same pool).
        "lease_p50_over_floor": ratio(lease_p50, floor["floor_agents_p50_ms"]),
        "lease_p99_over_floor": ratio(lease_p99, floor["floor_agents_p99_ms"]),
        "submit_p50_over_floor": ratio(submit_p50, floor["floor_submit_p50_ms"]),
        "submit_p99_over_floor": ratio(submit_p99, floor["floor_submit_p99_ms"]),
        "submit_under_load_p99_over_floor": ratio(
            submit_under_load_p99, floor["floor_agents_p99_ms"]
        ),
        "seconds": args.seconds,
        "leases": leases,
        "leases_per_s": round(leases / walls["agents_wall_s"], 1),
        "lease_p50_ms": lease_p50,
        "lease_p99_ms": lease_p99,
        "lease_burst_p99_ms": ms(percentile(figures.burst_s, 99)),
        "lease_steady_p99_ms": ms(percentile(figures.steady_s, 99)),
        # Leases that started SETTLED_S or more after the first: without the start-up (all
        # agents began together, so their first leases, and the heartbeats, uploads,
        # completions and second leases of their first runs, arrive together on a server that
        # has just started), which decides a 30 s run's p99.
        "lease_settled_p99_ms": ms(
            percentile([d for start, d in figures.lease_spans if start - origin >= SETTLED_S], 99)
        ),
        # The load generator's own event loop, late by this much: in every latency above.
        "generator_lag_p99_ms": ms(percentile(lags, 99)),
        "generator_lag_max_ms": ms(max(lags, default=float("nan"))),
        "slowest_leases": [
            {
                "at_s": round(start - origin, 2),
                "ms": ms(seconds),
                "generator_stall_ms": ms(stall_within(figures.generator_lag, start, seconds)),
            }
            for start, seconds in sorted(figures.lease_spans, key=lambda span: -span[1])[:10]
        ],
        "measure_s": args.measure_s,
        "empty_leases": figures.empty_leases,
        "min_queued_jobs": figures.min_queued if figures.min_queued < 1 << 30 else None,
        "submit_in_flight": args.submitters,
        "submits": len(figures.submit_s),
        "submit_p50_ms": submit_p50,
        "submit_cold_max_ms": ms(max(figures.cold_submit_s, default=float("nan"))),
        "submit_p99_ms": submit_p99,
        "submit_under_load_p99_ms": submit_under_load_p99,
        "list_p50_ms": ms(statistics.median(figures.list_s)),
        "list_p99_ms": ms(percentile(figures.list_s, 99)),
        "uploads_per_s": round(figures.uploads / walls["agents_wall_s"], 1),
        "completes": figures.completes,
        "ingest_records_per_s": round(counted["ingest_records_per_s"], 1),
        "ingested_records": counted["ingested_records"],
        "lost_runs": counted["lost_runs"],
        "lost_records": counted["lost_records"],
        "dup_leases": counted["dup_leases"],
        "dup_records": counted["dup_records"],
        "not_ingested_in_time": counted["not_ingested_in_time"],
        "errors": len(figures.errors),
        "first_errors": figures.errors[:5] + [f"server log: {w[:300]}" for w in warnings[:3]],
        "server_warnings": len(warnings),
        # Server CPU per request: what the service costs, whatever else loads the machine.
        "server_cpu_ms_per_request": round(1000 * server_cpu / max(1, requests), 2),
        # The server processes' time runnable but waiting for a core during the load phases,
        # per request and as a share of their time on a core (schedstat): the cores' queue.
        "server_core_wait_ms_per_request": round(1000 * server_waited_s / max(1, requests), 2),
        "server_core_wait_per_cpu_s": round(server_waited_s / server_ran_s, 2)
        if server_ran_s
        else None,
        # PostgreSQL sessions the server (and Celery) opened during the load: each one a new
        # backend process, paid in CPU by the database.
        "db_sessions_opened": sessions,
        **alone,
        "load_average_1m": round(os.getloadavg()[0], 2),
        # Runnable processes, mean of samples every 0.25 s during the load phases: on the
        # machine, and the benchmark's own (its generator, server, Celery, PostgreSQL backends)
        "runnable_mean": runnable,
        "own_runnable_mean": own_runnable,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in rendered.items()},
    }


def stall_within(lag: list[tuple[float, float]], start: float, seconds: float) -> float:
    """The longest the generator's loop was late during [start, start + seconds] (a sample
    taken at `when` that came back late covers [when, when + its lag])."""
    return max(
        (late for when, late in lag if when < start + seconds and when + late > start),
        default=0.0,
    )


def report(label: str, result: dict[str, Any]) -> None:
    print(
        f"{label}: agents {result['workers']}, {result['server_processes']} server processes, "
        f"{result['seconds']:g} s: {result['leases']} "
        f"leases ({result['leases_per_s']}/s), load average {result['load_average_1m']} "
        f"(runnable: {result['runnable_mean']} on the machine, the benchmark's own "
        f"{result['own_runnable_mean']}); "
        f"fewest jobs queued {result['min_queued_jobs']}, leases that found none "
        f"{result['empty_leases']}"
    )
    print(
        f"  lease p50 {result['lease_p50_ms']} ms, p99 {result['lease_p99_ms']} ms; "
        f"first leases of all agents at once p99 {result['lease_burst_p99_ms']} ms; "
        f"after each agent's first p99 {result['lease_steady_p99_ms']} ms; from {SETTLED_S:g} s"
        f" after the first on p99 {result['lease_settled_p99_ms']} ms"
    )
    print(
        f"  the load generator's own loop late: p99 {result['generator_lag_p99_ms']} ms, "
        f"longest {result['generator_lag_max_ms']} ms; slowest leases (s after the first, ms, "
        "generator's longest stall in it): "
        + ", ".join(
            f"{lease['at_s']} s {lease['ms']} ({lease['generator_stall_ms']})"
            for lease in result["slowest_leases"]
        )
    )
    print(
        f"  submit at {result['submit_in_flight']} in flight: p50 {result['submit_p50_ms']} ms, "
        f"p99 {result['submit_p99_ms']} ms; during the agent phase p99 "
        f"{result['submit_under_load_p99_ms']} ms; the server's first {result['submit_in_flight']}"
        f" at once, slowest {result['submit_cold_max_ms']} ms"
    )
    print(f"  GET /jobs x50: p50 {result['list_p50_ms']} ms, p99 {result['list_p99_ms']} ms")
    print(
        f"  floor (GET /healthz/pool, one SELECT 1 through the same pool): during the submit "
        f"phase p50 {result['floor_submit_p50_ms']} / p99 {result['floor_submit_p99_ms']} ms "
        f"({result['floor_submit_requests']} requests), during the agent phase p50 "
        f"{result['floor_agents_p50_ms']} / p99 {result['floor_agents_p99_ms']} ms "
        f"({result['floor_agents_requests']} requests)"
    )
    print(
        f"  against the floor: lease p50 {result['lease_p50_over_floor']}x, p99 "
        f"{result['lease_p99_over_floor']}x; submit p50 {result['submit_p50_over_floor']}x, p99 "
        f"{result['submit_p99_over_floor']}x; submit during the agent phase p99 "
        f"{result['submit_under_load_p99_over_floor']}x"
    )
    print(
        f"  uploads {result['uploads_per_s']}/s, ingest {result['ingest_records_per_s']} records/s"
        f", server CPU {result['server_cpu_ms_per_request']} ms per request, waiting for a "
        f"core {result['server_core_wait_ms_per_request']} ms per request "
        f"({result['server_core_wait_per_cpu_s']} s per s on a core)"
    )
    print(
        f"  lost runs {result['lost_runs']}, lost records {result['lost_records']}, "
        f"duplicated leases {result['dup_leases']}, duplicated records {result['dup_records']}"
        f", errors {result['errors']}, server log warnings {result['server_warnings']}"
    )
    print(f"  PostgreSQL sessions opened during the load: {result['db_sessions_opened']}")
    if "alone_lease_p50_ms" in result:
        print("  one request at a time (latency p50 / p99, server CPU per request):")
        for kind in ALONE_KINDS:
            print(
                f"    {kind:9s} {result[f'alone_{kind}_p50_ms']} / {result[f'alone_{kind}_p99_ms']}"
                f" ms, CPU {result[f'alone_{kind}_server_cpu_ms']} ms"
            )
    if "render_cells" in result:
        print(
            f"  report of {result['render_cells']} cells: analyse+render "
            f"{result['render_analyze_s']:.2f} s (CPU {result['render_analyze_cpu_s']:.2f} s), "
            f"publish (zip and page) {result['render_publish_s']:.2f} s "
            f"(CPU {result['render_publish_cpu_s']:.2f} s); first request of its page "
            f"{result['render_serve_s']:.2f} s, of the page rendered per request (no stored "
            f"page.html) {result['render_serve_unstored_s']:.2f} s, ratio "
            f"{result['render_serve_unstored_s'] / result['render_serve_s']:.1f}x"
        )
    for error in result["first_errors"]:
        print(f"  error: {error}")


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("COLDBENCH_"):
        raise argparse.ArgumentTypeError(f"{text!r} is not COLDBENCH_NAME=VALUE")
    return name, value


RATIO_KEYS = (
    "lease_p99_over_floor",
    "submit_p99_over_floor",
    "lease_p50_ms",
    "lease_p99_ms",
    "lease_burst_p99_ms",
    "lease_steady_p99_ms",
    "lease_settled_p99_ms",
    "submit_p99_ms",
    "submit_under_load_p99_ms",
    "list_p99_ms",
    "leases_per_s",
    "server_cpu_ms_per_request",
    "server_core_wait_ms_per_request",
    "alone_lease_p50_ms",
    "alone_submit_p50_ms",
    "alone_lease_server_cpu_ms",
    "alone_submit_server_cpu_ms",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=50, help="simulated agents")
    parser.add_argument("--seconds", type=float, default=30, help="length of the agent phase")
    parser.add_argument(
        "--measure-s",
        type=float,
        default=2.0,
        help="simulated measuring per run, mean seconds (0: agents hammer the server)",
    )
    parser.add_argument("--submitters", type=int, default=25, help="submissions in flight")
    parser.add_argument("--jobs", type=int, default=200, help="jobs of the submit phase")
    parser.add_argument(
        "--topup", type=int, default=4, help="submitters keeping work queued for the agents"
    )
    parser.add_argument("--render-cells", type=int, default=10_000, help="0 skips the report")
    parser.add_argument(
        "--single",
        type=int,
        default=30,
        help="cycles of requests sent one at a time after the load (0 skips them)",
    )
    parser.add_argument(
        "--server-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="COLDBENCH_NAME=VALUE",
        help="a setting for the server and Celery worker of both checkouts (repeatable)",
    )
    parser.add_argument(
        "--server-workers",
        type=int,
        default=1,
        help="`coldbench server --workers N` for both checkouts (uvicorn worker processes)",
    )
    parser.add_argument(
        "--server-processes",
        type=int,
        default=1,
        help="`coldbench server` processes of this checkout over the one database, each in its "
        "own session on its own port (API replicas); agents and submitters spread over them",
    )
    parser.add_argument(
        "--baseline-processes",
        type=int,
        default=1,
        help="`coldbench server` processes of the --baseline checkout, as --server-processes",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin the server to core 0, the load generator and the Celery worker to core 1",
    )
    parser.add_argument("--drain-s", type=float, default=180, help="longest wait for ingest")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. a git worktree of an older commit): the same load against "
        "its server first, then ratios this/baseline",
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "COLDBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--redis", default=os.environ.get("COLDBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    baseline = (
        measure(args.baseline.resolve(), args, render=False, processes=args.baseline_processes)
        if args.baseline
        else None
    )
    if baseline is not None:
        report(f"baseline {args.baseline}", baseline)
        # The baseline's own JSON line too (its load and runnable counts are its own).
        print(json.dumps({"baseline": str(args.baseline), **baseline}, sort_keys=True))
    result = measure(REPO, args, render=args.render_cells > 0, processes=args.server_processes)
    report("this checkout", result)
    if baseline is not None:
        ratios = {
            f"ratio_{key}": round(result[key] / baseline[key], 3)
            for key in RATIO_KEYS
            if result.get(key) and baseline.get(key)
        }
        print("  this/baseline: " + ", ".join(f"{k[6:]} {v}" for k, v in ratios.items()))
        result.update({f"baseline_{key}": baseline[key] for key in RATIO_KEYS if key in baseline})
        result.update(ratios)
    result.pop("first_errors")
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
