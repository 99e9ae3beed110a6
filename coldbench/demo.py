"""`coldbench demo`: the whole loop on the embedded default, in one command.

Creates `.coldbench/` (SQLite database, broker file, artifact store), writes the `micro` model,
starts the API, a Celery worker and beat, and one local worker agent as child processes, enrolls
the agent, submits an A/B job and an ablation of the candidate's engine flags, shows live
progress, and prints the evidence URLs and bundle paths. Every child runs in its own process
group and is stopped on exit, on error and on Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from coldbench.evidence.contract.protocol import JobState
from coldbench.processes import Children, free_port, wait_healthy

if TYPE_CHECKING:
    from coldbench.evidence.contract.schemas import JobRequest

app = typer.Typer()

# The candidate's engine flags, each an optimization the ablation measures by leaving it out.
# They are the ones that pay on a GPU (docs/PERFORMANCE.md); on a CPU host they may not, and
# the evidence says so. Every feature must dispatch to be counted (the silent-no-op check).
# The demo shows the service's whole path, not a model's speed: `micro` keeps its 150 cells and
# 75 process starts within about a minute on a 2-core CPU (docs/PERFORMANCE.md).
DEMO_MODEL = "preset:micro"
# The baseline prefills in 4-token chunks, 32 to 64 forward passes a prompt against the
# candidate's 2 to 4 of 64 tokens: MLX's cost per chunk on a CPU is a genuine effect this CPU
# resolves (about 3x in a 10-round A/B at a load of 15 on two cores), so the demo decides
# something whatever else the machine runs.
BASELINE_FLAGS: dict[str, Any] = {"prefill_step_size": 4}
# Every feature must dispatch at every context (or the cell is a silent no-op): 64-token chunks
# give the shortest demo prompt (128 tokens) two chunks, so keeping the buffer cache between
# chunks has a boundary to act on.
CANDIDATE_FEATURES = ["prefill_step_size=64", "clear_cache=false", "compile"]
# Each job measures until decided, as every job does by default, within a budget of one first
# look: the A/B decides there, and the ablation's features that do not pay on a CPU would
# otherwise take it on to the default budget of 40 rounds, past the demo's minute.
DEMO_ROUNDS = 10


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How often the demo looks at its jobs: a state change is seen at most this late.
FOLLOW_POLL_S = 0.5


@dataclass
class Clock:
    """Seconds since the demo started, printed with every step, and where they went."""

    console: Any
    started_at: float = field(default_factory=time.monotonic)
    phases: list[tuple[str, float]] = field(default_factory=list)
    _phase_started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{self.elapsed():6.1f} s[/] {text}")

    def phase(self, name: str) -> None:
        """End the current phase under `name` (its seconds are counted in the breakdown)."""
        now = time.monotonic()
        self.phases.append((name, now - self._phase_started))
        self._phase_started = now

    def breakdown(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases)


def demo_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # The embedded default: empty URLs mean SQLite and kombu's SQLAlchemy transport
            # under the state directory, whatever the caller's environment says.
            "COLDBENCH_STATE_DIR": str(state_dir),
            "COLDBENCH_DATABASE_URL": "",
            "COLDBENCH_REDIS_URL": "",
            "COLDBENCH_ARTIFACT_DIR": str(state_dir / "artifacts"),
            "COLDBENCH_MODEL_DIR": str(state_dir / "models"),
            "PYTHONUNBUFFERED": "1",
            # SQLite has no notification to wake the agent's lease long-poll, which then looks
            # every 2 s by default: the demo's one agent gets each queued run within 0.1 s.
            "COLDBENCH_LEASE_POLL_S": "0.1",
        }
    )
    return env


def login_hint(base_url: str, api_key: str, state_dir: Path) -> str:
    """How to log in to the demo's pages, and how to make another key for its database."""
    return (
        f"pages: log in at {base_url}/login with the API key {api_key} "
        f"(another key: COLDBENCH_STATE_DIR={shlex.quote(str(state_dir))} "
        "coldbench admin apikey NAME)"
    )


def write_worker_config(path: Path) -> None:
    path.write_text(
        'name = "demo-host"\nlabels = ["demo"]\nallow_presets = ["micro"]\n\n[models]\n',
        encoding="utf-8",
    )


def job_specs(contexts: str, rounds: int, decode_tokens: int, seed: int) -> list[JobRequest]:
    """The demo's A/B and ablation, built as every front end builds a job
    (evidence/spec/job_options.py), each measuring until decided within `rounds`."""
    from coldbench.evidence.contract.variant import parse_feature
    from coldbench.evidence.spec.job_options import build_job_spec

    candidate_flags = dict(BASELINE_FLAGS)
    candidate_flags.update(parse_feature(feature) for feature in CANDIDATE_FEATURES)
    common = {
        "contexts": contexts,
        "rounds": rounds,
        "decode_tokens": decode_tokens,
        "model": DEMO_MODEL,
        "seed": seed,
        "labels": ["demo"],
    }
    ab = build_job_spec(
        {
            **common,
            "mode": "ab",
            "variants": [
                {"name": "stock", "flags": BASELINE_FLAGS},
                {"name": "candidate", "flags": candidate_flags},
            ],
        }
    )
    ablation = build_job_spec(
        {
            **common,
            "mode": "ablation",
            "variants": [{"name": "candidate", "flags": BASELINE_FLAGS}],
            "features": CANDIDATE_FEATURES,
        }
    )
    return [ab, ablation]


@app.command()
def demo(
    state_dir: Annotated[
        Path, typer.Option("--dir", help="Where the demo keeps its state.")
    ] = Path(".coldbench"),
    port: Annotated[int, typer.Option(help="API port (0: a free one).")] = 0,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Each job's budget of rounds: it measures until decided, looking first at 10 "
            "(evidence/spec/job_options.py).",
        ),
    ] = DEMO_ROUNDS,
    contexts: str = "128,256",
    decode_tokens: int = 4,
    seed: int = 0,
    keep_running: Annotated[
        bool, typer.Option(help="Keep serving the API and pages until Ctrl-C.")
    ] = False,
) -> None:
    """Run the whole loop locally: server, Celery, one agent, an A/B job and an ablation."""
    import httpx
    from rich.console import Console

    # soft_wrap: a line is never broken at the console's width (80 columns when captured),
    # so the URLs, bundle paths and the time breakdown stay one line each for whoever parses them.
    console = Console(stderr=True, soft_wrap=True)
    clock = Clock(console)
    state_dir = state_dir.resolve()
    for sub in ("artifacts", "models", "logs", "agent", "evidence"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    env = demo_env(state_dir)
    # This process works on the demo's state as its children do (database, model cache).
    os.environ.update(env)
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    children = Children(state_dir / "logs", env)
    from coldbench.evidence.spec.job_options import JobOptionsError, problem_lines, service_payload

    try:  # before any service starts: a bad option costs nothing
        specs = job_specs(contexts, rounds, decode_tokens, seed)
    except JobOptionsError as error:
        for line in problem_lines(error):
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None

    def interrupted(_signum: int, _frame: Any) -> None:
        # The first Ctrl-C stops the demo; later ones must not cut its clean-up short (an
        # impatient second Ctrl-C would otherwise leave the server or an agent running).
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # SIGINT too: a shell starts a background job (`coldbench demo &` in a script, a CI runner)
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, interrupted)
    with ExitStack() as cleanup:
        cleanup.callback(children.stop_all)
        pool = cleanup.enter_context(ThreadPoolExecutor(max_workers=2))
        try:
            clock.say(f"[bold]coldbench demo[/] in {state_dir}")
            # The model is written (on the first run) while the database is prepared.
            model = pool.submit(_demo_model)
            enrollment, api_key = prepare_database(labels=["demo"], key_name="demo")
            clock.say("database: migrated; agent enrollment and submitter key issued")
            clock.phase("database and tokens")
            children.start("server", ["server", "--host", "127.0.0.1", "--port", str(port)])
            children.start("celery-worker", ["celery", "worker", "--pool", "solo"])
            children.start("celery-beat", ["celery", "beat"])
            clock.say(f"model: {model.result()} (cached after the first run)")
            wait_healthy(base_url, children)
            clock.say(f"api: {base_url}")
            console.print(login_hint(base_url, api_key, state_dir))
            clock.phase("services and model")

            config = state_dir / "agent" / "worker.toml"
            write_worker_config(config)
            secret_file = config.with_name(config.stem + ".secret")
            enroll_args = [] if secret_file.exists() else ["--enroll", enrollment]
            children.start(
                "agent",
                [
                    "worker",
                    "--api",
                    base_url,
                    "--config",
                    str(config),
                    *enroll_args,
                    # Progress on the console every 2 s instead of every 15.
                    "--heartbeat-s",
                    "2",
                ],
            )

            headers = {"Authorization": f"Bearer {api_key}"}
            # One client for every request: each httpx client loads the CA bundle (a quarter
            # of a second of CPU on this machine), even for plain http on loopback.
            with httpx.Client(base_url=base_url, headers=headers, timeout=60.0) as client:
                _wait_for_host(client, children)
                clock.say("agent: registered")
                clock.phase("agent start")
                jobs = []
                for spec in specs:
                    response = client.post("/api/v1/jobs", json=service_payload(spec))
                    if response.status_code != 201:
                        raise RuntimeError(f"job refused ({response.status_code}): {response.text}")
                    jobs.append(response.json()["id"])
                    budget = response.json()["spec"]["rounds"]
                    clock.say(
                        f"submitted {spec.mode} job {jobs[-1]} (until decided, {budget} rounds "
                        "at most): "
                        f"{base_url}/jobs/{jobs[-1]}"
                    )
                finished = _follow(client, jobs, children, clock)

                console.print()
                for job in finished:
                    evidence_id = job.get("evidence_id")
                    if not evidence_id:
                        console.print(
                            f"[red]job {job['id']} ended {job.get('state')} without evidence[/]"
                        )
                        continue
                    bundle = state_dir / "evidence" / f"{evidence_id}.zip"
                    bundle.write_bytes(client.get(f"/e/{evidence_id}.zip").content)
                    mode = job.get("spec", {}).get("mode", "")
                    console.print(f"[bold]{mode} evidence[/]: {base_url}/e/{evidence_id}")
                    console.print(f"  bundle: {bundle}  (check it: coldbench verify {bundle})")
                    summary = client.get(f"/e/{evidence_id}.md").text
                    # Plain output: rich would re-wrap the Markdown tables.
                    typer.echo(summary, err=True)
            clock.phase("bundles and summaries")
            console.print(f"where the time went: {clock.breakdown()}")
            console.print(f"demo finished in {clock.elapsed():.0f} s")
            if keep_running:
                console.print(f"serving {base_url} until Ctrl-C")
                console.print(login_hint(base_url, api_key, state_dir))
                while True:
                    children.check_alive()
                    time.sleep(1)
        except KeyboardInterrupt:
            console.print("\ninterrupted: stopping every child process")
            raise typer.Exit(130) from None
        except RuntimeError as error:
            console.print(f"[red]demo failed:[/] {error}")
            console.print(f"logs: {state_dir / 'logs'}")
            raise typer.Exit(1) from None


def prepare_database(*, labels: list[str], key_name: str) -> tuple[str, str]:
    """Migrate the environment's database, then issue an enrollment token for one host with
    `labels` and a submitter key: (token, key). In this process, which imports the service's
    modules once, where three `coldbench` commands each started an interpreter to do it."""
    from coldbench.api.auth import service
    from coldbench.api.database import make_engine, make_sessionmaker, upgrade_database
    from coldbench.api.settings import Settings

    url = Settings().sqlalchemy_url
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as db_session:
            token = service.create_enrollment_token(db_session=db_session, labels=labels)
            key = service.create_api_key(db_session=db_session, name=key_name)
    finally:
        engine.dispose()
    return token, key


def _demo_model() -> Path:
    from coldbench.engine.checkpoints import resolve_model

    return resolve_model(DEMO_MODEL, {})


def _wait_for_host(client: Any, children: Children, timeout_s: float = 120.0) -> None:
    """The agent registers itself on start; jobs are validated against registered hosts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children.check_alive()
        response = client.get("/api/v1/hosts")
        if response.status_code == 200 and response.json():
            return
        time.sleep(0.1)
    raise RuntimeError(f"the agent did not register within {timeout_s:.0f} s")


def _follow(
    client: Any, job_ids: list[str], children: Children, clock: Clock
) -> list[dict[str, Any]]:
    """Print each job's progress as it changes, and end a phase at each state change."""
    from coldbench.submit import progress_line

    last: dict[str, str] = {}
    states: dict[str, str] = {}
    jobs: list[dict[str, Any]] = [{"id": job_id} for job_id in job_ids]
    while True:
        children.check_alive()
        # A finished job does not change: only the others are read again.
        jobs = [
            job if _is_final(job) else client.get(f"/api/v1/jobs/{job['id']}").json()
            for job in jobs
        ]
        for job in jobs:
            line = progress_line(job)
            if last.get(job["id"]) != line:
                clock.say(line)
                last[job["id"]] = line
        # A phase per (job, state) the demo waited in, e.g. "ab running 20.1 s".
        current = " / ".join(
            f"{job.get('spec', {}).get('mode', '?')} {job.get('state')}"
            for job in jobs
            if not _is_final(job)
        )
        if current != states.get("all"):
            if "all" in states:
                clock.phase(states["all"])
            states["all"] = current
        if all(_is_final(job) for job in jobs):
            return jobs
        time.sleep(FOLLOW_POLL_S)


def _is_final(job: dict[str, Any]) -> bool:
    return "state" in job and JobState(job["state"]).is_final
