"""The pull-request loop against GitHub as it behaves, on SQLite and PostgreSQL: real webhook
payload shapes (tests/api/github_payloads/, from `@octokit/webhooks-examples`), a fork pushing
after (or while) a maintainer approves, and a GitHub that answers 5xx, times out after
applying a write, refuses (401, 403) and rate-limits (primary, secondary, 429). Whatever it
answers: no unreviewed commit runs, and a pull request ends with exactly one coldbench
comment and one check run per requested head, both final.
"""

# The fixtures of tests/api/test_github.py are imported, and named again as test arguments.
# ruff: noqa: F811

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api.artifacts.store import LocalArtifactStore
from coldbench.api.database import utcnow
from coldbench.api.github import answer, client, service
from coldbench.api.github.comment import MARKER
from coldbench.api.github.config import GitHubConfig, load_github_config
from coldbench.api.github.models import GitHubDelivery, PullRequest, PullRequestJob
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.evidence.contract.protocol import JobState
from tests.api.fake_github import FakeGitHub, signed
from tests.api.test_github import (  # noqa: F401 (fixtures)
    BASE,
    HEAD,
    NEW_HEAD,
    REPO,
    SECRET,
    config,
    config_path,
    fake,
    github,
    handle,
    host,
    settings,
)
from tests.evidence.builders import provenance, simulate_run
from tests.web.builders import publish_bundle

pytestmark = pytest.mark.both_dialects

PAYLOADS = Path(__file__).parent / "github_payloads"
FORK = "contributor/mlx-lm"
PUSHED = "e" * 40
_COMMENT_IDS = itertools.count(5_000_001)


def payload(name: str) -> dict[str, Any]:
    return json.loads((PAYLOADS / f"{name}.json").read_text())


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def pr_comment(
    login: str, body: str, *, at: float, comment_id: int | None = None, number: int = 7
) -> dict[str, Any]:
    """A real `issue_comment.created` on pull request `number` of REPO."""
    event = payload("issue_comment.created")
    event["repository"]["full_name"] = REPO
    event["issue"]["number"] = number
    event["issue"]["pull_request"] = {
        "url": f"https://api.github.com/repos/{REPO}/pulls/{number}",
        "html_url": f"https://github.com/{REPO}/pull/{number}",
        "diff_url": f"https://github.com/{REPO}/pull/{number}.diff",
        "patch_url": f"https://github.com/{REPO}/pull/{number}.patch",
        "merged_at": None,
    }
    event["comment"].update(body=body, created_at=iso(at), updated_at=iso(at))
    event["comment"]["id"] = comment_id or next(_COMMENT_IDS)
    event["comment"]["user"]["login"] = event["sender"]["login"] = login
    return event


def pr_event(
    action: str, login: str, *, head: str, at: float, fork: str | None = FORK, label: str = ""
) -> dict[str, Any]:
    """A real `pull_request` event of REPO#7, its head in `fork` (None: REPO itself)."""
    event = payload(f"pull_request.{action}")
    event["repository"]["full_name"] = REPO
    event["number"] = event["pull_request"]["number"] = 7
    event["pull_request"]["updated_at"] = iso(at)
    event["pull_request"]["head"]["sha"] = head
    event["pull_request"]["head"]["repo"]["full_name"] = fork or REPO
    event["sender"]["login"] = login
    if action == "labeled":
        event["label"]["name"] = label
    return event


def deliver(client: TestClient, event: dict[str, Any], name: str) -> Any:
    body, headers = signed(event, SECRET, name)
    response = client.post("/api/v1/github/webhook", content=body, headers=headers)
    assert response.status_code in (200, 202), response.text
    return response


def answer_until_quiet(
    db_session: Session, config: GitHubConfig, pull_id: int, store: Any = None
) -> int:
    """Answer as the beat would, letting every backoff pass, until nothing is due; the
    number of answers it took."""
    for answers in range(1, 20):
        answer.answer_pull_request(
            db_session=db_session, config=config, store=store, pull_request_id=pull_id
        )
        pull = db_session.get(PullRequest, pull_id)
        assert pull is not None
        db_session.refresh(pull)
        if pull.retry_at is None and pull_id not in answer.unanswered_pull_request_ids(
            db_session=db_session
        ):
            return answers
        assert pull.retry_at is not None, "an answer is due without a backoff"
        pull.retry_at = utcnow()  # the backoff has passed
        db_session.commit()
    raise AssertionError("the answer never caught up")


@pytest.fixture
def app_config(tmp_path: Path, fake: tuple[FakeGitHub, str], github: FakeGitHub) -> GitHubConfig:
    """The repository answered by a GitHub App with check runs."""
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
    github.app_id = 4242
    github.app_public_key = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
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
    return load_github_config(path)


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The client gives up sooner than a `timeout` fault answers (1.5 s)."""
    monkeypatch.setattr(client, "TIMEOUT_S", 0.5)
    yield


def jobs(db_session: Session) -> list[PullRequestJob]:
    query = sa.select(PullRequestJob).order_by(PullRequestJob.created_at)
    return list(db_session.scalars(query))


# --- what GitHub really sends ----------------------------------------------------------------


def test_real_deliveries_are_accepted_and_refusals_answered_on_the_pull_request(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    # Every GitHub App gets these; a repository's ping names the repository, an App's not.
    for name, event in [
        ("ping", payload("ping")),
        ("ping", payload("ping.organization")),
        ("installation", payload("installation.created")),
    ]:
        if "repository" in event:
            event["repository"]["full_name"] = REPO
        response = deliver(client, event, name)
        assert (response.status_code, response.json()["outcome"]) == (200, "nothing to do")
    # A bot's comment is read (and its author, like any, asked about); a long line is
    # refused on the pull request, not at the door.
    now = time.time()
    bot = deliver(client, pr_comment("renovate[bot]", "/coldbench ab", at=now), "issue_comment")
    assert bot.status_code == 202
    long_line = "/coldbench ab " + "contexts=64 " * 200
    assert len(long_line) > 2000
    assert deliver(client, pr_comment("maintainer", long_line, at=now), "issue_comment")
    pulls = handle(db_session, settings, config)
    assert github.called("GET", "/collaborators/renovate[bot]/permission")
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 0
    [pull_id] = {p for p in pulls if p is not None}
    answer_until_quiet(db_session, config, pull_id)
    [comment] = github.marked_comments(MARKER)
    assert "> @maintainer: not started: the /coldbench line is longer than 500" in comment["body"]
    assert "&gt; @maintainer" not in comment["body"]


def test_a_bot_listed_among_the_askers_may_ask(
    tmp_path: Path,
    fake: tuple[FakeGitHub, str],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    github: FakeGitHub,
    host: None,
) -> None:
    from tests.api.test_github import write_config

    listed = load_github_config(
        write_config(tmp_path / "bots.toml", fake[1], askers=["renovate[bot]"])
    )
    deliver(client, pr_comment("renovate[bot]", "/coldbench", at=time.time()), "issue_comment")
    handle(db_session, settings, listed)
    assert [link.asked_by for link in jobs(db_session)] == ["@renovate[bot]"]


def test_one_comment_under_two_delivery_ids_is_acted_on_once(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    event = pr_comment("maintainer", "/coldbench", at=time.time(), comment_id=424242)
    first = deliver(client, event, "issue_comment")
    second = deliver(client, event, "issue_comment")  # a second hook, a new delivery id
    assert first.json()["outcome"] == "accepted"
    assert second.json()["outcome"] == "already received"
    handle(db_session, settings, config)
    assert len(jobs(db_session)) == 1
    assert db_session.scalar(sa.select(sa.func.count()).select_from(GitHubDelivery)) == 1


def test_quoted_text_notifies_nobody_and_links_nowhere(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    event = pr_comment(
        "maintainer", "/coldbench ab contexts=@octo-org/admins,https://evil.example", at=time.time()
    )
    deliver(client, event, "issue_comment")
    [pull_id] = handle(db_session, settings, config)
    assert pull_id is not None
    answer_until_quiet(db_session, config, pull_id)
    [comment] = github.marked_comments(MARKER)
    body = comment["body"]
    assert "> @maintainer: not started:" in body  # the asker is notified, the quote is Markdown
    # GitHub's mention and autolink patterns find nothing in the quoted value.
    assert not re.search(r"@[A-Za-z0-9][A-Za-z0-9-]*/", body)
    assert "https://evil" not in body and "evil.example" in body


def test_the_evidence_quoted_on_the_pull_request_notifies_nobody() -> None:
    from coldbench.api.github.comment import without_mentions

    markdown = (
        "- pr-7: `abc` fix for @octo-org/admins, cc @alice\n"
        "```sh\ngit clone git@github.com:octo/x && echo @alice\n```\n"
        "- `user@host` and @bob"
    )
    shown = without_mentions(markdown)
    assert not re.search(r"@[A-Za-z0-9]", shown.replace("`user@host`", "").split("```")[0])
    assert "git clone git@github.com:octo/x && echo @alice" in shown  # code copies as written
    assert "`user@host`" in shown and "@\u2060bob" in shown


def test_the_pull_request_shows_no_host_path() -> None:
    from coldbench.api.github.comment import without_host_paths

    markdown = (
        "Evidence id: [`ab12`](https://bench.example.org/e/ab12)\n\n```sh\n"
        "coldbench run --model /Users/ci/models/llama-3b --repo /Users/ci/src/mlx-lm "
        "--corpus code=/srv/corpora/code.txt --variant pr-7:ref=abc\n```\n"
        "- engine `/opt/homebrew/lib/python3.11/site-packages/mlx/core.so`, ~/src/x\n"
    )
    shown = without_host_paths(markdown)
    assert "--model llama-3b --repo mlx-lm --corpus code=code.txt" in shown
    assert "`core.so`, x" in shown
    assert "](https://bench.example.org/e/ab12)" in shown  # links are not paths
    assert not re.search(r"(?<![\w:/])[~/][\w.-]+/", shown)


def test_the_comment_says_where_it_ran_on_its_first_lines(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    from coldbench.api.hosts.models import Host
    from coldbench.api.runs.models import Run

    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    [pull_id] = handle(db_session, settings, config)
    assert pull_id is not None
    [link] = jobs(db_session)
    studio = db_session.scalars(sa.select(Host)).one()
    studio.fingerprint = {**studio.fingerprint, "chip": "Apple M2 Max", "memory_bytes": 64 * 2**30}
    for run in db_session.scalars(sa.select(Run).where(Run.job_id == link.job_id)):
        run.host_id = studio.id
    db_session.commit()
    answer_until_quiet(db_session, config, pull_id)
    [comment] = github.marked_comments(MARKER)
    first_screen = comment["body"].splitlines()[:3]
    assert any("on studio-1 (Apple M2 Max, 2 cores, 64 GiB)" in line for line in first_screen), (
        first_screen
    )


# --- the approval is the commit reviewed ---------------------------------------------------


def test_a_fork_push_after_the_approving_comment_never_runs(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    now = time.time()
    github.add_pull(REPO, 7, base=BASE, head=HEAD, fork=FORK)
    deliver(client, pr_event("opened", "contributor", head=HEAD, at=now - 600), "pull_request")
    # 1. The fork pushes while the service asks whether the maintainer may ask: GitHub has the
    # new head, the webhook has not heard of it yet.
    github.push_during_permission = (REPO, 7, PUSHED)
    deliver(client, pr_comment("maintainer", "/coldbench ab", at=now - 300), "issue_comment")
    [pull_id] = handle(db_session, settings, config)
    assert jobs(db_session) == []
    pull = db_session.get(PullRequest, pull_id)
    assert pull is not None and pull.notice == (
        "@maintainer: not started: the head moved to `eeeeeeeeee` after the comment (nothing "
        "pushed after an approval runs); review `eeeeeeeeee`, then comment "
        "`/coldbench head=eeeeeeeeee`"
    )
    github.push_during_permission = None
    # 2. The push's synchronize is heard before a later approval's task runs: still refused
    # (it became the head after the comment).
    deliver(
        client, pr_event("synchronize", "contributor", head=PUSHED, at=now - 60), "pull_request"
    )
    deliver(client, pr_comment("maintainer", "/coldbench ab", at=now - 120), "issue_comment")
    handle(db_session, settings, config)
    assert jobs(db_session) == []
    # 3. A delivery whose task failed (GitHub 502) is retried by the beat after a push: the
    # push is not the approved commit.
    github.fail("GET", "/pulls/7", "502")
    deliver(client, pr_comment("maintainer", "/coldbench ab", at=now - 30), "issue_comment")
    handle(db_session, settings, config)
    waiting = db_session.scalars(
        sa.select(GitHubDelivery).where(GitHubDelivery.handled_at.is_(None))
    ).one()
    assert waiting.outcome is not None and waiting.outcome.startswith("waiting")
    assert waiting.retry_at is not None and waiting.attempts == 1
    third = "f" * 40
    github.add_pull(REPO, 7, base=BASE, head=third, fork=FORK)
    deliver(client, pr_event("synchronize", "contributor", head=third, at=now - 10), "pull_request")
    waiting.retry_at = waiting.received_at = utcnow().replace(year=2000)
    db_session.commit()
    assert waiting.id in service.unhandled_delivery_ids(db_session=db_session, older_than_s=60)
    handle(db_session, settings, config)
    assert jobs(db_session) == []
    # 4. The head the maintainer names runs; a named head that is no longer the head does not.
    deliver(client, pr_comment("maintainer", "/coldbench head=eeeeeee", at=now), "issue_comment")
    handle(db_session, settings, config)
    assert jobs(db_session) == []
    assert "the head is now `ffffffffff`, not `eeeeeee`" in (pull.notice or "")
    deliver(client, pr_comment("maintainer", "/coldbench head=ffffffff", at=now), "issue_comment")
    handle(db_session, settings, config)
    [link] = jobs(db_session)
    assert (link.base_sha, link.head_sha) == (BASE, third)
    job = db_session.get(Job, link.job_id)
    assert job is not None and [v.ref for v in job.spec.variants] == [BASE, third]


def test_a_fork_whose_head_the_webhook_never_heard_of_needs_it_named(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    github.add_pull(REPO, 7, base=BASE, head=HEAD, fork="")  # the fork was since deleted
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    handle(db_session, settings, config)
    assert jobs(db_session) == []
    assert "is from a fork and its head at the moment of the comment is not known here" in (
        db_session.scalars(sa.select(PullRequest.notice)).one() or ""
    )
    # The approval heard in time: a head seen before the comment runs.
    deliver(client, pr_event("labeled", "x", head=HEAD, at=time.time() - 60), "pull_request")
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    handle(db_session, settings, config)
    assert [link.head_sha for link in jobs(db_session)] == [HEAD]


def test_a_label_on_a_fork_runs_the_head_it_was_added_to(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    github.add_pull(REPO, 7, base=BASE, head=PUSHED, fork=FORK)
    event = pr_event("labeled", "maintainer", head=HEAD, at=time.time(), label="coldbench")
    deliver(client, event, "pull_request")
    handle(db_session, settings, config)
    assert jobs(db_session) == []
    assert "the head moved from `bbbbbbbbbb` to `eeeeeeeeee` after the label" in (
        db_session.scalars(sa.select(PullRequest.notice)).one() or ""
    )


def test_submit_pr_on_a_fork_runs_only_the_head_the_submitter_names(
    client: TestClient,
    db_session: Session,
    github: FakeGitHub,
    host: None,
    sent_tasks: Any,
) -> None:
    from tests.api.conftest import bearer
    from tests.api.factories import make_api_key

    key = bearer(make_api_key(db_session, "alice"))
    github.add_pull(REPO, 7, base=BASE, head=HEAD, fork=FORK)

    def ask(**options: str) -> Any:
        body = {"pull_request": f"{REPO}#7", "options": {"contexts": "64", **options}}
        return client.post("/api/v1/github/pulls", json=body, headers=key)

    refused = ask()
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        f"{REPO}#7 is from a fork: name the head commit you reviewed, --head SHA (the form: "
        "OWNER/REPO#N@SHA); it runs only while it is the pull request's head"
    )
    moved = ask(head="eeeeeee")
    assert moved.status_code == 409
    assert moved.json()["detail"] == (
        f"{REPO}#7's head is now bbbbbbbbbb, not eeeeeee: review it and name it with --head "
        "(the form: OWNER/REPO#N@SHA)"
    )
    assert ask(head="zz").status_code == 422
    created = ask(head=HEAD[:12])
    assert created.status_code == 201, created.text
    assert [v["ref"] for v in created.json()["spec"]["variants"]] == [BASE, HEAD]
    # The form's way: the head after `@`.
    body = {"pull_request": f"{REPO}#7@{HEAD[:9]}", "options": {"contexts": "64"}}
    named = client.post("/api/v1/github/pulls", json=body, headers=key)
    assert named.status_code == 201, named.text
    body["pull_request"] = f"{REPO}#7@{PUSHED[:9]}"
    assert client.post("/api/v1/github/pulls", json=body, headers=key).status_code == 409


def test_the_form_runs_a_forks_head_only_as_named(
    client: TestClient,
    db_session: Session,
    github: FakeGitHub,
    host: None,
    sent_tasks: Any,
) -> None:
    from tests.api.factories import make_api_key
    from tests.web.builders import login
    from tests.web.test_form import _errors, _fields

    github.add_pull(REPO, 7, base=BASE, head=HEAD, fork=FORK)
    login(client, make_api_key(db_session, "bob"))
    page = client.get("/").text
    assert "OWNER/REPO#N@SHA" in page
    fields = _fields(page, pull_request=f"{REPO}#7", custom_contexts="64", rounds="2")
    refused = client.post("/", data=fields)
    assert refused.status_code == 422
    assert _errors(refused.text)["pull_request"].startswith(f"{REPO}#7 is from a fork")
    named = client.post(
        "/", data={**fields, "pull_request": f"{REPO}#7@{HEAD[:10]}"}, follow_redirects=False
    )
    assert named.status_code == 303, _errors(named.text)
    job = db_session.get(Job, named.headers["location"].removeprefix("/jobs/"))
    assert job is not None and [v.ref for v in job.spec.variants] == [BASE, HEAD]


# --- exactly one comment and one check run whatever GitHub answers ---------------------------


@pytest.mark.parametrize(
    "faults",
    [
        # The comment fails twice, then a create is applied but its answer lost.
        [
            ("POST", "/comments", "500"),
            ("POST", "/comments", "500"),
            ("POST", "/comments", "timeout"),
        ],
        # The check run is made but its answer lost; then GitHub limits and refuses.
        [
            ("POST", "/check-runs", "timeout"),
            ("PATCH", "/check-runs/", "rate-limit"),
            ("POST", "/comments", "secondary"),
            ("POST", "/access_tokens", "502"),
            ("GET", "/comments", "401"),
            ("PATCH", "/issues/comments/", "403"),
            ("PATCH", "/issues/comments/", "timeout"),
        ],
    ],
    ids=["comment-fails", "everything-fails"],
)
def test_after_any_failures_one_comment_and_one_check_run_end_final(
    faults: list[tuple[str, str, str]],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    app_config: GitHubConfig,
    github: FakeGitHub,
    host: None,
    short_timeout: None,
) -> None:
    # GitHub fails the delivery's handling once (no installation token): it waits, then runs.
    github.fail("POST", "/access_tokens", "502")
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    assert handle(db_session, settings, app_config) == [None]
    assert jobs(db_session) == []
    db_session.execute(sa.update(GitHubDelivery).values(retry_at=None))
    [pull_id] = handle(db_session, settings, app_config)
    assert pull_id is not None
    for method, fragment, kind in faults:
        github.fail(method, fragment, kind, delay_s=1.0)
    store = LocalArtifactStore(settings.artifact_dir)
    answers = answer_until_quiet(db_session, app_config, pull_id, store)
    assert answers > 1
    [link] = jobs(db_session)
    job = db_session.get(Job, link.job_id)
    assert job is not None
    job.state = JobState.RUNNING
    db_session.commit()
    answer_until_quiet(db_session, app_config, pull_id, store)
    # The evidence lands (published by the code render_evidence runs: a 10% slower head).
    records = simulate_run(effects={"base": 1.0, "pr-7": 0.9}, contexts=(64,), rounds=8)
    evidence_id = publish_bundle(
        db_session,
        settings,
        job,
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=50,
    )
    db_session.commit()
    answer_until_quiet(db_session, app_config, pull_id, store)
    assert all(fault.times == 0 for fault in github.faults), "a fault was not met"

    evidence_url = f"https://bench.example.org/e/{evidence_id}"
    [comment] = github.marked_comments(MARKER)
    assert f"Evidence id: [`{evidence_id}`]({evidence_url})" in comment["body"]
    [check] = github.check_runs_on(HEAD)
    assert check["external_id"] == f"pr-7:{job.id}"
    final = check["updates"][-1]
    assert (final["status"], final["conclusion"]) == ("completed", "failure")
    assert final["details_url"] == evidence_url
    pull = db_session.get(PullRequest, pull_id)
    assert pull is not None and pull.answer_due is False and pull.attempts == 0


def test_an_installation_token_as_token_finds_its_own_comment_too(
    tmp_path: Path,
    fake: tuple[FakeGitHub, str],
    client: TestClient,
    db_session: Session,
    settings: Settings,
    github: FakeGitHub,
    host: None,
    short_timeout: None,
) -> None:
    """A token that is no user (`GET /user` is 403 for it): its comments are a bot's."""
    from tests.api.fake_github import INSTALLATION_TOKEN, TOKEN
    from tests.api.test_github import write_config

    path = write_config(tmp_path / "installation.toml", fake[1])
    path.write_text(path.read_text().replace(TOKEN, INSTALLATION_TOKEN))
    installation = load_github_config(path)
    # Someone else's comment that copies the marker is not the service's.
    github.comments[1] = {
        "number": 7,
        "body": MARKER + " mine now",
        "edits": 0,
        "user": {"login": "mallory", "type": "User"},
    }
    github.fail("POST", "/comments", "timeout", delay_s=1.0)
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    [pull_id] = handle(db_session, settings, installation)
    assert pull_id is not None
    assert answer_until_quiet(db_session, installation, pull_id) == 2
    ours = [c for c in github.marked_comments(MARKER) if c["user"]["type"] == "Bot"]
    assert len(ours) == 1 and ours[0]["edits"] == 1
    assert github.comments[1]["body"] == MARKER + " mine now"


def test_a_later_job_cancelled_never_hides_the_evidence(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    store = LocalArtifactStore(settings.artifact_dir)
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    [pull_id] = handle(db_session, settings, config)
    assert pull_id is not None
    [first] = jobs(db_session)
    records = simulate_run(effects={"base": 1.0, "pr-7": 1.0}, contexts=(64,), rounds=6)
    job = db_session.get(Job, first.job_id)
    assert job is not None
    evidence_id = publish_bundle(
        db_session,
        settings,
        job,
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=50,
    )
    db_session.commit()
    deliver(
        client, pr_comment("maintainer", "/coldbench rounds=4", at=time.time()), "issue_comment"
    )
    handle(db_session, settings, config)
    second = jobs(db_session)[-1]
    later = db_session.get(Job, second.job_id)
    assert later is not None and later.id != job.id
    later.state, later.reason = JobState.CANCELLED, "cancelled by maintainer"
    db_session.commit()
    answer_until_quiet(db_session, config, pull_id, store)
    [comment] = github.marked_comments(MARKER)
    body = comment["body"]
    assert "**cancelled**" in body and f"[job `{later.id}`]" in body
    assert body.index("**cancelled**") < body.index("Evidence of the job before it:")
    assert f"Evidence id: [`{evidence_id}`](https://bench.example.org/e/{evidence_id})" in body


def test_a_refusal_whose_comment_failed_is_sent_by_the_catch_up(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    github.fail("POST", "/comments", "500")
    deliver(
        client, pr_comment("maintainer", "/coldbench contexts=4Q", at=time.time()), "issue_comment"
    )
    [pull_id] = handle(db_session, settings, config)
    assert pull_id is not None
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_id
    )
    assert github.marked_comments(MARKER) == []
    # Not before its backoff ends; then the beat sends it.
    assert answer.unanswered_pull_request_ids(db_session=db_session) == []
    pull = db_session.get(PullRequest, pull_id)
    assert pull is not None and pull.answer_due and pull.retry_at is not None
    pull.retry_at = utcnow()
    db_session.commit()
    assert answer.unanswered_pull_request_ids(db_session=db_session) == [pull_id]
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_id
    )
    [comment] = github.marked_comments(MARKER)
    assert "contexts: '4Q' is not a token count" in comment["body"]
    assert answer.unanswered_pull_request_ids(db_session=db_session) == []


def test_rate_limits_are_waited_out_as_github_asks(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    deliver(client, pr_comment("maintainer", "/coldbench", at=time.time()), "issue_comment")
    [pull_id] = handle(db_session, settings, config)
    assert pull_id is not None
    waits = {}
    for kind in ("secondary", "429", "rate-limit", "500"):
        github.fail("POST", "/statuses/", kind, retry_after=120)
        answer.answer_pull_request(
            db_session=db_session, config=config, store=None, pull_request_id=pull_id
        )
        pull = db_session.get(PullRequest, pull_id)
        assert pull is not None and pull.retry_at is not None
        waits[kind] = (pull.retry_at - utcnow()).total_seconds()
        pull.retry_at = utcnow()
        db_session.commit()
    # Retry-After is obeyed, the primary limit waits for its reset (5 s on), a 5xx backs off
    # exponentially (the 4th failure in a row: 30 s * 2**4, less jitter).
    assert 115 < waits["secondary"] <= 120 and 115 < waits["429"] <= 120
    assert 0 < waits["rate-limit"] <= 6
    assert 0.8 * 480 - 1 < waits["500"] <= 480
    answer.answer_pull_request(
        db_session=db_session, config=config, store=None, pull_request_id=pull_id
    )
    assert len(github.marked_comments(MARKER)) == 1


# --- re-run, and a head nobody measured ----------------------------------------------------


def test_rerun_and_a_new_head_while_a_job_runs(
    client: TestClient,
    db_session: Session,
    settings: Settings,
    app_config: GitHubConfig,
    github: FakeGitHub,
    host: None,
) -> None:
    deliver(
        client, pr_comment("maintainer", "/coldbench rounds=3", at=time.time()), "issue_comment"
    )
    [pull_id] = handle(db_session, settings, app_config)
    assert pull_id is not None
    answer_until_quiet(db_session, app_config, pull_id)
    # A push while the job runs: the job stays on its head; the new head gets a neutral check
    # run saying how to ask, once.
    github.add_pull(REPO, 7, base=BASE, head=NEW_HEAD)
    event = pr_event("synchronize", "maintainer", head=NEW_HEAD, at=time.time(), fork=None)
    deliver(client, event, "pull_request")
    assert handle(db_session, settings, app_config) == [pull_id]
    answer_until_quiet(db_session, app_config, pull_id)
    answer_until_quiet(db_session, app_config, pull_id)
    [idle] = github.check_runs_on(NEW_HEAD)
    assert (idle["status"], idle["conclusion"], idle["external_id"]) == (
        "completed",
        "neutral",
        "pr-7",
    )
    assert "comments `/coldbench`" in idle["output"]["summary"]
    # GitHub's Re-run on it, by someone who may not ask: nothing; by a maintainer: a job on
    # that head with the default request.
    for login in ("stranger", "maintainer"):
        rerun = payload("check_run.rerequested")
        rerun["repository"]["full_name"] = REPO
        rerun["check_run"].update(head_sha=NEW_HEAD, external_id="pr-7")
        rerun["sender"]["login"] = login
        deliver(client, rerun, "check_run")
    handle(db_session, settings, app_config)
    first, second = jobs(db_session)
    assert (first.head_sha, first.command) == (HEAD, "/coldbench ab rounds=3")
    assert (second.head_sha, second.asked_by) == (NEW_HEAD, "@maintainer")
    # A Re-run of the first job's check run asks for its command again (its head is gone:
    # refused, said on the pull request).
    rerun = payload("check_run.rerequested")
    rerun["repository"]["full_name"] = REPO
    rerun["check_run"].update(head_sha=HEAD, external_id=f"pr-7:{first.job_id}")
    rerun["sender"]["login"] = "maintainer"
    deliver(client, rerun, "check_run")
    handle(db_session, settings, app_config)
    assert len(jobs(db_session)) == 2
    notice = db_session.scalars(sa.select(PullRequest.notice)).one() or ""
    assert "the head moved from `bbbbbbbbbb` to `cccccccccc` after the re-run" in notice
