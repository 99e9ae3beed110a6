"""The whole service as real processes, for end-to-end tests: the one harness of the suite.

`running_stack` gives a `Stack`: a database (a fresh PostgreSQL database, or the embedded
SQLite default under the stack's folder), optionally Redis under a fresh key prefix, and the
`coldbench` processes a test starts on it (servers, Celery worker and beat, agents), each in
its own session and logging to its own file (coldbench/processes.py, which `coldbench demo`
uses too). Everything started is stopped at the end (process groups), the PostgreSQL database
is dropped and the Redis keys are deleted.

Sharing: the `service` fixture (tests/conftest.py) is one PostgreSQL stack with a server for
the whole test session; tests that start agents on it get them stopped at their end
(`stack.scope()`), and each test submits its own jobs with its own labels or host names.
A test that needs a fresh database, other settings, replicas or a broker starts its own with
`running_stack`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import redis
import sqlalchemy as sa

from coldbench.evidence.contract.protocol import JobState
from coldbench.processes import Child, Children, free_port, run_cli, stop_process, wait_healthy
from tests.conftest import POSTGRES_URL, REDIS_URL

__all__ = [
    "Server",
    "Stack",
    "free_port",
    "fresh_postgres_database",
    "running_stack",
    "stop_process",
    "wait_until",
]

T = TypeVar("T")
# Test-session settings every child keeps (tests/conftest.py sets them for the session).
_KEPT_SETTINGS = ("COLDBENCH_MODEL_DIR", "COLDBENCH_HOST_LOCK")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new database on the test server, migrated to head, dropped at the end."""
    name = f"coldbench_stack_{secrets.token_hex(4)}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(POSTGRES_URL).set(database=name).render_as_string(False)
    try:
        from coldbench.api.database import upgrade_database

        upgrade_database(url)
        yield url
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str = "", timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


@dataclass
class Stack:
    """A database and the `coldbench` processes started on it; see the module docstring."""

    root: Path
    env: dict[str, str]
    database_url: str
    children: Children
    servers: list[Server] = field(default_factory=list)
    api_key: str = ""

    # -- processes ---------------------------------------------------------------------------

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> Child:
        """`coldbench ARGS` as a child of this stack, stopped at its end (or by `stop_process`)."""
        return self.children.start(name, list(args), env=env, log_path=log)

    @contextlib.contextmanager
    def scope(self) -> Iterator[Stack]:
        """A test's turn on a shared stack: the processes it started are stopped and the jobs
        it left unfinished are cancelled when it ends, so no later test's agent meets them."""
        before = list(self.children.started)
        try:
            yield self
        finally:
            for child in reversed(self.children.started):
                if child not in before:
                    self.children.stop(child, grace_s=20)
            if self.servers and self.api_key:
                with self.http() as client:
                    for job in client.get("/jobs", params={"limit": 500}).json():
                        if not JobState(job["state"]).is_final:
                            client.post(f"/jobs/{job['id']}/cancel")

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def _state(self, name: str) -> dict[str, str]:
        # With Redis as the broker each process gets its own state folder, as on separate
        # machines. Without it, the broker is a file in the state folder every process shares
        # (the stack's `state/` on PostgreSQL, `.coldbench/` in the working directory on the
        # embedded default).
        if "COLDBENCH_STATE_DIR" in self.env or not self.database_url:
            return {}
        return {"COLDBENCH_STATE_DIR": str(self.root / f"state-{name}")}

    def start_server(
        self, name: str = "server", *, port: int | None = None, env: dict[str, str] | None = None
    ) -> Server:
        """`coldbench server` on a free loopback port, once it answers /healthz."""
        (server,) = self.start_servers(name, port=port, env=env)
        return server

    def start_servers(
        self, *names: str, port: int | None = None, env: dict[str, str] | None = None
    ) -> list[Server]:
        """`coldbench server` processes (replicas; `port` only for one) started together and
        returned once each answers /healthz: their starts (seconds of CPU each) overlap instead
        of queueing."""
        assert port is None or len(names) == 1, "a port is for one server"
        started: list[tuple[Server, Child]] = []
        for name in names:
            server_port = port or free_port()
            child = self.start(
                name,
                *("server", "--port", str(server_port), "--log-level", "warning"),
                env={**self._state(name), **(env or {})},
            )
            started.append((Server(name, server_port, child.process), child))
        for server, child in started:
            try:
                wait_healthy(server.url, Children(self.root, self.env, started=[child]), 90)
            except RuntimeError as error:
                raise AssertionError(
                    f"{server.name} did not start: {error}\n{child.log()}"
                ) from None
            self.servers.append(server)
        return [server for server, _ in started]

    def start_celery(
        self, name: str = "celery", *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A Celery worker (solo pool), once it says it is ready."""
        child = self.start(
            name, "celery", "worker", "--pool", "solo", env={**self._state(name), **(env or {})}
        )
        return self._started(child, "ready")

    def start_beat(self, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Celery beat, once it says it is starting its schedule."""
        beat = self.start("beat", "celery", "beat", env={**self._state("beat"), **(env or {})})
        return self._started(beat, "beat: Starting")

    def _started(self, child: Child, line: str, timeout_s: float = 90) -> subprocess.Popen[bytes]:
        deadline = time.monotonic() + timeout_s
        while line not in child.log(tail=100_000):
            if child.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{child.name} did not start:\n{child.log()}")
            time.sleep(0.2)
        return child.process

    def start_agent(
        self,
        config: Path,
        *,
        token: str | None,
        log: Path,
        extra: list[str] | None = None,
        server: Server | None = None,
    ) -> subprocess.Popen[bytes]:
        """`coldbench worker` with `config` (and `--enroll token`), a 1 s heartbeat, a 2 s
        long-poll and a host lock of its own beside the config."""
        child = self.start(
            config.parent.name,
            *("worker", "--api", (server or self.servers[0]).url, "--config", str(config)),
            *("--heartbeat-s", "1", "--lease-wait-s", "2"),
            *("--host-lock", str(config.with_suffix(".lock"))),
            *(["--enroll", token] if token else []),
            *(extra or []),
            log=log,
        )
        return child.process

    # -- the command line and the API --------------------------------------------------------

    def cli(self, *args: str, timeout_s: float = 120) -> str:
        try:
            output = run_cli(
                list(args), {**self.env, **self._state("cli")}, timeout_s, cwd=self.root
            )
        except RuntimeError as error:
            raise AssertionError(str(error)) from None
        return output.strip()

    def enrollment_token(self, labels: str = "") -> str:
        return self.cli("admin", "enroll", "--labels", labels)

    @property
    def url(self) -> str:
        return self.servers[0].url

    def http(self, token: str | None = None) -> httpx.Client:
        """The first server's /api/v1 with the stack's API key (or `token`)."""
        return httpx.Client(
            base_url=self.url + "/api/v1",
            headers={"Authorization": f"Bearer {self.api_key if token is None else token}"},
            timeout=30,
        )

    def submit(self, spec: dict[str, Any]) -> httpx.Response:
        with self.http() as client:
            return client.post("/jobs", json=spec)

    def job(self, job_id: str) -> dict[str, Any]:
        with self.http() as client:
            response = client.get(f"/jobs/{job_id}")
            response.raise_for_status()
            return response.json()

    def wait_jobs(
        self, job_ids: list[str], *, timeout_s: float, done: tuple[str, ...]
    ) -> dict[str, Any]:
        """Until every run of every job is in one of the `done` states."""
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = {job_id: self.job(job_id) for job_id in job_ids}
            if all(all(r["state"] in done for r in j["runs"]) for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs not done in {timeout_s} s: {jobs}")
            time.sleep(0.5)

    def wait_hosts(
        self,
        names: set[str],
        agents: list[tuple[subprocess.Popen[Any], Path]],
        *,
        timeout_s: float = 90,
    ) -> None:
        """Until every named host has registered; an agent that exits or a host that never
        shows up fails the test with the agents' logs."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.http() as client:
                if names <= {h["name"] for h in client.get("/hosts").json()}:
                    return
            for proc, log in agents:
                assert proc.poll() is None, log.read_text(errors="replace")
            logs = [log.read_text(errors="replace") for _, log in agents]
            assert time.monotonic() < deadline, logs
            time.sleep(0.3)

    # -- the database and the store ----------------------------------------------------------

    def rows(self, query: str, **params: Any) -> list[Any]:
        engine = sa.create_engine(self.database_url or f"sqlite:///{self.sqlite_path}")
        try:
            with engine.connect() as connection:
                return list(connection.execute(sa.text(query), params))
        finally:
            engine.dispose()

    def scalar(self, query: str, **params: Any) -> Any:
        rows = self.rows(query, **params)
        return rows[0][0] if rows else None

    @property
    def sqlite_path(self) -> Path:
        return self.root / ".coldbench" / "coldbench.db"

    def artifact(self, run_id: str, name: str) -> bytes:
        """The stored bytes of a run's file (newest attempt), from the folder store."""
        from coldbench.api.artifacts.store import LocalArtifactStore

        rows = self.rows(
            "select sha256 from artifacts where run_id = :run and name = :name "
            "order by attempt desc limit 1",
            run=run_id,
            name=name,
        )
        assert rows, f"{name} of {run_id} not uploaded"
        folder = self.env.get("COLDBENCH_ARTIFACT_DIR") or self.root / ".coldbench" / "artifacts"
        return LocalArtifactStore(Path(folder)).path(rows[0][0]).read_bytes()


@contextlib.contextmanager
def running_stack(
    root: Path,
    *,
    database: Literal["postgresql", "sqlite"] = "postgresql",
    broker: bool = False,
    server: bool = True,
    api_key: str | None = "tests",
    settings: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """A stack under `root`: its database, a server (`server`), an API key named `api_key`,
    Redis under a fresh key prefix as the Celery broker (`broker`; else kombu's SQLAlchemy
    transport on the database's folder), and `settings` (COLDBENCH_* variables) for every
    process. On SQLite the processes run in `root` with no state folder set: the embedded
    default, `.coldbench/` under the working directory."""
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
    env.update({k: os.environ[k] for k in _KEPT_SETTINGS if k in os.environ})
    prefix = f"coldbench-test-{secrets.token_hex(4)}:"
    if broker:
        env.update(
            COLDBENCH_REDIS_URL=REDIS_URL,
            COLDBENCH_CELERY_KEY_PREFIX=prefix,
            COLDBENCH_CELERY_VISIBILITY_TIMEOUT_S="5",
        )
    else:
        env["COLDBENCH_REDIS_URL"] = ""
    with contextlib.ExitStack() as cleanup:
        if database == "postgresql":
            database_url = cleanup.enter_context(fresh_postgres_database())
            env.update(
                COLDBENCH_DATABASE_URL=database_url,
                COLDBENCH_ARTIFACT_DIR=str(root / "artifacts"),
            )
            if not broker:
                env["COLDBENCH_STATE_DIR"] = str(root / "state")
        else:
            database_url = ""
            env["COLDBENCH_DATABASE_URL"] = ""
        env.update(settings or {})
        stack = Stack(root, env, database_url, Children(root, env, cwd=root))
        try:
            if server:
                stack.start_server()
            if api_key:
                stack.api_key = stack.cli("admin", "apikey", api_key)
            yield stack
        finally:
            stack.children.stop_all(grace_s=20)
            if broker:
                client = redis.Redis.from_url(REDIS_URL)
                keys = list(client.scan_iter(match=f"{prefix}*"))
                if keys:
                    client.delete(*keys)
                client.close()
