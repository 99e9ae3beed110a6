"""The real central service for agent tests: PostgreSQL, `coldbench server`, `coldbench admin`.

Everything runs as separate processes on free loopback ports, and everything started is
stopped (process groups killed) at the end.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from tests.conftest import POSTGRES_URL


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    name = f"coldbench_worker_{secrets.token_hex(4)}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(POSTGRES_URL).set(database=name).render_as_string(False)
    try:
        from api.database import upgrade_database

        upgrade_database(url)
        yield url
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, wait_s: float = 20) -> int:
    """Stop a child started with its own session, and everything it started."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Children of the group that outlived their parent (variant processes after a SIGKILL).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


@dataclass
class Service:
    url: str
    env: dict[str, str]
    tmp: Path
    database_url: str
    api_key: str = ""
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "coldbench", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def enrollment_token(self, labels: str = "") -> str:
        return self.cli("admin", "enroll", "--labels", labels)

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url + "/api/v1",
            headers={"Authorization": f"Bearer {self.api_key}"},
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

    def wait_jobs(self, job_ids: list[str], *, timeout_s: float, done: tuple[str, ...]) -> dict:
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

    def start_agent(
        self, config: Path, *, token: str | None, log: Path, extra: list[str] | None = None
    ) -> subprocess.Popen[Any]:
        argv = [
            sys.executable,
            "-m",
            "coldbench",
            "worker",
            "--api",
            self.url,
            "--config",
            str(config),
            "--heartbeat-s",
            "1",
            "--lease-wait-s",
            "2",
            "--host-lock",
            str(config.with_suffix(".lock")),
            *(["--enroll", token] if token else []),
            *(extra or []),
        ]
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append(proc)
        return proc

    def rows(self, query: str, **params: Any) -> list[Any]:
        engine = sa.create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                return list(connection.execute(sa.text(query), params))
        finally:
            engine.dispose()

    def artifact(self, run_id: str, name: str) -> bytes:
        from api.artifacts.store import LocalArtifactStore

        rows = self.rows(
            "select sha256 from artifacts where run_id = :run and name = :name "
            "order by attempt desc limit 1",
            run=run_id,
            name=name,
        )
        assert rows, f"{name} of {run_id} not uploaded"
        return LocalArtifactStore(self.tmp / "artifacts").path(rows[0][0]).read_bytes()


@contextlib.contextmanager
def running_service(
    tmp: Path, *, lease_ttl_s: int = 60, port: int | None = None
) -> Iterator[Service]:
    with fresh_postgres_database() as database_url:
        port = port or free_port()
        env = {
            **os.environ,
            "COLDBENCH_DATABASE_URL": database_url,
            "COLDBENCH_REDIS_URL": "",
            "COLDBENCH_STATE_DIR": str(tmp / "server-state"),
            "COLDBENCH_ARTIFACT_DIR": str(tmp / "artifacts"),
            "COLDBENCH_LEASE_TTL_S": str(lease_ttl_s),
            "COLDBENCH_LEASE_POLL_S": "0.2",
        }
        service = Service(
            url=f"http://127.0.0.1:{port}", env=env, tmp=tmp, database_url=database_url
        )
        with open(tmp / "server.log", "ab") as out:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "coldbench",
                    "server",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service.processes.append(server)
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(service.url + "/healthz", timeout=2).status_code == 200:
                        break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp / "server.log").read_text()[-3000:])
                time.sleep(0.3)
            service.api_key = service.cli("admin", "apikey", "worker-tests")
            yield service
        finally:
            for proc in reversed(service.processes):
                stop_process(proc, wait_s=10)
