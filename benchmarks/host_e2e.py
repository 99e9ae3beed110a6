"""A benchmark host end to end, in one command: service, Celery, agent, a job over two refs.

On one machine (a GPU host rented for a few minutes, or this CPU) it starts the central service
on its embedded default (SQLite and kombu's SQLAlchemy broker under `--workdir`, no PostgreSQL
or Redis), one Celery worker and one agent whose worker.toml declares `--repo` as an
`adapter = "embedded"` repository with the `offline` recipe (installs nothing: each ref's
worktree runs its own engine/ and kernels/ on the host's packages, docs/KERNELS.md), enrolls
the agent and issues a submitter key with `coldbench admin` as `coldbench demo` does, submits
an A/B job over the refs with `coldbench submit`, follows it, downloads the evidence zip into
`--out`, checks it with `coldbench verify`, stops every process (also on failure, printing the
end of each log) and prints one JSON line with what it took:

- `time_to_first_evidence_s`: from the submission to the job's evidence (records uploaded,
  ingested, analysed and rendered); `time_to_upload_s` and `time_to_first_cell_s` on the way;
- `cells` (timed matrix cells in the zip), `measuring_s` (the records' first start to their
  last end: warm-ups and process replacements included, builds and the first model load not)
  and `cells_per_minute` over it; `cells_per_minute_end_to_end` over the submission-to-upload
  time (everything included);
- from the evidence's timeline (evidence/contract/timeline.py): `duty_cycle` (timed cells over the
  measuring wall), `phases` (seconds waited at the first block's start and at the later ones:
  stop, imports, load, warm-ups), `blocks`, `rounds_per_process` and `block_rule`;
- `startup_s` (until the agent registered), `wall_s`, the job and evidence ids, the zip, the
  commit each variant ran, and `verify` (`ok` or the verifier's message).

    PYTHONPATH=. python3 benchmarks/host_e2e.py --repo <coldbench repository or bundle> \\
        --ref main --ref <branch> --model <checkpoint folder | preset:tiny> \\
        --contexts 4096,16384 --rounds 6 --out <evidence folder> --workdir <scratch folder>

`--calibration FILE` gives the agent the host's `coldbench calibrate` result (worker.toml's
`calibration`): the blocks' length and the statistics follow its noise.

`--repo` is anything `git clone --mirror` takes: a checkout, a bare repository or a `git
bundle` file (`git bundle create cb.bundle main <branch>` carries both refs to a machine
without the repository). `--variant NAME:ref=R,flag=v` gives a variant in `coldbench submit`'s
syntax instead of `--ref`. Only the repository root on PYTHONPATH is needed: every process is
`python -m coldbench ...` with this interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from coldbench.demo import demo_env, prepare_database
from coldbench.evidence.contract.protocol import API_PREFIX, JobState
from coldbench.processes import Children, free_port, run_cli, wait_healthy
from coldbench.submit import progress_line

HOST_NAME = "e2e-host"
HOST_LABEL = "e2e"
REPOSITORY = "coldbench"
POLL_S = 0.2
LOG_TAIL_LINES = 30
# Lines of a log that say nothing about a failure: the agent's HTTP requests.
_NOISE = re.compile(r"INFO httpx: HTTP Request: ")


class Failed(RuntimeError):
    """The run cannot go on; the message says why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repo", required=True, help="coldbench git repository or bundle file")
    parser.add_argument("--ref", action="append", default=[], help="a ref to compare (repeat)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:ref=R[,flag=v...] as coldbench submit takes it (repeat; instead of --ref)",
    )
    parser.add_argument(
        "--model", required=True, help="a checkpoint folder (put in worker.toml) or preset:NAME"
    )
    parser.add_argument("--contexts", default="128,256")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rounds-per-process", type=int, default=None)
    parser.add_argument("--decode-tokens", type=int, default=2)
    parser.add_argument("--precision", type=float, default=None)
    parser.add_argument("--until", choices=("rounds", "decided"), default=None)
    parser.add_argument("--budget-minutes", type=float, default=None)
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="submit the job this many times, one after the other, seeds from --first-seed on"
        " (one JSON line each)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first job's seed (the jobs take it and the seeds after it): jobs run by several"
        " invocations then prompt differently",
    )
    parser.add_argument("--recipe", default="offline", help="offline (default) or editable")
    parser.add_argument("--out", required=True, type=Path, help="where the evidence zip goes")
    parser.add_argument("--workdir", required=True, type=Path, help="state, worker.toml, logs")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="for the job to finish")
    parser.add_argument("--port", type=int, default=0, help="API port (0: a free one)")
    parser.add_argument(
        "--calibration", type=Path, default=None, help="the host's coldbench calibrate result"
    )
    args = parser.parse_args(argv)
    variants = [*(f"{_variant_name(ref)}:ref={ref}" for ref in args.ref), *args.variant]
    names = [variant.split(":", 1)[0] for variant in variants]
    if len(variants) < 2 or len(set(names)) != len(names):
        parser.error("give at least two refs or variants, with distinct names")
    args.variants = variants
    return args


def _variant_name(ref: str) -> str:
    """A variant name from a ref (`fast/swiglu` -> `fast-swiglu`)."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", ref).strip("-.")[:64] or "ref"


def worker_toml(args: argparse.Namespace, agent_dir: Path) -> tuple[str, str]:
    """(worker.toml's text, the job's model name)."""
    repo = str(Path(args.repo).expanduser().resolve())
    lines = [
        f"name = {json.dumps(HOST_NAME)}",
        f"labels = [{json.dumps(HOST_LABEL)}]",
        f"state_dir = {json.dumps(str(agent_dir / 'state'))}",
    ]
    if args.calibration is not None:
        lines.append(f"calibration = {json.dumps(str(args.calibration.expanduser().resolve()))}")
    models: list[str] = []
    if args.model.startswith("preset:"):
        model = args.model
        lines.append(f"allow_presets = [{json.dumps(model.removeprefix('preset:'))}]")
    else:
        folder = Path(args.model).expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise Failed(f"--model {args.model}: no config.json there (a checkpoint folder?)")
        model = _variant_name(folder.name)
        models.append(f"{json.dumps(model)} = {json.dumps(str(folder))}")
    recipe_commands = {
        "offline": ["{python}", "-c", "import engine, {fast_path_package}"],
        "editable": [
            *("{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation"),
            *("-e", "."),
        ],
    }
    if args.recipe not in recipe_commands:
        raise Failed(f"--recipe {args.recipe}: choose offline or editable")
    lines += [
        "[models]",
        *models,
        f"[repositories.{REPOSITORY}]",
        f"url = {json.dumps(repo)}",
        'adapter = "embedded"',
        f"[repositories.{REPOSITORY}.recipes.{args.recipe}]",
        f"command = {json.dumps(recipe_commands[args.recipe])}",
    ]
    return "\n".join(lines) + "\n", model


def log_tails(log_dir: Path, agent_state: Path) -> str:
    """The end of each process's log, then of each variant process's stderr (where a refusal
    to run or a crash of the engine is told), without the per-request lines."""
    paths = [*sorted(log_dir.glob("*.log")), *sorted(agent_state.glob("runs/*/logs/*.log"))]
    parts = []
    for path in paths:
        lines = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if not _NOISE.search(line)
        ][-LOG_TAIL_LINES:]
        parts.append(f"--- {path} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(parts)


def cell_figures(zip_path: Path) -> dict[str, Any]:
    """Timed cells in the bundle, how many are ok, and how long the variant processes were
    measuring: the first record's start (a warm-up) to the last one's end, so the warm-ups and
    the processes replaced between rounds count, the builds and the first model load do not."""
    from coldbench.evidence.bundles.bundle import bundle_records, read_bundle

    records = bundle_records(read_bundle(zip_path))
    timed = [r for r in records if r.round >= 0]
    if not timed:
        return {"cells": 0, "cells_ok": 0, "measuring_s": None, "cells_per_minute": None}
    span = (max(r.ended_at for r in records) - min(r.started_at for r in records)).total_seconds()
    return {
        "cells": len(timed),
        "cells_ok": sum(r.status == "ok" for r in timed),
        "measuring_s": round(span, 2),
        "cells_per_minute": round(len(timed) * 60 / span, 2) if span > 0 else None,
    }


def timeline_figures(zip_path: Path) -> dict[str, Any]:
    """The run's duty cycle, phases and blocks from the evidence's summary
    (evidence/contract/timeline)."""
    from coldbench.evidence.bundles.bundle import read_bundle

    summary = json.loads(read_bundle(zip_path).get("summary.json", b"{}"))
    runs = (summary.get("timeline") or {}).get("runs") or []
    if not runs:
        return {}
    run = runs[0]
    return {
        "duty_cycle": run.get("duty_cycle"),
        "timed_cells_s": run.get("timed_cells_s"),
        "measuring_wall_s": run.get("measuring_wall_s"),
        "phases": {key: run.get(key) for key in ("first_block", "later_blocks")},
        "blocks": run.get("blocks"),
        "rounds_per_process": run.get("rounds_per_process"),
        "block_rule": run.get("block_rule"),
        "prespawn": run.get("prespawn"),
        "verdicts": [
            f"{c['variant']}@{c['context_tokens']}: {c['verdict']}"
            for c in summary.get("comparisons", [])
        ],
    }


def verdict_figures(zip_path: Path) -> dict[str, Any]:
    """Each prefill comparison's verdict and interval, and where measuring until decided
    stopped (summary settings' `sequential`)."""
    from coldbench.evidence.bundles.bundle import read_bundle

    summary = json.loads(read_bundle(zip_path).get("summary.json", b"{}"))
    verdicts = [
        {
            "context_tokens": c["context_tokens"],
            "variant": c["variant"],
            "ratio": c["ratio_median"],
            "ci": [c["ci_low"], c["ci_high"]],
            "verdict": c["verdict"],
            "n": c["n"],
        }
        for c in summary.get("comparisons", [])
    ]
    return {"verdicts": verdicts, "sequential": summary.get("settings", {}).get("sequential")}


def variant_commits(zip_path: Path) -> dict[str, str]:
    from coldbench.evidence.bundles.bundle import read_bundle

    provenance = json.loads(read_bundle(zip_path)["provenance.json"])
    runs = provenance.get("runs", [provenance])
    return {t["variant"]: t.get("commit") for run in runs for t in run.get("targets", [])}


def _one_job(
    args: argparse.Namespace,
    client: Any,
    children: Children,
    base_url: str,
    api_key: str,
    model: str,
    env: dict[str, str],
    seed: int,
    say: Any,
) -> dict[str, Any]:
    """Submit one job (seed `seed`), follow it, fetch and verify its evidence: its figures."""
    import httpx

    result: dict[str, Any] = {"ok": False, "seed": seed}
    out = args.out.expanduser().resolve()
    submit = [
        *("submit", "--api", base_url, "--key", api_key),
        *("--adapter", "embedded", "--repo", REPOSITORY, "--model", model),
        *(arg for variant in args.variants for arg in ("--variant", variant)),
        *("--contexts", args.contexts, "--rounds", str(args.rounds)),
        *("--decode-tokens", str(args.decode_tokens), "--labels", HOST_LABEL),
    ]
    if args.rounds_per_process is not None:
        submit += ["--rounds-per-process", str(args.rounds_per_process)]
    if args.precision is not None:
        submit += ["--precision", str(args.precision)]
    if args.until is not None:
        submit += ["--until", args.until]
    if args.budget_minutes is not None:
        submit += ["--budget-minutes", str(args.budget_minutes)]
    submit += ["--seed", str(seed)]
    submitted_at = time.monotonic()
    job_id = run_cli(submit, env, timeout_s=60).split()[1]
    result["job_id"] = job_id
    say(f"job {job_id} submitted: {base_url}/jobs/{job_id}")
    job = _follow(client, job_id, children, submitted_at, args.timeout_s, result, say)
    evidence_id = job.get("evidence_id")
    if job["state"] != JobState.DONE or not evidence_id:
        reasons = "; ".join(f"run {r['id']}: {r.get('reason')}" for r in job.get("runs", []))
        raise Failed(f"job {job_id} ended {job['state']} without evidence: {reasons}")
    result["evidence_id"] = evidence_id
    zip_path = out / f"{evidence_id}.zip"
    response = httpx.get(f"{base_url}/e/{evidence_id}.zip", timeout=120)
    response.raise_for_status()
    zip_path.write_bytes(response.content)
    result["zip"] = str(zip_path)
    say(f"evidence {base_url}/e/{evidence_id} -> {zip_path}")
    verified = subprocess.run(
        [sys.executable, "-m", "coldbench", "verify", str(zip_path), "--expect", evidence_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    last = (verified.stdout + verified.stderr).strip().splitlines()
    result["verify"] = "ok" if verified.returncode == 0 else (last or ["failed"])[-1]
    say(f"coldbench verify: {(last or [''])[-1]}")
    result.update(cell_figures(zip_path))
    result.update(timeline_figures(zip_path))
    if result["cells_per_minute"] is not None and "time_to_upload_s" in result:
        result["cells_per_minute_end_to_end"] = round(
            result["cells"] * 60 / result["time_to_upload_s"], 2
        )
    result["variants"] = variant_commits(zip_path)
    result.update(verdict_figures(zip_path))
    result["ok"] = result["verify"] == "ok"
    return result


def main(argv: list[str] | None = None) -> int:
    import httpx

    args = parse_args(argv)
    started = time.monotonic()
    workdir = args.workdir.expanduser().resolve()
    state_dir, log_dir, agent_dir = workdir / "state", workdir / "logs", workdir / "agent"
    out = args.out.expanduser().resolve()
    for folder in (state_dir, log_dir, agent_dir, out):
        folder.mkdir(parents=True, exist_ok=True)
    env = demo_env(state_dir)
    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    children = Children(log_dir, env)
    result: dict[str, Any] = {"ok": False, "workdir": str(workdir), "api": base_url}

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {text}", flush=True)

    def interrupted(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        toml, model = worker_toml(args, agent_dir)
        config = agent_dir / "worker.toml"
        config.write_text(toml, encoding="utf-8")
        (workdir / "settings.env").write_text(
            "".join(f"{k}={v}\n" for k, v in sorted(env.items()) if k.startswith("COLDBENCH_")),
            encoding="utf-8",
        )
        os.environ.update(env)  # this process prepares the database its children serve
        token, api_key = prepare_database(labels=[HOST_LABEL], key_name="host-e2e")
        children.start(
            "server",
            ["server", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        )
        children.start("celery-worker", ["celery", "worker"])
        wait_healthy(base_url, children)
        say(f"api {base_url} (embedded default in {state_dir}), celery worker up")
        secret = config.with_name(config.stem + ".secret")
        children.start(
            "agent",
            [
                *("worker", "--api", base_url, "--config", str(config)),
                *([] if secret.exists() else ["--enroll", token]),
                *("--heartbeat-s", "1", "--host-lock", str(agent_dir / "host.lock")),
            ],
        )
        headers = {"Authorization": f"Bearer {api_key}"}
        with httpx.Client(base_url=base_url + API_PREFIX, headers=headers, timeout=30) as client:
            _wait_for_host(client, children)
            result["startup_s"] = round(time.monotonic() - started, 2)
            say(f"agent {HOST_NAME} registered; submitting {', '.join(args.variants)}")
            for seed in range(args.first_seed, args.first_seed + args.jobs):
                one = _one_job(args, client, children, base_url, api_key, model, env, seed, say)
                result.update(one)
                if args.jobs > 1:
                    print(json.dumps(one, sort_keys=True), flush=True)  # its seed names the job
                if not one["ok"]:
                    break
    except (Failed, RuntimeError, subprocess.SubprocessError, OSError, httpx.HTTPError) as error:
        result["error"] = str(error)[-2000:]
        print(f"host_e2e failed: {error}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        result["error"] = "interrupted"
    finally:
        if not result["ok"]:
            print(log_tails(log_dir, agent_dir / "state"), file=sys.stderr, flush=True)
        children.stop_all()
        result["wall_s"] = round(time.monotonic() - started, 2)
        print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


def _wait_for_host(client: Any, children: Children, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children.check_alive()
        response = client.get("/hosts")
        if response.status_code == 200 and any(h["name"] == HOST_NAME for h in response.json()):
            return
        time.sleep(POLL_S)
    raise Failed(f"the agent did not register within {timeout_s:.0f} s")


def _follow(
    client: Any,
    job_id: str,
    children: Children,
    submitted_at: float,
    timeout_s: float,
    result: dict[str, Any],
    say: Any,
) -> dict[str, Any]:
    """Poll the job, print each new progress line, and note when its milestones were seen."""
    last = ""
    deadline = submitted_at + timeout_s
    while True:
        children.check_alive()
        job = client.get(f"/jobs/{job_id}").json()
        since = round(time.monotonic() - submitted_at, 2)
        line = progress_line(job)
        if line != last:
            say(line)
            last = line
        runs = job.get("runs") or [{}]
        if "time_to_first_cell_s" not in result and any(
            (run.get("progress") or {}).get("cells_done") for run in runs
        ):
            result["time_to_first_cell_s"] = since
        if "time_to_upload_s" not in result and all(
            run.get("state") in ("completed", "processed") for run in runs
        ):
            result["time_to_upload_s"] = since
        if JobState(job["state"]).is_final:
            if job.get("evidence_id"):
                result["time_to_first_evidence_s"] = since
            return job
        if time.monotonic() > deadline:
            raise Failed(f"job {job_id} not done {timeout_s:.0f} s after its submission: {line}")
        time.sleep(POLL_S)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
