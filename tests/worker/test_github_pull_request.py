"""A pull request asks for evidence and gets it, end to end: PostgreSQL, `coldbench server`, a
Celery worker, `coldbench worker` as the host, and a fake GitHub API on loopback that records
every call.

The pull request's head commit exists upstream only as `refs/pull/7/head` (as a fork's does):
the host's mirror fetches it, and the job runs the commits pinned when it was asked for.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.fake_github import TOKEN, FakeGitHub, comment_event, serve, signed
from tests.stack import Stack, free_port, running_stack, stop_process
from tests.worker.conftest import PATH_RECIPE_COMMAND, git
from tests.worker.test_agent import write_config

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REPO = "octo/mlx-lm"
SECRET = "end-to-end-webhook-secret"


def _upstream(mlx_lm_repo: tuple[Path, tuple[str, str]], root: Path) -> tuple[Path, str, str]:
    """(upstream repository, base commit, head commit): main, and the slow-prefill branch's
    commit only under refs/pull/7/head."""
    source, (main, slow) = mlx_lm_repo
    upstream = root / "upstream"
    git(
        root,
        "clone",
        "-q",
        "--bare",
        "--branch",
        main,
        "--single-branch",
        str(source),
        str(upstream),
    )
    git(upstream, "fetch", "-q", str(source), f"{slow}:refs/pull/7/head")
    base = git(upstream, "rev-parse", main)
    head = git(upstream, "rev-parse", "refs/pull/7/head")
    assert git(upstream, "branch", "--contains", head) == ""  # no branch holds it
    return upstream, base, head


def _github_config(path: Path, api_url: str, service_url: str) -> Path:
    path.write_text(
        f'service_url = "{service_url}"\n'
        f'[repositories."{REPO}"]\n'
        f'api_url = "{api_url}"\n'
        f'token = "{TOKEN}"\n'
        f'webhook_secret = "{SECRET}"\n'
        'coldbench_repository = "mlx-lm"\n'
        f'[repositories."{REPO}".defaults]\n'
        'contexts = "64"\n'
        "rounds = 2\n"
        'model = "preset:micro"\n'
    )
    return path


def _deliver(url: str, payload: dict[str, Any], *, secret: str = SECRET) -> httpx.Response:
    body, headers = signed(payload, secret, "issue_comment")
    return httpx.post(f"{url}/api/v1/github/webhook", content=body, headers=headers, timeout=30)


def _wait(condition: Any, timeout_s: float, what: str, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: {log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.5)


def test_a_comment_asks_and_the_pull_request_gets_the_evidence(
    mlx_lm_repo: tuple[Path, tuple[str, str]],
    micro_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream, base, head = _upstream(mlx_lm_repo, tmp_path)
    github = FakeGitHub(permissions={"maintainer": "write"})
    github.add_pull(REPO, 7, base=base, head=head)
    with serve(github) as api_url:
        port = free_port()
        config = _github_config(tmp_path / "github.toml", api_url, f"http://127.0.0.1:{port}")
        monkeypatch.setenv("COLDBENCH_GITHUB_CONFIG", str(config))
        settings = {"COLDBENCH_GITHUB_CONFIG": str(config), "COLDBENCH_LEASE_POLL_S": "0.2"}
        with running_stack(
            tmp_path / "service", server=False, api_key="worker-tests", settings=settings
        ) as service:
            service.start_server(port=port)
            service.start_celery()
            host = write_config(
                tmp_path / "host" / "worker.toml",
                name="host-gh",
                repositories={"mlx-lm": (str(upstream), ["e"])},
                command=PATH_RECIPE_COMMAND,  # the pull request's path is the subject
            )
            log = tmp_path / "agent.log"
            agent = service.start_agent(host, token=service.enrollment_token(), log=log)
            try:
                service.wait_hosts({"host-gh"}, [(agent, log)])
                _ask_and_check(service, github, base, head, log)
            finally:
                stop_process(agent)


def _ask_and_check(service: Stack, github: FakeGitHub, base: str, head: str, log: Path) -> None:
    payload = comment_event(REPO, 7, "maintainer", "Please measure.\r\n/coldbench ab")
    body, headers = signed(payload, SECRET, "issue_comment")
    unsigned = {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}
    url = f"{service.url}/api/v1/github/webhook"
    assert httpx.post(url, content=body, headers=unsigned, timeout=30).status_code == 403
    wrong = _deliver(service.url, payload, secret="another-secret-entirely")
    assert wrong.status_code == 403
    outsider = _deliver(service.url, comment_event(REPO, 7, "passer-by", "/coldbench ab"))
    assert outsider.status_code == 202

    accepted = httpx.post(url, content=body, headers=headers, timeout=30)
    assert accepted.status_code == 202, accepted.text
    redelivered = httpx.post(url, content=body, headers=headers, timeout=30)
    assert redelivered.status_code == 200 and redelivered.json()["outcome"] == "already received"

    rows = _wait(
        lambda: service.rows("select job_id, base_sha, head_sha from github_pull_request_jobs"),
        120,
        "no job for the pull request",
        service.root / "server.log",
    )
    [(job_id, linked_base, linked_head)] = rows
    assert (linked_base, linked_head) == (base, head)
    job = service.job(job_id)
    assert [(v["name"], v["ref"]) for v in job["spec"]["variants"]] == [
        ("base", base),
        ("pr-7", head),
    ]

    def evidence_in_comment() -> bool:
        bodies = [c["body"] for c in github.comments.values()]
        return any("Evidence id: [`" in text for text in bodies)

    _wait(evidence_in_comment, 900, "the evidence never reached the comment", log)
    job = service.job(job_id)
    assert job["state"] == "done", job
    # Both deliveries of one id and the outsider's comment started nothing more.
    assert len(service.rows("select id from jobs")) == 1

    # One comment, created once and edited in place; it leads with the verdicts.
    [(comment_id, comment)] = github.comments.items()
    assert len(github.called("POST", "/issues/7/comments")) == 1
    assert github.called("PATCH", f"/issues/comments/{comment_id}")
    text = comment["body"]
    assert text.startswith("<!-- coldbench:pull-request -->")
    evidence_url = f"{service.url}/e/{job['evidence_id']}"
    assert f"Evidence id: [`{job['evidence_id']}`]({evidence_url})" in text
    assert text.index("pr-7") < text.index("### Cold prefill") < text.index("Reproduce:")
    assert head[:12] in text and base[:12] in text  # the commits as built, from provenance
    # A pull request is public: the host's paths (its checkout, the service's folders) are not.
    assert not re.search(r"(?<![\w:/])/(?:tmp|private|home|Users)/", text), text

    # The status on the measured head: pending while queued and running, then final.
    states = [s["state"] for s in github.statuses if s["sha"] == head]
    assert states[0] == "pending" and states[-1] in ("success", "failure"), github.statuses
    assert github.statuses[-1]["target_url"] == evidence_url
    # Nothing was sent anywhere but the configured API, and only with its token.
    assert all(call.authorization == f"token {TOKEN}" for call in github.calls)

    # From the command line: the same pull request, its commits pinned by the service.
    printed = service.cli(
        *("submit", "--api", service.url, "--key", service.api_key),
        *("--pr", f"{REPO}#7", "--contexts", "64", "--rounds", "2"),
    )
    job_id = printed.split()[1]
    asked = service.rows(
        "select asked_by, head_sha from github_pull_request_jobs where job_id = :job",
        job=job_id,
    )
    assert [tuple(row) for row in asked] == [("API key worker-tests", head)]
    assert [v["ref"] for v in service.job(job_id)["spec"]["variants"]] == [base, head]
