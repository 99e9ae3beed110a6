"""`coldbench submit`: a submitter's client of the central API.

Builds a job spec from options (validated locally with the same `JobSpec` the server uses, so
most mistakes are caught before anything is sent), posts it, and optionally waits for the
evidence, printing progress and the shareable URL.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from evidence.protocol import API_PREFIX, JobState

app = typer.Typer()


@app.command()
def submit(
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant",
            help="NAME[:ref=R,recipe=X,flag=value...]; the first is the baseline. History over "
            "--range and bisect: one variant without ref= (the configuration), default `base`.",
        ),
    ] = None,
    contexts: Annotated[
        str, typer.Option(help="Prompt lengths in tokens: 128,256 or 4K,16K (K=1024, M=1024K).")
    ] = "128,256",
    api: Annotated[str, typer.Option(envvar="COLDBENCH_API", help="Base URL of the server.")] = (
        "http://127.0.0.1:8000"
    ),
    key: Annotated[
        str | None, typer.Option(envvar="COLDBENCH_API_KEY", help="Submitter API key (cbk_...).")
    ] = None,
    repo: Annotated[str | None, typer.Option(help="Allow-listed repository name.")] = None,
    adapter: Annotated[
        str | None,
        typer.Option(help="embedded, mlx-lm or openai-server (default: mlx-lm with --repo)."),
    ] = None,
    rounds: int = 3,
    decode_tokens: int = 8,
    model: str = "preset:tiny",
    mode: Annotated[
        str,
        typer.Option(
            help="ab, ablation, sweep, history (each --variant ref=COMMIT against the first, "
            "or --range), or bisect (--good, --bad, --direction)."
        ),
    ] = "ab",
    commit_range: Annotated[
        str | None,
        typer.Option(
            "--range",
            help="History: A..B, resolved by the host in its mirror: each commit on B's "
            "first-parent line after A, against A.",
        ),
    ] = None,
    every: Annotated[
        int | None, typer.Option(min=1, help="History: every Nth commit (counted back from B).")
    ] = None,
    last: Annotated[int | None, typer.Option(min=1, help="History: the newest N commits.")] = None,
    good: Annotated[str | None, typer.Option(help="Bisect: a ref that is not yet changed.")] = None,
    bad: Annotated[str | None, typer.Option(help="Bisect: a ref that is changed.")] = None,
    direction: Annotated[
        str | None, typer.Option(help="Bisect: the change to find, slower or faster.")
    ] = None,
    features: Annotated[
        str, typer.Option(help="Ablation features: flag or flag=value, comma-separated.")
    ] = "",
    labels: Annotated[str, typer.Option(help="Host labels the job needs, comma-separated.")] = "",
    hosts: Annotated[int, typer.Option(help="Reproductions on this many distinct hosts.")] = 1,
    rounds_per_process: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Rounds one process per variant measures before every variant's process is "
            "replaced (default: rounds // 12, at least 1).",
        ),
    ] = None,
    fresh_process: Annotated[
        bool, typer.Option(help="A fresh process per cell (slow; no process offsets at all).")
    ] = False,
    precision: Annotated[
        float,
        typer.Option(
            help="Verdict precision: 'no established change' needs the interval inside 1 +/- this."
        ),
    ] = 0.05,
    seed: int = 0,
    corpus: Annotated[
        str, typer.Option(help="Prompt corpus: builtin, or a name from hosts' worker.toml.")
    ] = "builtin",
    wait: Annotated[bool, typer.Option(help="Wait for the evidence and print its URL.")] = False,
    timeout_s: Annotated[float, typer.Option(help="How long --wait waits.")] = 3600.0,
) -> None:
    """Submit a job to the central API and print its id (and, with --wait, its evidence URL)."""
    import httpx
    from pydantic import ValidationError

    from evidence.schemas import JobSpec, error_line
    from evidence.spec_text import parse_contexts, parse_features, split_list
    from evidence.variant import parse_variant

    if not key:
        typer.echo("error: no API key: pass --key or set COLDBENCH_API_KEY", err=True)
        raise typer.Exit(2)
    resolved_on_host = commit_range is not None or mode == "bisect"
    if not variant and not resolved_on_host:
        typer.echo("error: give at least one --variant NAME[:...]", err=True)
        raise typer.Exit(2)
    if mode != "bisect" and any(option is not None for option in (good, bad, direction)):
        typer.echo("error: --good, --bad and --direction belong to --mode bisect", err=True)
        raise typer.Exit(2)
    if mode != "history" and any(option is not None for option in (commit_range, every, last)):
        typer.echo("error: --range, --every and --last belong to --mode history", err=True)
        raise typer.Exit(2)
    if (every is not None or last is not None) and commit_range is None:
        typer.echo("error: --every and --last thin a --range", err=True)
        raise typer.Exit(2)
    if mode == "bisect" and (good is None or bad is None or direction is None):
        typer.echo("error: --mode bisect needs --good REF, --bad REF and --direction", err=True)
        raise typer.Exit(2)
    parsed_variants = []
    for text in variant or ["base"]:
        try:
            parsed_variants.append(parse_variant(text).model_dump(exclude_none=True))
        except ValueError as error:
            typer.echo(f"error: --variant {text!r}: {error}", err=True)
            raise typer.Exit(2) from None
    try:
        parsed_contexts = parse_contexts(contexts)
    except ValueError as error:
        typer.echo(f"error: --contexts {contexts!r}: {error}", err=True)
        raise typer.Exit(2) from None
    raw_spec: dict[str, Any] = {
        "mode": mode,
        "adapter": adapter or ("mlx-lm" if repo else "embedded"),
        "repository": repo,
        "variants": parsed_variants,
        "features": parse_features(features),
        "contexts": parsed_contexts,
        "rounds": rounds,
        "decode_tokens": decode_tokens,
        "model": model,
        "seed": seed,
        "corpus": corpus,
        "host_labels": split_list(labels),
        "hosts": hosts,
        "rounds_per_process": rounds_per_process,
        "fresh_process": fresh_process,
        "precision": precision,
    }
    if commit_range is not None:
        raw_spec["history"] = {"range": commit_range, "every": every, "last": last}
    if mode == "bisect":
        raw_spec["bisect"] = {"good": good, "bad": bad, "direction": direction}
    try:
        spec = JobSpec.model_validate(raw_spec)
    except ValidationError as error:
        typer.echo(f"error: {error_line(error, whole='job')}", err=True)
        raise typer.Exit(2) from None

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api.rstrip("/"), headers=headers, timeout=30.0) as client:
        try:
            response = client.post(
                f"{API_PREFIX}/jobs", json=spec.model_dump(mode="json", by_alias=True)
            )
        except httpx.HTTPError as error:
            typer.echo(f"error: cannot reach {api}: {error}", err=True)
            raise typer.Exit(1) from None
        if response.status_code != 201:
            typer.echo(
                f"error: the server refused the job ({response.status_code})"
                f"{_field(response)}: {_detail(response)}",
                err=True,
            )
            raise typer.Exit(1)
        job = response.json()
        job_id = job["id"]
        typer.echo(f"job {job_id} submitted: {api.rstrip('/')}/jobs/{job_id}")
        if not wait:
            return
        job = wait_for_job(
            client, job_id, timeout_s=timeout_s, echo=lambda line: typer.echo(line, err=True)
        )
    evidence_id = job.get("evidence_id")
    if job.get("state") != JobState.DONE or not evidence_id:
        typer.echo(f"job {job_id} ended {job.get('state')} without evidence", err=True)
        raise typer.Exit(1)
    typer.echo(f"evidence: {api.rstrip('/')}/e/{evidence_id}")


def wait_for_job(
    client: Any, job_id: str, *, timeout_s: float, echo: Any, poll_s: float = 1.0
) -> dict[str, Any]:
    """Poll `GET /api/v1/jobs/{id}` until the job ends, echoing progress lines as they change."""
    deadline = time.monotonic() + timeout_s
    last_line = ""
    while True:
        job = client.get(f"{API_PREFIX}/jobs/{job_id}").json()
        line = progress_line(job)
        if line != last_line:
            echo(line)
            last_line = line
        if JobState(job["state"]).is_final:
            return job
        if time.monotonic() > deadline:
            echo(f"gave up waiting after {timeout_s:.0f} s")
            return job
        time.sleep(poll_s)


def progress_line(job: dict[str, Any]) -> str:
    parts = [f"job {job.get('id')}: {job.get('state')}"]
    for run in job.get("runs", []):
        progress = run.get("progress") or {}
        done, total = progress.get("cells_done"), progress.get("cells_total")
        cells = f" {done}/{total} cells" if total else ""
        parts.append(f"run {run.get('id')} [{run.get('state')}]{cells}")
    for step in job.get("steps", []):  # a bisection: its steps, each a job of its own
        done, total = step.get("cells_done"), step.get("cells_total")
        cells = f" {done}/{total} cells" if total else ""
        decision = f" {step['decision']}" if step.get("decision") else ""
        parts.append(f"step {step.get('step')} [{step.get('state')}{decision}]{cells}")
    return "; ".join(parts)


def _field(response: Any) -> str:
    """` [field adapter]` when the refusal names the spec field it is about."""
    try:
        body = response.json()
    except ValueError:
        return ""
    field = body.get("field") if isinstance(body, dict) else None
    return f" [field {field}]" if field else ""


def _detail(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return str(detail)[:2000]
