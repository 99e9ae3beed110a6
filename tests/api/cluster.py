"""The central service as real processes for replica and fault tests: `coldbench server`
replicas, Celery workers, one PostgreSQL database, Redis (keys under a fresh prefix) and an
artifact store (a folder, or a bucket of the moto S3 server).

Everything started is stopped at the end (process groups), and the Redis keys are deleted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import sqlalchemy as sa

from tests.conftest import REDIS_URL
from tests.worker.service import free_port, fresh_postgres_database, stop_process


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[Any]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str = "", timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


@dataclass
class Cluster:
    tmp: Path
    env: dict[str, str]
    database_url: str
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def _start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Any:
        with open(self.tmp / f"{name}.log", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "coldbench", *args],
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_server(
        self, name: str, *, port: int | None = None, env: dict[str, str] | None = None
    ) -> Server:
        port = port or free_port()
        process = self._start(
            name,
            "server",
            "--port",
            str(port),
            "--log-level",
            "warning",
            env={"COLDBENCH_STATE_DIR": str(self.tmp / f"state-{name}"), **(env or {})},
        )
        server = Server(name, port, process)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/healthz", timeout=2).status_code == 200:
                    return server
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)

    def start_celery(self, name: str = "celery", env: dict[str, str] | None = None) -> Any:
        process = self._start(
            name,
            "celery",
            "worker",
            "--pool",
            "solo",
            env={"COLDBENCH_STATE_DIR": str(self.tmp / f"state-{name}"), **(env or {})},
        )
        deadline = time.monotonic() + 60
        while "ready" not in self.log(name):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)
        return process

    def start_beat(self, env: dict[str, str] | None = None) -> Any:
        return self._start(
            "beat",
            "celery",
            "beat",
            env={"COLDBENCH_STATE_DIR": str(self.tmp / "state-beat"), **(env or {})},
        )

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "coldbench", *args],
            env={**self.env, "COLDBENCH_STATE_DIR": str(self.tmp / "state-cli")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def scalar(self, query: str, **params: Any) -> Any:
        engine = sa.create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                return connection.execute(sa.text(query), params).scalar()
        finally:
            engine.dispose()

    def rows(self, query: str, **params: Any) -> list[Any]:
        engine = sa.create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                return list(connection.execute(sa.text(query), params))
        finally:
            engine.dispose()


def wait_until(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def cluster(tmp: Path, **settings: str) -> Iterator[Cluster]:
    """Database, broker prefix and settings shared by every process of the cluster; the store
    is the folder tmp/artifacts unless settings name COLDBENCH_ARTIFACT_URL."""
    prefix = f"coldbench-test-{secrets.token_hex(4)}:"
    with fresh_postgres_database() as database_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBENCH_")}
        env.update(
            COLDBENCH_DATABASE_URL=database_url,
            COLDBENCH_REDIS_URL=REDIS_URL,
            COLDBENCH_CELERY_KEY_PREFIX=prefix,
            COLDBENCH_CELERY_VISIBILITY_TIMEOUT_S="5",
            COLDBENCH_ARTIFACT_DIR=str(tmp / "artifacts"),
            COLDBENCH_WEB_SECRET="replicas-share-this-secret",
            **settings,
        )
        running = Cluster(tmp, env, database_url)
        try:
            yield running
        finally:
            for process in reversed(running.processes):
                stop_process(process, wait_s=10)
            broker = redis.Redis.from_url(REDIS_URL)
            keys = list(broker.scan_iter(match=f"{prefix}*"))
            if keys:
                broker.delete(*keys)
            broker.close()
