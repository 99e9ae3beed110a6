"""One job reproduced on two machines through the service's own path, one machine at a time.

The device tool lends one GPU machine at a time (an H100, then an H200; or two leases of one
kind, given back in between). The service therefore travels with its state folder: it runs on
the first machine (SQLite and the local artifact store under `--workdir`, as `coldbench demo`
and benchmarks/host_e2e.py run it), where a job asking for 2 hosts is submitted and host A's
agent runs its run; the state folder is packed into `--out`, comes back, goes out again to the
second machine, where the same service starts from it and host B's agent (enrolled with the
second token issued on the first machine) runs the job's other run. The job then completes:
its evidence holds both runs, the reproductions section sets the hosts side by side with the
agreement test (docs/EVIDENCE.md, "Reproductions"), and `coldbench compare` prints it.

The job: an A/B of the embedded engine at `--contexts` (16K) on `--model` (an 8B-shaped
checkpoint written on each machine from its preset and seed, so both hold the same digests),
between `main` and `planted-2pct` of a repository made here from this checkout's engine/,
kernels/ and evidence/, whose only change waits 2% of each prefill's own time inside the
timed region: a 2% effect by construction on any machine.

    # machine 1 (an H100): writes <out>/state.tgz (the service's state and the repository)
    PYTHONPATH=. python3 benchmarks/two_hosts.py first --workdir /tmp/two --out $OUT
    # machine 2 (an H200), with state.tgz carried under the working tree:
    PYTHONPATH=. python3 benchmarks/two_hosts.py second --state <path>/state.tgz \\
        --workdir /tmp/two --out $OUT

`repo` writes only `<workdir>/repo` (`main` and `planted-2pct`), for jobs run another way
(benchmarks/device_session.sh's `planted-repo` step, before `decided` or `alternate`).

Each phase prints one JSON line (the job, its runs, the host, times) and writes it to
`<out>/<phase>.json`; the second also writes the evidence zip, its summary.md and
summary.json, and `compare.txt` (what `coldbench compare` printed). On this CPU the same
recipe rehearses with `--model preset:micro --dtype float32 --contexts 256 --rounds 6
--rounds-per-process 1` in a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from benchmarks.host_e2e import Failed, _follow, log_tails
from coldbench.demo import demo_env, prepare_database
from coldbench.evidence.contract.protocol import API_PREFIX, JobState
from coldbench.processes import Children, free_port, run_cli, wait_healthy

REPOSITORY = "coldbench"
LABEL = "two-hosts"
PLANTED_BRANCH = "planted-2pct"
PREFILL_END = "    prefill_s = time.perf_counter() - start\n"
PLANTED = (
    "    time.sleep(0.02 * (time.perf_counter() - start))  # planted: 2% of the prefill\n"
    + PREFILL_END
)
ROOT = Path(__file__).resolve().parents[1]
STATE_FILE = "state.tgz"
PHASE_FILE = "phase.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("phase", choices=["first", "second", "repo"])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--state", type=Path, help="second: the first machine's state.tgz")
    parser.add_argument("--model", default="preset:llama-8b-shape")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="16384")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--rounds-per-process", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=480.0)
    args = parser.parse_args(argv)
    if args.phase == "second" and args.state is None:
        parser.error("second: give --state (the first machine's state.tgz)")
    return args


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=two-hosts", "-c", "user.email=two@coldbench.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def planted_repository(repo: Path) -> dict[str, str]:
    """A git repository of this checkout's engine with branch `planted-2pct`: the commits."""
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    # the whole checkout at HEAD: its engine imports the coldbench namespace (coldbench/'s links)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "engine as in this checkout")
    git(repo, "checkout", "-q", "-b", PLANTED_BRANCH)
    cell = repo / "engine" / "cell.py"
    text = cell.read_text()
    if text.count(PREFILL_END) != 1:
        raise Failed("engine/cell.py: the prefill's end was not found; update PREFILL_END")
    cell.write_text(text.replace(PREFILL_END, PLANTED))
    git(repo, "commit", "-q", "-am", "planted: wait 2% of each prefill")
    git(repo, "checkout", "-q", "main")
    return {ref: git(repo, "rev-parse", ref) for ref in ("main", PLANTED_BRANCH)}


def model_folder(args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> tuple[str, str]:
    """(worker.toml's [models] line or "", the job's model name): a preset is written here
    from its seed (the same digests on both machines)."""
    if not args.model.startswith("preset:"):
        folder = Path(args.model).expanduser().resolve()
        return f'"model" = {json.dumps(str(folder))}', "model"
    preset = args.model.removeprefix("preset:")
    folder = workdir / f"model-{preset}-{args.dtype}"
    if not (folder / "config.json").is_file():
        run_cli(
            ["model", "create", "--preset", preset, "--dtype", args.dtype, "--out", str(folder)],
            env,
            timeout_s=1800,
        )
    return f'"model" = {json.dumps(str(folder))}', "model"


def worker_toml(name: str, workdir: Path, models_line: str) -> Path:
    agent = workdir / f"agent-{name}"
    agent.mkdir(parents=True, exist_ok=True)
    config = agent / "worker.toml"
    config.write_text(
        "\n".join(
            [
                f"name = {json.dumps(name)}",
                f"labels = [{json.dumps(LABEL)}]",
                f"state_dir = {json.dumps(str(agent / 'state'))}",
                "[models]",
                models_line,
                f"[repositories.{REPOSITORY}]",
                f"url = {json.dumps(str(workdir / 'repo'))}",
                'adapter = "embedded"',
                f"[repositories.{REPOSITORY}.recipes.offline]",
                'command = ["{python}", "-c", "import engine, {fast_path_package}"]',
            ]
        )
        + "\n"
    )
    return config


def start_service(children: Children, port: int) -> str:
    base_url = f"http://127.0.0.1:{port}"
    children.start(
        "server", ["server", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    )
    children.start("celery-worker", ["celery", "worker"])
    wait_healthy(base_url, children)
    return base_url


def start_agent(
    children: Children, name: str, config: Path, base_url: str, token: str | None
) -> Any:
    """The host's agent; enrolled with `token` the first time, its kept secret afterwards."""
    return children.start(
        f"agent-{name}",
        [
            *("worker", "--api", base_url, "--config", str(config)),
            *(["--enroll", token] if token is not None else []),
            *("--heartbeat-s", "1", "--host-lock", str(config.with_name("host.lock"))),
        ],
    )


def registered(client: Any, name: str) -> bool:
    return any(h["name"] == name for h in client.get("/hosts").json())


def wait_for(predicate: Any, children: Children, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children.check_alive()
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    raise Failed(f"{what}: not within {timeout_s:.0f} s")


def first(args: argparse.Namespace, workdir: Path, out: Path, say: Any) -> dict[str, Any]:
    import httpx

    state_dir = workdir / "state"
    env = demo_env(state_dir)
    os.environ.update(env)
    commits = planted_repository(workdir / "repo")
    models_line, model = model_folder(args, workdir, env)
    say(f"repository {commits}; model {model}")
    token_a, api_key = prepare_database(labels=[LABEL], key_name="two-hosts")
    token_b, _ = prepare_database(labels=[LABEL], key_name="two-hosts-b")
    children = Children(workdir / "logs-first", env)
    result: dict[str, Any] = {"phase": "first", "commits": commits}
    try:
        base_url = start_service(children, free_port())
        headers = {"Authorization": f"Bearer {api_key}"}
        with httpx.Client(base_url=base_url + API_PREFIX, headers=headers, timeout=30) as client:
            # A job for 2 hosts needs 2 registered: gpu-b enrolls here and stops before the
            # job exists (its secret travels); it runs its run on the second machine.
            config_b = worker_toml("gpu-b", workdir, models_line)
            agent_b = start_agent(children, "gpu-b", config_b, base_url, token_b)
            secret_b = config_b.with_name("worker.secret")
            wait_for(
                lambda: registered(client, "gpu-b") and secret_b.is_file(),
                children,
                120,
                "gpu-b registered, its secret kept",
            )
            children.stop(agent_b)
            config_a = worker_toml("gpu-a", workdir, models_line)
            start_agent(children, "gpu-a", config_a, base_url, token_a)
            wait_for(lambda: registered(client, "gpu-a"), children, 120, "gpu-a registered")
            submit = [
                *("submit", "--api", base_url, "--key", api_key, "--hosts", "2"),
                *("--adapter", "embedded", "--repo", REPOSITORY, "--model", model),
                *("--variant", "main:ref=main", "--variant", f"planted:ref={PLANTED_BRANCH}"),
                *("--contexts", args.contexts, "--rounds", str(args.rounds), "--until", "rounds"),
                *("--rounds-per-process", str(args.rounds_per_process)),
                *("--decode-tokens", str(args.decode_tokens), "--labels", LABEL),
            ]
            job_id = run_cli(submit, env, timeout_s=60).split()[1]
            say(f"job {job_id} submitted, asking for 2 hosts")

            def a_processed() -> dict[str, Any] | None:
                job = client.get(f"/jobs/{job_id}").json()
                done = [r for r in job.get("runs", []) if r.get("state") == "processed"]
                return job if done else None

            job = wait_for(a_processed, children, args.timeout_s, "gpu-a's run processed")
        result.update(job_id=job_id, api_key=api_key, runs=job.get("runs"))
        say(f"gpu-a's run processed; job {job['state']}, waiting for a second host")
    except BaseException:
        print(log_tails(workdir / "logs-first", workdir / "agent-gpu-a" / "state"), file=sys.stderr)
        raise
    finally:
        children.stop_all()
    (workdir / PHASE_FILE).write_text(json.dumps(result, sort_keys=True))
    # what travels: the service's state (database, broker, artifacts), the repository, gpu-b's
    # worker.toml and secret, the phase file; not the agents' build venvs and mirrors, nor the
    # model (written again there from its preset and seed)
    with tarfile.open(out / STATE_FILE, "w:gz") as archive:
        for name in ("state", "repo", PHASE_FILE):
            archive.add(workdir / name, arcname=name)
        for path in sorted((workdir / "agent-gpu-b").glob("worker.*")):
            archive.add(path, arcname=f"agent-gpu-b/{path.name}")
    result["state_bytes"] = (out / STATE_FILE).stat().st_size
    return result


def second(args: argparse.Namespace, workdir: Path, out: Path, say: Any) -> dict[str, Any]:
    import httpx

    with tarfile.open(args.state) as archive:
        archive.extractall(workdir, filter="data")
    phase = json.loads((workdir / PHASE_FILE).read_text())
    state_dir = workdir / "state"
    env = demo_env(state_dir)
    os.environ.update(env)
    models_line, _model = model_folder(args, workdir, env)
    children = Children(workdir / "logs-second", env)
    result: dict[str, Any] = {"phase": "second", "job_id": phase["job_id"]}
    started = time.monotonic()
    try:
        base_url = start_service(children, free_port())
        config = worker_toml("gpu-b", workdir, models_line)
        start_agent(children, "gpu-b", config, base_url, None)
        headers = {"Authorization": f"Bearer {phase['api_key']}"}
        with httpx.Client(base_url=base_url + API_PREFIX, headers=headers, timeout=30) as client:
            job = _follow(client, phase["job_id"], children, started, args.timeout_s, result, say)
        if job["state"] != JobState.DONE or not job.get("evidence_id"):
            raise Failed(f"job {phase['job_id']} ended {job['state']} without evidence")
        evidence_id = job["evidence_id"]
        zipped = httpx.get(f"{base_url}/e/{evidence_id}.zip", timeout=120)
        zipped.raise_for_status()
        zip_path = out / f"{evidence_id}.zip"
        zip_path.write_bytes(zipped.content)
        for suffix, name in ((".md", "summary.md"), (".json", "summary.json")):
            page = httpx.get(f"{base_url}/e/{evidence_id}{suffix}", timeout=60)
            page.raise_for_status()
            (out / name).write_bytes(page.content)
        compared = subprocess.run(
            [sys.executable, "-m", "coldbench", "compare", str(zip_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        (out / "compare.txt").write_text(compared.stdout + compared.stderr)
        summary = json.loads((out / "summary.json").read_text())
        rows = (summary.get("reproductions") or {}).get("comparisons") or []
        result.update(
            evidence_id=evidence_id,
            hosts=[r.get("host") for r in rows[0]["runs"]] if rows else [],
            statements=[
                f"{r['variant']}@{r['context_tokens']}: {r.get('statement')}" for r in rows
            ],
            compare_exit=compared.returncode,
        )
        say("\n".join(result["statements"]))
    except BaseException:
        print(
            log_tails(workdir / "logs-second", workdir / "agent-gpu-b" / "state"), file=sys.stderr
        )
        raise
    finally:
        children.stop_all()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    workdir = args.workdir.expanduser().resolve()
    out = args.out.expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {text}", flush=True)

    result: dict[str, Any] = {"ok": False}
    try:
        if args.phase == "repo":  # the repository alone, for jobs run otherwise
            result["commits"] = planted_repository(workdir / "repo")
        else:
            result.update((first if args.phase == "first" else second)(args, workdir, out, say))
        result["ok"] = True
    except (Failed, RuntimeError, subprocess.SubprocessError, OSError) as error:
        result["error"] = str(error)[-2000:]
    finally:
        result["wall_s"] = round(time.monotonic() - started, 1)
        public = {k: v for k, v in result.items() if k != "api_key"}
        (out / f"{args.phase}.json").write_text(json.dumps(public, sort_keys=True) + "\n")
        print(json.dumps(public, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
