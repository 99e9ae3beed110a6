"""The host agent: enroll once, then lease runs, measure them, upload, complete; forever.

Safe to leave running on someone's Mac:

- outbound HTTP only; the secret lives in a file only its owner can read;
- a job can only pick repositories and recipes this host's worker.toml names (checked here
  again, although the server filters): nothing of a submitter's choosing is ever executed;
- one run measures on a host at a time, even with two agents on one machine (an fcntl lock
  held while a leased run measures and uploads; an idle agent's long-poll holds none, so
  every agent of the machine can lease its own work);
- the heartbeat runs on its own thread while measurement runs in child processes, so a long
  cell never starves it; the heartbeat's `cancel` stops the run after the cell in flight;
- every result is written to an outbox on disk first and resent until the server acknowledges
  it (with backoff while it is unreachable, and again after a restart of the agent);
- SIGTERM finishes the cell in flight, uploads what was measured and completes the run;
  after a SIGKILL the server requeues the run once its lease expires.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from coldbench.evidence.contract.canonical import sha256_hex
from coldbench.evidence.contract.protocol import (
    API_PREFIX,
    CONTENT_SHA256_HEADER,
    HEARTBEAT_S,
    LEASE_WAIT_MAX_S,
    MAX_INVALID_IN_HEARTBEAT,
    MAX_REASON_CHARS,
    ArtifactReceipt,
    CalibrationAccepted,
    CalibrationReport,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InvalidCell,
    Lease,
    LeaseRequest,
    OptionDeclaration,
    Progress,
    RegisterRequest,
    RegisterResponse,
    RepositoryOffer,
    ReproductionAccepted,
    RunStatus,
)
from coldbench.evidence.contract.schemas import HostInfo, JobSpec, error_line
from coldbench.worker.config import HostConfig
from coldbench.worker.fingerprint import host_fingerprint, host_labels
from coldbench.worker.variants import Progress as CellProgress

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 60.0
REQUEST_TIMEOUT_S = 60.0


class AgentError(RuntimeError):
    """The agent cannot go on (not enrolled, secret rejected, ...); the message says what to do."""


class Abandoned(Exception):
    """The server no longer wants this attempt (expired, reassigned): drop its outbox."""


class _Shutdown(BaseException):
    """Raised by the SIGTERM handler while idle, to leave a long-poll at once."""


# --- secret ----------------------------------------------------------------------------------


def write_secret(path: Path, value: dict[str, str]) -> None:
    """Write the worker's credentials readable by its owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def read_secret(path: Path) -> dict[str, str]:
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        raise AgentError(
            f"not enrolled: no secret at {path}; start once with --enroll TOKEN"
        ) from None
    if mode & 0o077:
        raise AgentError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
    try:
        value = json.loads(path.read_text())
        if not isinstance(value.get("secret"), str) or not isinstance(value.get("worker_id"), str):
            raise ValueError
    except ValueError:
        raise AgentError(f"{path} is not a coldbench worker secret; enroll again") from None
    return value


# --- host lock -------------------------------------------------------------------------------


def default_host_lock() -> Path:
    """One lock path per host (not per config): two agents on one host share it."""
    return Path(
        os.environ.get("COLDBENCH_HOST_LOCK", Path(tempfile.gettempdir()) / "coldbench-host.lock")
    )


@contextlib.contextmanager
def host_lock(path: Path, *, wait: Callable[[], bool]) -> Iterator[bool]:
    """Hold the host's measurement lock; yields False (without it) if `wait()` says stop."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait():
                    yield False
                    return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def host_is_measuring(path: Path) -> bool:
    """Whether an agent of this machine holds its lock now (it is measuring)."""
    with host_lock(path, wait=lambda: False) as held:
        return not held


# --- the run state shared with the heartbeat thread ------------------------------------------


@dataclass
class RunState:
    run_id: str | None = None
    attempt: int | None = None
    progress: Progress | None = None
    # When `progress` was reported (time.monotonic()): its estimate counts down from then.
    progress_at: float = 0.0
    cancel: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, progress: Progress) -> None:
        with self.lock:
            self.progress, self.progress_at = progress, time.monotonic()

    def body(self) -> HeartbeatRequest:
        """The heartbeat: the run and its progress, its estimate as of now (a cell may run
        for minutes between two reports)."""
        with self.lock:
            progress = self.progress
            if progress is not None and progress.eta_s is not None:
                left = max(0.0, progress.eta_s - (time.monotonic() - self.progress_at))
                progress = progress.model_copy(update={"eta_s": round(left, 1)})
            return HeartbeatRequest(run_id=self.run_id, attempt=self.attempt, progress=progress)

    def start(self, run_id: str, attempt: int) -> None:
        with self.lock:
            self.run_id, self.attempt, self.progress = run_id, attempt, None
            self.cancel.clear()

    def clear(self) -> None:
        with self.lock:
            self.run_id = self.attempt = self.progress = None
            self.cancel.clear()


# --- what this host offers --------------------------------------------------------------------


def repository_offers(config: HostConfig) -> dict[str, RepositoryOffer]:
    """Each allow-listed repository as registration and lease requests report it."""
    return {
        name: RepositoryOffer(
            adapter=repository.adapter,
            recipes=sorted(repository.recipes),
            options={
                option: OptionDeclaration(
                    type=declared.type,
                    min=declared.min,
                    max=declared.max,
                    proof=declared.proof is not None,
                )
                for option, declared in repository.options.items()
            },
        )
        for name, repository in sorted(config.repositories.items())
    }


class PendingCompletion(CompleteRequest):
    """complete.json of an outbox entry: the completion to send, and the run it closes."""

    run_id: str


# --- the agent -------------------------------------------------------------------------------


@dataclass
class AgentOptions:
    heartbeat_s: float = HEARTBEAT_S
    lease_wait_s: int = LEASE_WAIT_MAX_S
    backoff_max_s: float = BACKOFF_MAX_S
    max_runs: int | None = None  # stop after this many runs (tests, one-shot hosts)
    idle_exit_s: float | None = None  # stop after this long without work (tests)
    host_lock_path: Path | None = None
    cell_timeout_s: float = 600.0


class Agent:
    def __init__(
        self,
        api_url: str,
        config: HostConfig,
        *,
        options: AgentOptions | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.config = config
        self.options = options or AgentOptions()
        self.state = RunState()
        self.stopping = threading.Event()  # SIGTERM/SIGINT: finish the cell, upload, leave
        self.in_run = False
        self._transport = transport
        self._client: httpx.Client | None = None
        self.secret: dict[str, str] | None = None
        self.runs_done = 0

    # -- HTTP --

    def client(self) -> httpx.Client:
        if self._client is None:
            headers = {}
            if self.secret:
                headers["Authorization"] = f"Bearer {self.secret['secret']}"
            self._client = httpx.Client(
                base_url=self.api_url + API_PREFIX,
                headers=headers,
                timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
                transport=self._transport,
            )
        return self._client

    def _backoff(self, failures: int) -> float:
        return min(self.options.backoff_max_s, 0.5 * 2**failures) * (0.5 + random.random() / 2)

    # -- enrollment --

    def fingerprint(self) -> HostInfo:
        return host_fingerprint()

    def labels(self, host: HostInfo) -> list[str]:
        return host_labels(host, self.config.labels)

    def enroll(self, token: str) -> dict[str, str]:
        host = self.fingerprint()
        body = RegisterRequest(
            name=self.config.name,
            fingerprint=host,
            labels=self.labels(host),
            repositories=repository_offers(self.config),
            models=self.config.model_names(),
        )
        with httpx.Client(
            base_url=self.api_url + API_PREFIX, timeout=REQUEST_TIMEOUT_S, transport=self._transport
        ) as client:
            try:
                response = client.post(
                    "/workers/register",
                    json=body.model_dump(mode="json"),
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.HTTPError as error:
                raise AgentError(f"cannot reach {self.api_url}: {error}") from None
        if response.status_code != 201:
            raise AgentError(f"enrollment refused ({response.status_code}): {_detail(response)}")
        answer = RegisterResponse.model_validate(response.json())
        secret = {"api": self.api_url, "worker_id": answer.worker_id, "secret": answer.secret}
        write_secret(self.config.secret_path, secret)
        self.secret = secret
        return secret

    def load_secret(self) -> None:
        self.secret = read_secret(self.config.secret_path)

    def report_calibration(self, result: CalibrationReport) -> CalibrationAccepted:
        """Send this host's calibration (`coldbench calibrate`) for /hosts to show; the API's
        answer says which host it was stored for and the lines /hosts shows."""
        try:
            response = self.client().put("/workers/calibration", json=result.to_json_dict())
        except httpx.HTTPError as error:
            raise AgentError(f"cannot reach {self.api_url}: {error}") from None
        if response.status_code != 200:
            raise AgentError(f"calibration refused ({response.status_code}): {_detail(response)}")
        try:
            return CalibrationAccepted.model_validate_json(response.content)
        except ValidationError as error:
            raise AgentError(f"calibration answer not understood: {error_line(error)}") from None

    def upload_reproduction(self, evidence_id: str, bundle_zip: bytes) -> ReproductionAccepted:
        """Send this host's reproduction (`coldbench reproduce --api`) of `evidence_id`; the
        API's answer names the host it is shown as and the hosts' agreement."""
        try:
            response = self.client().post(
                f"/evidence/{evidence_id}/reproductions",
                content=bundle_zip,
                headers={
                    CONTENT_SHA256_HEADER: sha256_hex(bundle_zip),
                    "Content-Type": "application/zip",
                },
            )
        except httpx.HTTPError as error:
            raise AgentError(f"cannot reach {self.api_url}: {error}") from None
        if response.status_code not in (200, 201):
            raise AgentError(f"reproduction refused ({response.status_code}): {_detail(response)}")
        try:
            return ReproductionAccepted.model_validate_json(response.content)
        except ValidationError as error:
            raise AgentError(f"reproduction answer not understood: {error_line(error)}") from None

    # -- heartbeat thread --

    def _heartbeat_loop(self) -> None:
        while not self._heartbeat_stop.wait(self.options.heartbeat_s):
            self.heartbeat_once()

    def heartbeat_once(self) -> bool | None:
        body = self.state.body()
        try:
            response = self.client().post("/workers/heartbeat", json=body.model_dump(mode="json"))
        except httpx.HTTPError as error:
            log.warning("heartbeat failed: %s", error)
            return None
        if response.status_code != 200:
            log.warning("heartbeat refused (%s): %s", response.status_code, _detail(response))
            return None
        try:
            cancel = HeartbeatResponse.model_validate(response.json()).cancel
        except ValidationError as error:
            log.warning("heartbeat answer not understood: %s", error)
            return None
        if cancel and body.run_id is not None and body.run_id == self.state.run_id:
            log.info("run %s cancelled by the server: stopping after the cell", body.run_id)
            self.state.cancel.set()
        return cancel

    def on_progress(self, progress: CellProgress) -> None:
        message = Progress(
            cells_done=progress.cells_done,
            cells_total=progress.cells_total,
            variant=progress.variant,
            context_tokens=progress.context_tokens,
            eta_s=progress.eta_s,
            invalid=[
                InvalidCell.model_validate(cell)
                for cell in progress.invalid[-MAX_INVALID_IN_HEARTBEAT:]
            ],
        )
        self.state.report(message)

    # -- lease loop --

    def lease(self, host: HostInfo) -> Lease | None:
        body = LeaseRequest(
            fingerprint=host,
            wait_s=self.options.lease_wait_s,
            repositories=repository_offers(self.config),
            models=self.config.model_names(),
        )
        response = self.client().post(
            "/leases",
            json=body.model_dump(mode="json"),
            timeout=self.options.lease_wait_s + REQUEST_TIMEOUT_S,
        )
        if response.status_code == 204:
            return None
        if response.status_code in (401, 403):
            raise AgentError(f"the server refused this worker's secret: {_detail(response)}")
        response.raise_for_status()
        return Lease.model_validate(response.json())

    def run_forever(self) -> int:
        """The agent's life: resume the outbox, then lease and run until told to stop."""
        self._heartbeat_stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        self._install_signals()
        idle_since = time.monotonic()
        failures = 0
        try:
            self.flush_outbox()
            while not self.stopping.is_set():
                if self.options.max_runs is not None and self.runs_done >= self.options.max_runs:
                    break
                if (
                    self.options.idle_exit_s is not None
                    and time.monotonic() - idle_since > self.options.idle_exit_s
                ):
                    break
                lock_path = self.options.host_lock_path or default_host_lock()
                # Idle, the agent holds no lock: another agent of this machine must be able to
                # ask for its own work. It asks only while no agent of the machine measures.
                if not self._wait_until_host_free(lock_path):
                    break
                try:
                    host = self.fingerprint()
                    lease = self.lease(host)
                    failures = 0
                except _Shutdown:
                    break
                except httpx.HTTPError as error:
                    failures += 1
                    delay = self._backoff(failures)
                    log.warning("lease failed (%s); retrying in %.1f s", error, delay)
                    self.stopping.wait(delay)
                    continue
                if lease is None:
                    continue
                # The lease is held (heartbeats name its run) while the lock is awaited: an
                # agent of this machine that leased at the same moment measures first.
                self.state.start(lease.run_id, lease.attempt)
                self.in_run = True
                try:
                    with host_lock(lock_path, wait=self._wait_for_lock) as held:
                        if not held:
                            # Stopping before it measured: the lease expires and the server
                            # gives the run to a host again.
                            break
                        self.handle_lease(lease, host)
                finally:
                    self.in_run = False
                self.runs_done += 1
                idle_since = time.monotonic()
        except _Shutdown:
            pass
        finally:
            self._heartbeat_stop.set()
            beat.join(timeout=5)
            if self._client is not None:
                self._client.close()
        return 0

    def _wait_for_lock(self) -> bool:
        log.info("another agent is measuring on this host; waiting")
        return not self.stopping.wait(1.0)

    def _wait_until_host_free(self, path: Path) -> bool:
        """Until no agent of this machine holds its lock (True), or this agent stops."""
        if host_is_measuring(path):
            log.info("another agent is measuring on this host; asking for work after it")
            while host_is_measuring(path):
                if self.stopping.wait(1.0):
                    return False
        return not self.stopping.is_set()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing the cell in flight, then uploading", signum)
            self.stopping.set()
            self.state.cancel.set()
            if not self.in_run:
                raise _Shutdown

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    # -- one run --

    def outbox(self) -> Path:
        return self.config.state_dir / "outbox"

    def handle_lease(self, lease: Lease, host: HostInfo) -> None:
        from coldbench.worker.run import RunRefused, execute_run, refused_files

        run_id, attempt = lease.run_id, lease.attempt
        self.state.start(run_id, attempt)
        # The run's heartbeat starts now, not up to heartbeat_s later.
        threading.Thread(target=self.heartbeat_once, daemon=True).start()
        started = time.monotonic()
        timeout_s = float(lease.timeout_s or 6 * 3600)
        workdir = self.config.state_dir / "runs" / f"{_safe(run_id)}-a{attempt}"
        if workdir.exists():
            shutil.rmtree(workdir)  # an attempt starts clean
        status: RunStatus = "failed"
        reason = None
        try:
            try:
                spec = JobSpec.model_validate(lease.spec)
            except ValueError as error:
                raise RunRefused(f"job spec not understood: {str(error).splitlines()[0]}") from None
            if spec.model not in self.config.model_names():
                # The server matches models too; this host's own rule holds without it.
                raise RunRefused(
                    f"this host has no model {spec.model!r} (presets need allow_presets)"
                )
            log.info("run %s attempt %s: %s", run_id, attempt, spec.mode)

            def should_stop() -> bool:
                # Stop before the server's hard timeout rather than be killed by it.
                late = time.monotonic() - started > timeout_s * 0.95
                return self.state.cancel.is_set() or late

            outcome = execute_run(
                spec,
                run_id=run_id,
                workdir=workdir,
                state_dir=self.config.state_dir,
                host=host,
                labels=self.labels(host),
                repositories=self.config.repositories,
                models=self.config.models,
                corpora=self.config.corpora,
                cell_timeout_s=min(self.options.cell_timeout_s, timeout_s),
                on_progress=self.on_progress,
                should_stop=should_stop,
                prespawn=self.config.prespawn,
                noise=self.config.noise,
            )
            files, status, reason = outcome.files, outcome.status, outcome.reason
            if outcome.stopped and self.stopping.is_set():
                done = f"{outcome.cells_done} of {outcome.cells_total} cells"
                reason = f"worker stopped (SIGTERM) after {done}"
            elif outcome.stopped and self.state.cancel.is_set():
                reason = f"cancelled after {outcome.cells_done} of {outcome.cells_total} cells"
        except RunRefused as error:
            log.warning("run %s refused: %s", run_id, error)
            reason = f"refused by host {self.config.name}: {error}"
            files = refused_files(lease.spec, run_id=run_id, host=host, reason=reason)
        except Exception as error:  # noqa: BLE001 - any crash is reported, never swallowed silently
            log.exception("run %s crashed", run_id)
            reason = f"worker error: {type(error).__name__}: {error}"
            files = refused_files(lease.spec, run_id=run_id, host=host, reason=reason)
        self.save_outbox(run_id, attempt, files, status=status, reason=reason)
        self.flush_outbox()
        self.state.clear()

    # -- outbox: results on disk until the server acknowledges them --

    def save_outbox(
        self,
        run_id: str,
        attempt: int,
        files: dict[str, bytes],
        *,
        status: RunStatus,
        reason: str | None,
    ) -> Path:
        folder = self.outbox() / f"{_safe(run_id)}-a{attempt}"
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "files").mkdir(parents=True)
        for name, content in files.items():
            (partial / "files" / name).write_bytes(content)
        completion = PendingCompletion(
            run_id=run_id,
            attempt=attempt,
            status=status,
            reason=(reason or None) and reason[:MAX_REASON_CHARS],
            manifest=json.loads(files["manifest.json"]),
        )
        (partial / "complete.json").write_text(
            json.dumps(completion.model_dump(mode="json"), sort_keys=True)
        )
        for path in [*partial.rglob("*")]:
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
        return folder

    def flush_outbox(self) -> None:
        """Send every pending result; returns when each is acknowledged or abandoned."""
        if not self.outbox().exists():
            return
        for folder in sorted(self.outbox().iterdir()):
            if folder.name.endswith(".partial") or not (folder / "complete.json").exists():
                shutil.rmtree(folder, ignore_errors=True)
                continue
            self._deliver(folder)

    def _deliver(self, folder: Path) -> None:
        completion = PendingCompletion.model_validate_json((folder / "complete.json").read_text())
        run_id, attempt = completion.run_id, completion.attempt
        failures = 0
        while True:
            try:
                self._upload_all(folder, run_id, attempt)
                self._complete(completion)
                log.info("run %s attempt %s completed: %s", run_id, attempt, completion.status)
                break
            except Abandoned as why:
                log.warning("run %s attempt %s abandoned: %s", run_id, attempt, why)
                break
            except (httpx.HTTPError, _Retry) as error:
                failures += 1
                if self.stopping.is_set() and failures >= 3:
                    # Leaving: the outbox stays on disk and is sent at the next start.
                    log.warning("run %s not delivered yet (%s); kept in %s", run_id, error, folder)
                    return
                delay = self._backoff(failures)
                log.warning("upload of %s failed (%s); retrying in %.1f s", run_id, error, delay)
                time.sleep(delay)
        shutil.rmtree(folder, ignore_errors=True)

    def _upload_all(self, folder: Path, run_id: str, attempt: int) -> None:
        for path in sorted((folder / "files").iterdir()):
            if path.name == "manifest.json":
                continue  # the manifest travels in the completion
            content = path.read_bytes()
            response = self.client().put(
                f"/runs/{run_id}/artifacts/{path.name}",
                params={"attempt": attempt},
                content=content,
                headers={
                    CONTENT_SHA256_HEADER: sha256_hex(content),
                    "Content-Type": "application/octet-stream",
                },
            )
            if response.status_code in (200, 201):
                receipt = ArtifactReceipt.model_validate_json(response.content)
                if (receipt.sha256, receipt.bytes) != (sha256_hex(content), len(content)):
                    # The server must hold exactly these bytes under this name: send again.
                    raise _Retry(
                        f"{path.name}: the server stored sha256 {receipt.sha256[:16]}..., "
                        f"{receipt.bytes} bytes, not what was sent"
                    )
                continue
            if response.status_code in (403, 409):
                raise Abandoned(f"{path.name}: {response.status_code} {_detail(response)}")
            if response.status_code == 413:
                raise Abandoned(f"{path.name} is larger than the server accepts")
            raise _Retry(f"{path.name}: {response.status_code} {_detail(response)}")

    def _complete(self, completion: PendingCompletion) -> None:
        body = CompleteRequest.model_validate(completion.model_dump(exclude={"run_id"}))
        response = self.client().post(
            f"/runs/{completion.run_id}/complete", json=body.model_dump(mode="json")
        )
        if response.status_code == 200:
            answer = CompleteResponse.model_validate_json(response.content)
            log.info("run %s attempt %s is %s", answer.run_id, answer.attempt, answer.state)
            return
        if response.status_code in (403, 404, 409):
            raise Abandoned(f"complete: {response.status_code} {_detail(response)}")
        raise _Retry(f"complete: {response.status_code} {_detail(response)}")


class _Retry(Exception):
    pass


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:100]


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail if detail is not None else response.text[:300])
