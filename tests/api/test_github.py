"""The GitHub integration against a fake GitHub API on loopback, on SQLite and PostgreSQL: the
webhook's signature check before parsing, de-duplication by delivery id, who may ask, jobs on
pinned commits, the rate limit, and the answer (one comment created then edited, statuses).

The end-to-end path through a real server, Celery and an agent is
tests/worker/test_github_pull_request.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.github import answer, service
from coldbench.api.github.comment import MARKER
from coldbench.api.github.config import GitHubConfig, GitHubConfigError, load_github_config
from coldbench.api.github.models import GitHubDelivery, PullRequest, PullRequestJob
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.evidence.contract.protocol import JobState
from tests.api.factories import make_host
from tests.api.fake_github import (
    TOKEN,
    FakeGitHub,
    comment_event,
    pull_request_event,
    serve,
    signed,
)

pytestmark = pytest.mark.both_dialects

REPO = "octo/mlx-lm"
OTHER = "octo/other"
SECRET = "webhook-secret-of-mlx-lm"
OTHER_SECRET = "webhook-secret-of-other"
BASE = "a" * 40
HEAD = "b" * 40
NEW_HEAD = "c" * 40


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeGitHub, str]]:
    github = FakeGitHub()
    with serve(github) as url:
        yield github, url


@pytest.fixture
def github(fake: tuple[FakeGitHub, str]) -> FakeGitHub:
    github, _url = fake
    github.reset()
    github.permissions.update({"maintainer": "write", "reader": "read"})
    github.add_pull(REPO, 7, base=BASE, head=HEAD)
    return github


def write_config(path: Path, api_url: str, **repository: Any) -> Path:
    lines = [
        'service_url = "https://bench.example.org"',
        f'[repositories."{REPO}"]',
        f'api_url = "{api_url}"',
        f'token = "{TOKEN}"',
        f'webhook_secret = "{SECRET}"',
        'coldbench_repository = "mlx-lm"',
        *(f"{key} = {json.dumps(value)}" for key, value in repository.items()),
        f'[repositories."{REPO}".defaults]',
        'contexts = "64"',
        "rounds = 2",
        f'[repositories."{OTHER}"]',
        f'api_url = "{api_url}"',
        f'token = "{TOKEN}"',
        f'webhook_secret = "{OTHER_SECRET}"',
        'coldbench_repository = "other"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def config_path(tmp_path: Path, fake: tuple[FakeGitHub, str]) -> Path:
    return write_config(tmp_path / "github.toml", fake[1], max_jobs_per_hour=2)


@pytest.fixture
def config(config_path: Path) -> GitHubConfig:
    return load_github_config(config_path)


@pytest.fixture
def settings(settings: Settings, config_path: Path) -> Settings:
    return settings.model_copy(update={"github_config": config_path})


@pytest.fixture
def host(db_session: Session) -> None:
    make_host(db_session, labels=["lab:studio"], repositories={"mlx-lm": {"recipes": ["editable"]}})


def deliver(client: TestClient, payload: dict[str, Any], *, secret: str = SECRET, event: str):
    body, headers = signed(payload, secret, event)
    return client.post("/api/v1/github/webhook", content=body, headers=headers), headers


def ask(client: TestClient, body: str, login: str = "maintainer") -> Any:
    response, _ = deliver(client, comment_event(REPO, 7, login, body), event="issue_comment")
    assert response.status_code in (200, 202), response.text
    return response.json()


def handle(db_session: Session, settings: Settings, config: GitHubConfig) -> list[int | None]:
    pending = db_session.scalars(
        sa.select(GitHubDelivery.id).where(GitHubDelivery.handled_at.is_(None))
    ).all()
    return [
        service.handle_delivery(
            db_session=db_session, settings=settings, config=config, delivery_id=delivery_id
        )
        for delivery_id in pending
    ]


# --- the webhook ---------------------------------------------------------------------------


def test_unsigned_and_wrongly_signed_deliveries_are_refused_before_parsing(
    client: TestClient, db_session: Session, sent_tasks: Any
) -> None:
    payload = comment_event(REPO, 7, "maintainer", "/coldbench ab")
    body, headers = signed(payload, SECRET, "issue_comment")
    unsigned = {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}
    refused = client.post("/api/v1/github/webhook", content=body, headers=unsigned)
    assert refused.status_code == 403
    assert refused.json()["detail"] == "refused: no X-Hub-Signature-256 (sha256=...) header"
    # The legacy SHA-1 signature alone is not enough.
    sha1 = {**unsigned, "X-Hub-Signature": "sha1=" + "0" * 40}
    assert client.post("/api/v1/github/webhook", content=body, headers=sha1).status_code == 403
    wrong = {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}
    refused = client.post("/api/v1/github/webhook", content=body, headers=wrong)
    assert refused.status_code == 403
    assert "matches no configured webhook secret" in refused.json()["detail"]
    # A body that is not JSON but carries a valid signature is only then parsed, and refused.
    garbage, garbage_headers = b"{not json", signed({}, SECRET, "issue_comment")[1]
    import hashlib
    import hmac

    garbage_headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(SECRET.encode(), garbage, hashlib.sha256).hexdigest()
    )
    answer = client.post("/api/v1/github/webhook", content=garbage, headers=garbage_headers)
    assert (
        answer.status_code == 422 and answer.json()["detail"] == "the delivery's body is not JSON"
    )
    # Signed with another configured repository's secret: refused for this repository.
    other, _ = deliver(client, payload, secret=OTHER_SECRET, event="issue_comment")
    assert other.status_code == 403
    assert (
        other.json()["detail"] == "refused: the delivery is not signed with its repository's secret"
    )
    assert db_session.scalar(sa.select(sa.func.count()).select_from(GitHubDelivery)) == 0
    assert sent_tasks.calls == []


def test_a_redelivered_event_is_recorded_and_sent_once(
    client: TestClient, db_session: Session, sent_tasks: Any
) -> None:
    body, headers = signed(
        comment_event(REPO, 7, "maintainer", "/coldbench ab"), SECRET, "issue_comment"
    )
    first = client.post("/api/v1/github/webhook", content=body, headers=headers)
    again = client.post("/api/v1/github/webhook", content=body, headers=headers)
    assert first.status_code == 202 and first.json()["outcome"] == "accepted"
    assert again.status_code == 200 and again.json()["outcome"] == "already received"
    assert sent_tasks.named("github_handle_delivery") == [(headers["X-GitHub-Delivery"],)]
    stored = db_session.get(GitHubDelivery, headers["X-GitHub-Delivery"])
    assert stored is not None and stored.handled_at is None
    # Only the facts acted on are kept: no title, no URL from the event.
    assert stored.payload == {
        "kind": "comment",
        "number": 7,
        "login": "maintainer",
        "command": "ab",
        "label": None,
        "head_sha": None,
        "at": stored.payload["at"],
        "comment_id": stored.payload["comment_id"],
        "job_id": None,
        "installation_id": None,
    }
    assert stored.source_key == f"comment:{stored.payload['comment_id']}"


def test_events_that_ask_nothing_are_recorded_as_handled(
    client: TestClient, db_session: Session, sent_tasks: Any
) -> None:
    chat = ask(client, "Nice work! Maybe run /coldbench ab later.")
    assert chat["outcome"] == "nothing to do"
    response, _ = deliver(client, {"zen": "hi", "repository": {"full_name": REPO}}, event="ping")
    assert response.status_code == 200 and response.json()["outcome"] == "nothing to do"
    assert sent_tasks.calls == []


def test_the_webhook_without_configuration_says_so(
    client: TestClient, settings: Settings, db_session: Session
) -> None:
    client.app.state.github = None  # type: ignore[attr-defined]
    response, _ = deliver(client, comment_event(REPO, 7, "m", "/coldbench"), event="issue_comment")
    assert response.status_code == 404
    assert "COLDBENCH_GITHUB_CONFIG" in response.json()["detail"]


def test_configuration_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "github.toml"
    path.write_text(
        'service_url = "https://bench.example.org"\n[repositories."a/b"]\n'
        'webhook_secret = "short"\ncoldbench_repository = "x"\ntoken = "t"\n'
    )
    with pytest.raises(GitHubConfigError, match=r"repositories\.a/b\.webhook_secret: .*16"):
        load_github_config(path)
    path.write_text('service_url = "https://b.example"\n[repositories."a/b"]\nwebhook_secret = "')
    with pytest.raises(GitHubConfigError, match="not TOML"):
        load_github_config(path)
    config = load_github_config(write_config(path, "https://ghe.example.org/api/v3"))
    # Secrets never show in a repr or a log line.
    assert TOKEN not in repr(config) and SECRET not in repr(config)
    assert config.repository("OCTO/MLX-LM") is config.repositories[REPO]


# --- requests become jobs ------------------------------------------------------------------


def test_an_allowed_comment_starts_a_job_on_the_pinned_commits(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    ask(client, "/coldbench ab rounds=3 labels=lab:studio")
    [pull_request_id] = handle(db_session, settings, config)
    link = db_session.scalars(sa.select(PullRequestJob)).one()
    assert (link.base_sha, link.head_sha, link.asked_by) == (BASE, HEAD, "@maintainer")
    assert link.command == "/coldbench ab labels=lab:studio rounds=3"
    job = db_session.get(Job, link.job_id)
    assert job is not None and job.state == JobState.QUEUED
    assert job.spec.repository == "mlx-lm" and job.spec.adapter == "mlx-lm"
    assert [(v.name, v.ref) for v in job.spec.variants] == [("base", BASE), ("pr-7", HEAD)]
    assert (job.spec.contexts, job.spec.rounds, job.spec.host_labels) == (
        [64],
        3,
        ["lab:studio"],
    )
    # Only the configured API base was called: permission, then the pull request.
    assert [(c.method, c.path) for c in github.calls] == [
        ("GET", f"/repos/{REPO}/collaborators/maintainer/permission"),
        ("GET", f"/repos/{REPO}/pulls/7"),
    ]
    assert all(call.authorization == f"token {TOKEN}" for call in github.calls)

    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    [status] = github.statuses
    assert (status["sha"], status["state"], status["context"]) == (HEAD, "pending", "coldbench")
    assert status["target_url"] == f"https://bench.example.org/jobs/{job.id}"
    [(comment_id, comment)] = github.comments.items()
    assert comment["number"] == 7 and comment["body"].startswith(MARKER)
    assert f"[job `{job.id}`](https://bench.example.org/jobs/{job.id})" in comment["body"]
    assert "**queued**" in comment["body"]
    # Nothing changed: nothing is sent again.
    calls = len(github.calls)
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    assert len(github.calls) == calls

    # A push: the comment says its evidence is for an older head, edited in place.
    deliver(
        client,
        pull_request_event(REPO, 7, "synchronize", "maintainer", head=NEW_HEAD),
        event="pull_request",
    )
    assert handle(db_session, settings, config) == [pull_request_id]
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    assert list(github.comments) == [comment_id] and github.comments[comment_id]["edits"] == 1
    assert (
        "This evidence is for an older head** (`bbbbbbbbbb`)" in github.comments[comment_id]["body"]
    )
    assert len(github.statuses) == 1
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 1

    # A host claims the run (in the API, which sends no task): the beat task finds the job
    # whose state moved on, and the status and comment follow.
    assert answer.unanswered_pull_request_ids(db_session=db_session) == []
    job.state = JobState.RUNNING
    db_session.commit()
    assert answer.unanswered_pull_request_ids(db_session=db_session) == [pull_request_id]
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    assert [(s["state"], s["description"]) for s in github.statuses] == [
        ("pending", "queued on coldbench"),
        ("pending", "running on coldbench"),
    ]
    assert "**running**" in github.comments[comment_id]["body"]
    assert answer.unanswered_pull_request_ids(db_session=db_session) == []


def test_an_outsider_starts_nothing_and_gets_no_answer(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    ask(client, "/coldbench ab", login="reader")
    ask(client, "/coldbench ab", login="stranger")
    deliver(
        client,
        pull_request_event(REPO, 7, "labeled", "stranger", head=HEAD, label="coldbench"),
        event="pull_request",
    )
    assert handle(db_session, settings, config) == [None, None, None]
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 0
    outcomes = db_session.scalars(sa.select(GitHubDelivery.outcome)).all()
    assert sorted(outcomes) == [
        "ignored: reader may not ask",
        "ignored: stranger may not ask",
        "ignored: stranger may not ask",
    ]
    assert github.called("GET", "/pulls/") == [] and github.called("POST") == []


def test_a_listed_asker_needs_no_permission_lookup(
    tmp_path: Path,
    fake: tuple[FakeGitHub, str],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    github: FakeGitHub,
    host: None,
) -> None:
    config = load_github_config(write_config(tmp_path / "listed.toml", fake[1], askers=["Tester"]))
    ask(client, "/coldbench", login="tester")
    ask(client, "/coldbench", login="maintainer")
    handle(db_session, settings, config)
    assert [link.asked_by for link in db_session.scalars(sa.select(PullRequestJob))] == ["@tester"]
    assert github.called("GET", "/permission") == []


def test_refusals_are_answered_on_the_pull_request(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    ask(client, "/coldbench ab contexts=<b>4Q</b>")
    [pull_request_id] = handle(db_session, settings, config)
    pull = db_session.get(PullRequest, pull_request_id)
    assert pull is not None
    assert pull.notice == (
        "@maintainer: not started: contexts: '<b>4Q</b>' is not a token count "
        "(e.g. 512, 4096, 4K or 1M)"
    )
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    [comment] = github.comments.values()
    # The service's Markdown never passes on HTML that came from GitHub.
    assert "<b>" not in comment["body"] and "&lt;b&gt;4Q&lt;/b&gt;" in comment["body"]

    # No host allows the repository the pull request maps to: the service's own refusal.
    ask(client, "/coldbench ab labels=lab:nowhere")
    handle(db_session, settings, config)
    assert "not started: no registered host can run this job" in (pull.notice or "")

    # The rate limit per pull request: two jobs in the hour, then a refusal.
    for _ in range(3):
        ask(client, "/coldbench")
    handle(db_session, settings, config)
    assert db_session.scalar(sa.select(sa.func.count()).select_from(PullRequestJob)) == 2
    assert pull.notice == (
        "@maintainer: not started: this pull request had 2 jobs in the last hour; ask again later"
    )


def test_a_closed_pull_request_is_not_measured(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    github.add_pull(REPO, 7, base=BASE, head=HEAD, state="closed")
    ask(client, "/coldbench")
    handle(db_session, settings, config)
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 0
    assert db_session.scalars(sa.select(PullRequest.notice)).one() == (
        "@maintainer: not started: the pull request is closed"
    )


def test_a_label_and_an_allowed_push_start_the_default_request(
    tmp_path: Path,
    fake: tuple[FakeGitHub, str],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    github: FakeGitHub,
    host: None,
) -> None:
    config = load_github_config(
        write_config(tmp_path / "auto.toml", fake[1], auto_run_on_push=True)
    )
    deliver(
        client,
        pull_request_event(REPO, 7, "labeled", "maintainer", head=HEAD, label="bug"),
        event="pull_request",
    )
    deliver(
        client,
        pull_request_event(REPO, 7, "labeled", "maintainer", head=HEAD, label="coldbench"),
        event="pull_request",
    )
    handle(db_session, settings, config)
    github.add_pull(REPO, 7, base=BASE, head=NEW_HEAD)
    deliver(
        client,
        pull_request_event(REPO, 7, "synchronize", "maintainer", head=NEW_HEAD),
        event="pull_request",
    )
    deliver(
        client,
        pull_request_event(REPO, 7, "synchronize", "stranger", head=NEW_HEAD),
        event="pull_request",
    )
    handle(db_session, settings, config)
    links = db_session.scalars(sa.select(PullRequestJob).order_by(PullRequestJob.created_at))
    assert [(link.head_sha, link.command) for link in links] == [
        (HEAD, "/coldbench ab"),
        (NEW_HEAD, "/coldbench ab"),
    ]


def test_conclusions_follow_the_policy() -> None:
    from coldbench.api.github.config import StatusPolicy
    from coldbench.evidence.contract.summary_schema import Comparison, Summary

    def summary(*verdicts: tuple[str, float]) -> Summary:
        comparisons = [
            Comparison.model_construct(verdict=verdict, ratio_median=ratio)
            for verdict, ratio in verdicts
        ]
        return Summary.model_construct(comparisons=comparisons)

    strict, lenient = StatusPolicy(), StatusPolicy(failure_slower_pct=5)
    assert answer.conclusion(strict, summary(("faster", 1.1))) == "success"
    assert answer.conclusion(strict, summary(("faster", 1.1), ("slower", 0.98))) == "failure"
    assert answer.conclusion(lenient, summary(("faster", 1.1), ("slower", 0.98))) == "success"
    assert answer.conclusion(lenient, summary(("slower", 0.9))) == "failure"
    assert answer.conclusion(strict, summary(("no established change", 1.0))) == "neutral"
    assert answer.conclusion(strict, summary(("inconclusive", 0.9))) == "neutral"


def test_a_github_app_reports_check_runs_with_installation_tokens(
    tmp_path: Path,
    fake: tuple[FakeGitHub, str],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    github: FakeGitHub,
    host: None,
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "app.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    github.app_id, github.app_public_key = (
        4242,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    path = tmp_path / "app.toml"
    path.write_text(
        'service_url = "https://bench.example.org"\n'
        f'[repositories."{REPO}"]\n'
        f'api_url = "{fake[1]}"\n'
        "app_id = 4242\n"
        f'private_key_file = "{pem}"\n'
        f'webhook_secret = "{SECRET}"\n'
        'coldbench_repository = "mlx-lm"\n'
        'report = "check-run"\n'
        f'[repositories."{REPO}".defaults]\n'
        'contexts = "64"\n'
    )
    config = load_github_config(path)
    response, _ = deliver(
        client,
        comment_event(REPO, 7, "maintainer", "/coldbench", installation=77),
        event="issue_comment",
    )
    assert response.status_code == 202
    [pull_request_id] = handle(db_session, settings, config)
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    # Each answer takes an installation token with a JWT signed by the App's key.
    assert [c.path for c in github.called("POST", "/access_tokens")] == [
        "/app/installations/77/access_tokens"
    ] * 2
    assert all(
        c.authorization == "token ghs_fake_installation_token"
        for c in github.calls
        if "/access_tokens" not in c.path
    )
    [(check_id, check)] = github.check_runs.items()
    assert (check["head_sha"], check["name"], check["status"]) == (HEAD, "coldbench", "queued")
    assert github.statuses == []

    job = db_session.scalars(sa.select(Job)).one()
    job.state, job.reason = JobState.FAILED, "every run failed: build failed"
    db_session.commit()
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    assert github.check_runs[check_id]["updates"][0]["status"] == "queued"
    final = github.check_runs[check_id]["updates"][-1]
    assert (final["status"], final["conclusion"]) == ("completed", "failure")
    assert final["output"]["summary"] == "every run failed: build failed"
    [comment] = github.comments.values()
    assert "**failed**" in comment["body"] and "every run failed: build failed" in comment["body"]
    assert len(github.check_runs) == 1


def test_a_submitter_asks_for_a_pull_request_through_the_api(
    client: TestClient,
    db_session: Session,
    github: FakeGitHub,
    host: None,
    sent_tasks: Any,
) -> None:
    from tests.api.conftest import bearer
    from tests.api.factories import make_api_key

    key = bearer(make_api_key(db_session, "alice"))
    asked = {"pull_request": f"{REPO}#7", "options": {"contexts": "64, 128", "rounds": "2"}}
    assert client.post("/api/v1/github/pulls", json=asked).status_code == 401
    created = client.post("/api/v1/github/pulls", json=asked, headers=key)
    assert created.status_code == 201, created.text
    job = created.json()
    assert [(v["name"], v["ref"]) for v in job["spec"]["variants"]] == [
        ("base", BASE),
        ("pr-7", HEAD),
    ]
    assert (job["spec"]["contexts"], job["spec"]["rounds"]) == ([64, 128], 2)
    link = db_session.get(PullRequestJob, job["id"])
    assert link is not None and link.asked_by == "API key alice"
    assert link.command == "/coldbench ab contexts=64, 128 rounds=2"
    assert sent_tasks.named("github_answer_pull_request") == [(link.pull_request_id,)]

    def refused(body: dict[str, Any]) -> tuple[int, str]:
        response = client.post("/api/v1/github/pulls", json=body, headers=key)
        return response.status_code, response.json()["detail"]

    assert refused({"pull_request": "octo/unknown#7"}) == (
        404,
        "octo/unknown is not a repository this service answers on GitHub",
    )
    assert refused({"pull_request": f"{REPO}#8"}) == (
        404,
        f"GitHub has no pull request {REPO}#8",
    )
    assert refused({**asked, "options": {"repository": "other"}})[1].startswith(
        "unknown option `repository`"
    )
    assert refused({**asked, "options": {"contexts": "4Q"}}) == (
        422,
        "contexts: '4Q' is not a token count (e.g. 512, 4096, 4K or 1M)",
    )
    assert refused({"pull_request": "octo/mlx-lm#x"})[0] == 422
    assert refused({**asked, "options": {"contexts": "64\n/coldbench"}})[0] == 422
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 1


def test_the_form_asks_for_a_pull_request(
    client: TestClient,
    db_session: Session,
    github: FakeGitHub,
    host: None,
    sent_tasks: Any,
) -> None:
    from tests.api.factories import make_api_key
    from tests.web.builders import login
    from tests.web.test_form import _errors, _fields

    login(client, make_api_key(db_session, "bob"))
    page = client.get("/").text
    assert 'name="pull_request"' in page and f"{REPO}#123" in page
    fields = _fields(page, pull_request=f"{REPO}#7", custom_contexts="64", rounds="2")
    # The variant rows say something else: the pull request's commits are measured instead.
    fields["variant-1-flags"] = "prefill_step_size=32"
    response = client.post("/", data=fields, follow_redirects=False)
    assert response.status_code == 303, _errors(response.text)
    job = db_session.get(Job, response.headers["location"].removeprefix("/jobs/"))
    assert job is not None
    assert [(v.name, v.ref, v.flags) for v in job.spec.variants] == [
        ("base", BASE, {}),
        ("pr-7", HEAD, {}),
    ]
    assert (job.spec.contexts, job.spec.rounds) == ([64], 2)
    link = db_session.get(PullRequestJob, job.id)
    assert link is not None and link.asked_by == "API key bob"
    assert len(sent_tasks.named("github_answer_pull_request")) == 1

    for typed, message in [
        ("octo/mlx-lm#seven", "write the pull request as OWNER/REPO#N"),
        ("octo/nowhere#7", "octo/nowhere is not a repository this service answers on GitHub"),
    ]:
        refused = client.post("/", data={**fields, "pull_request": typed})
        assert refused.status_code == 422
        assert _errors(refused.text)["pull_request"] == message
        assert f'value="{typed}"' in refused.text
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 1


def test_requests_go_only_to_the_configured_api_base(
    config: GitHubConfig, github: FakeGitHub
) -> None:
    import asyncio

    from coldbench.api.github.client import OutboundRefused, github_api

    repository = config.repositories[REPO]

    async def elsewhere(url: str) -> None:
        async with github_api(repository) as gh:
            await gh.getitem(url)

    prefix = repository.api_base.removesuffix("/api/v3")
    for url in ("https://evil.example/repos/x", f"{prefix}/api/v30/x", f"{prefix}/other"):
        with pytest.raises(OutboundRefused):
            asyncio.run(elsewhere(url))
    assert github.calls == []


def test_a_deleted_comment_is_created_again_and_a_handled_delivery_is_not_redone(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    response = ask(client, "/coldbench")
    [pull_request_id] = handle(db_session, settings, config)
    assert (
        service.handle_delivery(
            db_session=db_session,
            settings=settings,
            config=config,
            delivery_id=response["delivery"],
        )
        is None
    )
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    [first] = github.comments
    del github.comments[first]  # someone deleted it
    job = db_session.scalars(sa.select(Job)).one()
    job.state = JobState.RUNNING
    db_session.commit()
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_request_id
    )
    [second] = github.comments
    assert second != first and github.comments[second]["body"].startswith(MARKER)
    assert db_session.get(PullRequest, pull_request_id).comment_id == second  # type: ignore[union-attr]
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 1


def test_mode_commits_measures_the_pull_requests_line_from_its_merge_base(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    from coldbench.api.github.commands import CommandError, available_modes, parse_command

    if "commits" not in available_modes():
        # Until the service's job spec has the mode, a request for it is refused in one line.
        with pytest.raises(CommandError, match="unknown mode `commits`; modes: ab, abl"):
            parse_command("commits")
        return
    merge_base = "d" * 40
    github.add_pull(REPO, 7, base=BASE, head=HEAD, merge_base=merge_base)
    ask(client, "/coldbench commits alone=true contexts=64 rounds=2")
    handle(db_session, settings, config)
    link = db_session.scalars(sa.select(PullRequestJob)).one()
    assert (link.base_sha, link.head_sha) == (merge_base, HEAD)
    job = db_session.get(Job, link.job_id)
    assert job is not None and job.spec.mode == "commits"
    commits = job.spec.commits  # Job.spec is a JobSpec (api/database.py SpecColumn)
    assert (commits.base, commits.head, commits.alone) == (merge_base, HEAD, True)
    assert github.called("GET", f"/compare/{BASE}...{HEAD}")


def test_a_push_to_a_pull_request_nobody_asked_about_gets_no_comment(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
) -> None:
    deliver(
        client,
        pull_request_event(REPO, 9, "synchronize", "maintainer", head=NEW_HEAD),
        event="pull_request",
    )
    assert handle(db_session, settings, config) == [None]
    pull = db_session.scalars(sa.select(PullRequest)).one()
    assert (pull.number, pull.head_sha) == (9, NEW_HEAD)
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull.id
    )
    assert github.calls == []
