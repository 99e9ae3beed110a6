"""`coldbench submit`: a submitter's client of the central API.

Options -> spec through the one builder (evidence/spec/job_options.py: every problem it finds is
reported at once, before anything is sent) -> post -> optionally wait for the evidence,
printing progress and the shareable URL.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from coldbench.evidence.contract.protocol import API_PREFIX, JobState
from coldbench.evidence.spec.job_options import (
    JOB_OPTIONS,
    SET_BY_THE_PULL_REQUEST,
    service_options,
    with_job_options,
)

app = typer.Typer()


@app.command()
@with_job_options(service_options(), help={"repository": "Allow-listed repository name."})
def submit(
    given: dict[str, Any],
    api: Annotated[str, typer.Option(envvar="COLDBENCH_API", help="Base URL of the server.")] = (
        "http://127.0.0.1:8000"
    ),
    key: Annotated[
        str | None, typer.Option(envvar="COLDBENCH_API_KEY", help="Submitter API key (cbk_...).")
    ] = None,
    pull_request: Annotated[
        str | None,
        typer.Option(
            "--pr",
            metavar="OWNER/REPO#N",
            help="Measure a pull request: its base commit against its head commit, pinned now, "
            "on the repository the service maps it to; the answer also goes on the pull "
            "request (docs/github.md). The service sets the repository and the variants. A "
            "fork's pull request needs --head SHA, the head you reviewed (it runs only while "
            "it is the head).",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the evidence and print its URL.")] = False,
    timeout_s: Annotated[float, typer.Option(help="How long --wait waits.")] = 3600.0,
) -> None:
    """Submit a job to the central API and print its id (and, with --wait, its evidence URL)."""
    from coldbench.evidence.spec.job_options import (
        JobOptionsError,
        build_job_spec,
        problem_lines,
        service_payload,
    )

    problems = [] if key else ["no API key: pass --key or set COLDBENCH_API_KEY"]
    if pull_request is not None:
        job_id = _ask_for_pull_request(api, key, pull_request, given, problems)
    else:
        try:
            request = build_job_spec(given)
        except JobOptionsError as error:
            problems += problem_lines(error)
        _exit_on(problems)
        job_id = _post_json(api, key or "", f"{API_PREFIX}/jobs", service_payload(request))
    typer.echo(f"job {job_id} submitted: {api.rstrip('/')}/jobs/{job_id}")
    if wait:
        _wait_for_evidence(api, key or "", job_id, timeout_s)


def _exit_on(problems: list[str]) -> None:
    if problems:
        for line in problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)


def _ask_for_pull_request(
    api: str, key: str | None, pull_request: str, given: dict[str, Any], problems: list[str]
) -> str:
    """Ask the service for a pull request's job (it reads the PR's commits from GitHub and
    builds the spec with the same builder); the job's id, or exit with the refusals."""
    problems += [
        f"{JOB_OPTIONS[name].flag}: the service sets it from the pull request; leave it out "
        "with --pr"
        for name in SET_BY_THE_PULL_REQUEST
        if given.get(name)
    ]
    _exit_on(problems)
    # An on/off flag left off is not an option given: `alone=False` would ask mode commits'
    # question of whatever mode the pull request gets.
    options = {
        name: "true" if value is True else str(value)
        for name, value in given.items()
        if value is not None and value is not False and name not in SET_BY_THE_PULL_REQUEST
    }
    body = {"pull_request": pull_request, "options": options}
    return _post_json(api, key or "", f"{API_PREFIX}/github/pulls", body)


def _post_json(api: str, key: str, path: str, body: dict[str, Any]) -> str:
    """Post a job's request; the job's id, or exit 1 with the server's refusals."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api.rstrip("/"), headers=headers, timeout=30.0) as client:
        try:
            response = client.post(path, json=body)
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
    return str(response.json()["id"])


def _wait_for_evidence(api: str, key: str, job_id: str, timeout_s: float) -> None:
    """Follow the job to its end; print the evidence URL, or exit 1 without evidence."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api.rstrip("/"), headers=headers, timeout=30.0) as client:
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
    warned: set[str] = set()
    while True:
        job = client.get(f"{API_PREFIX}/jobs/{job_id}").json()
        for key in ("notice", "rounds_warning"):
            # an offline host; a range whose size its host has resolved
            if job.get(key) and job[key] not in warned:
                warned.add(job[key])
                echo(f"warning: {job[key]}")
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
