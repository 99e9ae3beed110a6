"""`coldbench submit` against a real server (PostgreSQL, `coldbench server` as a child)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.stack import Stack

pytestmark = pytest.mark.slow


def _submit(service, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "coldbench", "submit", "--api", service.url, *args],
        env={**service.env, "COLDBENCH_API_KEY": key if key is not None else service.api_key},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_posts_a_valid_job_and_reports_refusals_in_one_line(service: Stack) -> None:
    token = service.enrollment_token("lab:test")
    registered = httpx.post(
        f"{service.url}/api/v1/workers/register",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "name": "submit-a",
            "fingerprint": {"backend": "cpu"},
            "labels": ["lab:test"],
            "repositories": {},
            "models": ["preset:tiny"],
        },
        timeout=30,
    )
    assert registered.status_code == 201, registered.text

    done = _submit(
        service,
        "--variant",
        "stock:prefill_step_size=32",
        "--variant",
        "wide:prefill_step_size=64,clear_cache=false",
        "--contexts",
        "64,128",
        "--rounds",
        "2",
        "--labels",
        "lab:test",
        "--rounds-per-process",
        "1",
        "--precision",
        "0.02",
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[1]
    job = service.job(job_id)
    assert job["spec"]["variants"][1] == {
        "name": "wide",
        "ref": None,
        "recipe": None,
        "flags": {"prefill_step_size": 64, "clear_cache": False},
    }
    assert job["spec"]["contexts"] == [64, 128]
    assert (job["spec"]["rounds_per_process"], job["spec"]["precision"]) == (1, 0.02)

    # Caught locally, before anything is sent.
    bad_contexts = _submit(service, "--variant", "a", "--contexts", "12x")
    assert bad_contexts.returncode == 2
    assert "--contexts: '12x'" in bad_contexts.stderr
    # Refused by the server: no host has this label.
    no_host = _submit(service, "--variant", "a", "--contexts", "64", "--labels", "gpu:h200")
    assert no_host.returncode == 1
    assert "refused the job (422)" in no_host.stderr and "gpu:h200" in no_host.stderr
    # A wrong key and no key.
    assert _submit(service, "--variant", "a", key="cbk_x_y").returncode == 1
    no_key = _submit(service, "--variant", "a", key="")
    assert no_key.returncode == 2 and "no API key" in no_key.stderr


def test_submit_wait_ends_when_the_job_is_cancelled(service: Stack) -> None:
    token = service.enrollment_token()
    httpx.post(
        f"{service.url}/api/v1/workers/register",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "name": "submit-b",
            "fingerprint": {},
            "labels": [],
            "repositories": {},
            "models": ["preset:tiny"],
        },
        timeout=30,
    ).raise_for_status()
    with service.http() as client:
        before = {job["id"] for job in client.get("/jobs").json()}
    waiting = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coldbench",
            "submit",
            "--api",
            service.url,
            "--variant",
            "a",
            "--contexts",
            "64",
            "--wait",
        ],
        env={**service.env, "COLDBENCH_API_KEY": service.api_key},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        with service.http() as client:
            while not (jobs := [j for j in client.get("/jobs").json() if j["id"] not in before]):
                assert time.monotonic() < deadline and waiting.poll() is None
                time.sleep(0.3)
            assert client.post(f"/jobs/{jobs[0]['id']}/cancel").status_code == 200
        stdout, stderr = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1
    assert "ended cancelled without evidence" in stderr
    assert "cancelled" in stderr.splitlines()[-2]  # the last progress line


def test_every_problem_is_reported_before_anything_is_sent() -> None:
    """Nothing listens on the API address: the local checks must stop the submission, each
    problem on its own line (what each option accepts: tests/evidence/test_job_options.py)."""
    from typer.testing import CliRunner

    from coldbench.submit import app

    done = CliRunner().invoke(
        app,
        [
            *("--api", "http://127.0.0.1:9", "--key", "cbk_x_y", "--mode", "bisect"),
            *("--repo", "r", "--good", "v1", "--range", "a..b", "--contexts", "64,12x"),
        ],
    )
    assert done.exit_code == 2, done.output
    lines = done.stderr.splitlines()
    assert lines == [
        "error: --range: belongs to mode history, not bisect",
        "error: --contexts: '12x' is not a token count (e.g. 512, 4096, 4K or 1M)",
        "error: --bad: bisect needs bad: a ref that is changed",
        "error: --direction: bisect needs direction: slower or faster",
    ], lines
    assert "cannot reach" not in done.output
    no_key = CliRunner().invoke(app, ["--api", "http://127.0.0.1:9", "--key", ""])
    assert no_key.exit_code == 2 and "no API key" in no_key.stderr


def test_a_pull_request_leaves_the_repository_and_variants_to_the_service() -> None:
    """`--pr`: the service sets the repository and the pull request's commits; naming them
    too is refused before anything is sent (the request itself: tests/worker/
    test_github_pull_request.py)."""
    from typer.testing import CliRunner

    from coldbench.submit import app

    done = CliRunner().invoke(
        app,
        [
            *("--api", "http://127.0.0.1:9", "--key", "cbk_x_y", "--pr", "octo/mlx-lm#7"),
            *("--repo", "mlx-lm", "--variant", "a:ref=main", "--contexts", "64"),
        ],
    )
    assert done.exit_code == 2, done.output
    assert done.stderr.splitlines() == [
        "error: --repo: the service sets it from the pull request; leave it out with --pr",
        "error: --variant: the service sets it from the pull request; leave it out with --pr",
    ]


def test_a_pull_request_asks_only_what_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags left off are not options: the request carries what the person typed (an `alone`
    of False sent as text was refused by the service as mode commits' option)."""
    from typer.testing import CliRunner

    from coldbench import submit

    sent: list[dict] = []
    monkeypatch.setattr(
        submit, "_post_json", lambda api, key, path, body: sent.append(body) or "job-1"
    )
    base = ("--api", "http://127.0.0.1:9", "--key", "cbk_x_y", "--pr", "octo/mlx-lm#7")
    done = CliRunner().invoke(submit.app, [*base, "--contexts", "64", "--rounds", "2"])
    assert done.exit_code == 0, done.output
    assert sent == [{"pull_request": "octo/mlx-lm#7", "options": {"contexts": "64", "rounds": "2"}}]
    alone = CliRunner().invoke(submit.app, [*base, "--mode", "commits", "--alone"])
    assert alone.exit_code == 0, alone.output
    assert sent[-1]["options"] == {"mode": "commits", "alone": "true"}
    # A fork's head is named as reviewed: the service runs it only while it is the head.
    named = CliRunner().invoke(submit.app, [*base, "--head", "abc1234"])
    assert named.exit_code == 0, named.output
    assert sent[-1]["options"] == {"head": "abc1234"}


def test_rounds_left_out_are_left_to_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is sent as asked: no rounds where none were given (the service resolves the
    default, measuring until decided as every door does), `--rounds` and `--until` as given;
    the help says the defaults."""
    from typer.testing import CliRunner

    from coldbench import submit

    sent: list[dict] = []
    monkeypatch.setattr(
        submit, "_post_json", lambda api, key, path, body: sent.append(body) or "job-1"
    )
    base = ("--api", "http://127.0.0.1:9", "--key", "cbk_x_y", "--contexts", "64")
    left_out = CliRunner().invoke(submit.app, [*base])
    assert left_out.exit_code == 0, left_out.output
    assert "rounds" not in sent[-1] and sent[-1]["until"] == "decided"
    given = CliRunner().invoke(submit.app, [*base, "--rounds", "12", "--until", "rounds"])
    assert given.exit_code == 0, given.output
    assert (sent[-1]["rounds"], sent[-1]["until"]) == (12, "rounds")
    shown = CliRunner().invoke(submit.app, ["--help"], terminal_width=200).output
    helped = " ".join(re.sub("[│╭╮╰╯─]", " ", shown).split())
    assert "Default: decided." in helped
    assert "Default: 4 first looks of 10 process blocks (40 rounds)" in helped


def test_a_commits_job_is_checked_before_anything_is_sent() -> None:
    from typer.testing import CliRunner

    from coldbench.submit import app

    api = ("--api", "http://127.0.0.1:9", "--key", "cbk_x_y")
    done = CliRunner().invoke(
        app, [*api, "--mode", "commits", "--repo", "r", "--base=-x", "--variant", "a:ref=main"]
    )
    assert done.exit_code == 2, done.output
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: --variant: the commits come from base..head"), lines
    assert "error: --head: commits needs head: the PR's head" in lines
    assert "error: --base: ref '-x' is not a plain branch, tag or commit name" in lines
    elsewhere = CliRunner().invoke(app, [*api, "--base", "main", "--variant", "x"])
    assert elsewhere.exit_code == 2
    assert "error: --base: belongs to mode commits, not ab" in elsewhere.stderr


def test_waiting_on_a_bisection_shows_its_steps() -> None:
    from coldbench.submit import progress_line

    job = {
        "id": "j",
        "state": "running",
        "runs": [],
        "steps": [
            {"step": 1, "state": "done", "decision": "lower", "cells_done": 18, "cells_total": 18},
            {"step": 2, "state": "running", "decision": None, "cells_done": 3, "cells_total": 12},
        ],
    }
    assert progress_line(job) == (
        "job j: running; step 1 [done lower] 18/18 cells; step 2 [running] 3/12 cells"
    )
