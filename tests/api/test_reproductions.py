"""Reproductions uploaded to the service: `POST /api/v1/evidence/{id}/reproductions` keeps a
host's reproduction bundle of published evidence, and the page and PR Markdown gain its row with
the hosts' agreement; bad uploads (a wrong token, a digest that differs, a corrupt zip, another
job) are refused with what was wrong and store nothing."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from coldbench.api import dispatch
from coldbench.api.app import create_app
from coldbench.api.artifacts.store import SPILL_BYTES, LocalArtifactStore
from coldbench.api.github import answer as github_answer
from coldbench.api.github.comment import MARKER
from coldbench.api.github.config import load_github_config
from coldbench.api.github.models import PullRequest, PullRequestJob
from coldbench.api.jobs.models import Job
from coldbench.api.reproductions import service
from coldbench.api.reproductions.models import EvidenceReproduction
from coldbench.api.settings import Settings
from coldbench.evidence.bundles.bundle import build_bundle, zip_bytes
from coldbench.evidence.contract.canonical import canonical_json, sha256_hex
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.contract.schemas import JobSpec
from tests.api.conftest import SentTasks, bearer
from tests.api.factories import job_payload, make_host, make_job
from tests.api.fake_github import FakeGitHub, serve
from tests.api.test_github import BASE, HEAD, REPO, write_config
from tests.evidence.builders import provenance, simulate_run
from tests.web.builders import publish_bundle

pytestmark = pytest.mark.both_dialects

SPEC = job_payload(
    variants=[{"name": "base", "flags": {}}, {"name": "fast", "flags": {"clear_cache": False}}],
    contexts=[64, 128],
    rounds=8,
)


def _bundle(
    run_id: str, host: str, *, effect: float = 1.2, reproduces: str | None = None, **spec: Any
) -> dict[str, bytes]:
    measured = provenance(run_id=run_id, hostname=host)
    extra = {}
    if reproduces is not None:
        extra["reproduces.json"] = canonical_json({"evidence_id": reproduces, "source": "test"})
    files, _ = build_bundle(
        records=simulate_run(
            effects={"base": 1.0, "fast": effect}, contexts=(64, 128), rounds=8, run_id=run_id
        ),
        provenances=[measured],
        spec=JobSpec.model_validate({**SPEC, **spec}),
        extra_files=extra,
    )
    return files


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A bundle's zip inlines plotly.js (megabytes): the upload limit of a real server."""
    return settings.model_copy(update={"max_artifact_bytes": 64 << 20})


@pytest.fixture
def published(client: TestClient, db_session: Session, settings: Settings) -> str:
    return _publish(db_session, settings)


def _publish(db_session: Session, settings: Settings) -> str:
    """Host studio-1's evidence, published as render_evidence does."""
    make_host(db_session, "studio-1")
    job = make_job(db_session, settings, **SPEC)
    files = _bundle("r-1", "studio-1")
    measured = provenance(run_id="r-1", hostname="studio-1")
    measured.host.registered_name = "studio-1"
    return publish_bundle(
        db_session,
        settings,
        job,
        records=simulate_run(
            effects={"base": 1.0, "fast": 1.2}, contexts=(64, 128), rounds=8, run_id="r-1"
        ),
        provenances=[measured],
        spec=JobSpec.model_validate_json(files["job.json"]),
    )


def _upload(
    client: TestClient, evidence_id: str, body: bytes, token: str, sha256: str | None = None
) -> Any:
    return client.post(
        f"/api/v1/evidence/{evidence_id}/reproductions",
        content=body,
        headers={
            **bearer(token),
            "X-Content-SHA256": sha256 or sha256_hex(body),
            "Content-Type": "application/zip",
        },
    )


def test_a_reproduction_adds_its_host_to_the_page_and_the_markdown(
    client: TestClient, db_session: Session, published: str
) -> None:
    page = client.get(f"/e/{published}")
    markdown = client.get(f"/e/{published}.md")
    assert page.headers["cache-control"] == "public, no-cache"
    assert "Reproduced on other hosts" not in page.text
    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    answer = _upload(client, published, body, secret)
    assert answer.status_code == 201, answer.text
    accepted = answer.json()
    assert accepted["host"] == "lab-2" and accepted["created"] is True
    assert any(line.startswith("  hosts agree within") for line in accepted["lines"])
    assert _upload(client, published, body, secret).json()["created"] is False  # idempotent
    assert _upload(client, published, body, secret).status_code == 200
    # The cached page is stale now: its ETag no longer matches, the new page has the row.
    again = client.get(f"/e/{published}", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 200 and again.headers["etag"] != page.headers["etag"]
    assert '<section id="cb-hosts">' in again.text and "lab-2" in again.text
    assert "hosts agree within" in again.text
    assert again.text.count("### Reproduced on other hosts") == 1  # in the Markdown box
    same = client.get(f"/e/{published}", headers={"If-None-Match": again.headers["etag"]})
    assert same.status_code == 304
    md = client.get(f"/e/{published}.md", headers={"If-None-Match": markdown.headers["etag"]})
    assert md.status_code == 200 and "### Reproduced on other hosts" in md.text
    assert "| fast | " in md.text and "lab-2" in md.text
    (row,) = db_session.query(EvidenceReproduction).all()
    assert row.evidence_id == published and row.hosts[0]["label"] == "lab-2"
    # the bundle's own files are unchanged
    json_file = client.get(f"/e/{published}.json")
    assert "immutable" in json_file.headers["cache-control"] and b"lab-2" not in json_file.content


def test_bad_uploads_are_refused_with_the_reason_and_store_nothing(
    client: TestClient, db_session: Session, published: str
) -> None:
    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    wrong = _upload(client, published, body, "cbw_nothing_" + "a" * 30)
    assert wrong.status_code == 401
    differs = _upload(client, published, body, secret, sha256="0" * 64)
    assert differs.status_code == 422 and "sha256" in differs.json()["detail"]
    corrupt = bytearray(body)
    corrupt[len(corrupt) // 2] ^= 0xFF
    broken = _upload(client, published, bytes(corrupt), secret)
    assert broken.status_code == 422 and "nothing stored" in broken.json()["detail"]
    other = zip_bytes(_bundle("x-1", "lab-2", reproduces=published, seed=7))
    another_job = _upload(client, published, other, secret)
    assert another_job.status_code == 409, another_job.text
    detail = another_job.json()["detail"]
    assert "another job" in detail and "job.seed: 0 vs 7" in detail
    unnamed = _upload(client, published, zip_bytes(_bundle("x-1", "lab-2")), secret)
    assert unnamed.status_code == 422 and "reproduces.json" in unnamed.json()["detail"]
    elsewhere = zip_bytes(_bundle("x-1", "lab-2", reproduces="f" * 24))
    assert _upload(client, published, elsewhere, secret).status_code == 409
    missing = _upload(client, "e" * 24, body, secret)
    assert missing.status_code == 404
    assert db_session.query(EvidenceReproduction).count() == 0
    page = client.get(f"/e/{published}")
    assert page.status_code == 200 and "cb-hosts" not in page.text


def test_two_identical_uploads_at_once_answer_the_row_or_a_conflict(
    live_db: str, live_sessionmaker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both requests find no row before either inserts (a barrier after the check makes the
    race certain): the second insert's unique violation answers the winner's row where the
    same host sent it, 409 where another host did, never a 500."""
    settings = Settings(
        database_url=live_db,
        artifact_dir=tmp_path / "artifacts",
        state_dir=tmp_path / "state",
        max_artifact_bytes=64 << 20,
        rehearse_at_start=False,
    )
    with live_sessionmaker() as db_session:
        evidence_id = _publish(db_session, settings)
        _lab, lab = make_host(db_session, "lab-2")
        _other, other = make_host(db_session, "lab-3")
    checked = service.original_hosts
    state: dict[str, Any] = {}

    def both_checked(**kwargs: Any) -> Any:
        hosts = checked(**kwargs)
        if next(state["calls"]) < 2:  # each request's first call: in add_reproduction
            state["barrier"].wait()
        return hosts

    monkeypatch.setattr(service, "original_hosts", both_checked)
    app = create_app(settings)
    with (
        dispatch.use_sender(lambda _name, _args: None),
        TestClient(app, raise_server_exceptions=False) as client,
    ):

        def race(body: bytes, tokens: tuple[str, str]) -> list[Any]:
            state.update(calls=itertools.count(), barrier=threading.Barrier(2, timeout=30))
            with ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(lambda t: _upload(client, evidence_id, body, t), tokens))
            return sorted(answers, key=lambda a: a.status_code)

        same = zip_bytes(_bundle("x-1", "lab-2", reproduces=evidence_id))
        repeat, first = race(same, (lab, lab))
        assert (first.status_code, repeat.status_code) == (201, 200), repeat.text
        assert repeat.json()["reproduction_id"] == first.json()["reproduction_id"]
        assert repeat.json()["created"] is False and repeat.json()["lines"]
        copied = zip_bytes(_bundle("x-2", "lab-2", reproduces=evidence_id))
        won, refused = race(copied, (lab, other))
        assert (won.status_code, refused.status_code) == (201, 409), refused.text
        assert "already uploaded by another host" in refused.json()["detail"]
    app.state.engine.dispose()
    with live_sessionmaker() as db_session:
        rows = db_session.scalars(sa.select(EvidenceReproduction)).all()
        assert sorted(row.id for row in rows) == sorted(
            [first.json()["reproduction_id"], won.json()["reproduction_id"]]
        )


def test_the_body_streams_to_a_spool_file_removed_after_the_request(
    client: TestClient,
    db_session: Session,
    published: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The zip reaches the checks as the store's temporary file, hashed as it streamed (never a
    list of chunks in memory); kept or refused, no spool file is left."""
    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    assert len(body) > SPILL_BYTES  # written to the file as it streams, not at the end
    spool = settings.artifact_dir / "tmp"
    seen: list[tuple[Path, bytes]] = []
    add = service.add_reproduction

    def spy(**kwargs: Any) -> Any:
        path = kwargs["bundle_path"]
        seen.append((path.parent, path.read_bytes()))
        return add(**kwargs)

    monkeypatch.setattr(service, "add_reproduction", spy)
    answer = _upload(client, published, body, secret)
    assert answer.status_code == 201, answer.text
    assert seen == [(spool, body)]
    assert list(spool.iterdir()) == []
    differs = _upload(client, published, body + b"x", secret, sha256=sha256_hex(body))
    assert differs.status_code == 422 and "nothing stored" in differs.json()["detail"]
    corrupt = bytearray(body)
    corrupt[len(corrupt) // 2] ^= 0xFF
    broken = _upload(client, published, bytes(corrupt), secret)
    assert broken.status_code == 422, broken.text
    assert list(spool.iterdir()) == []
    # A refused zip is not kept in the store: only the bundle accepted is.
    store = LocalArtifactStore(settings.artifact_dir)
    assert store.exists(sha256_hex(body))
    assert not store.exists(sha256_hex(bytes(corrupt)))


@pytest.fixture(scope="module")
def fake_github() -> Iterator[tuple[FakeGitHub, str]]:
    github = FakeGitHub()
    with serve(github) as url:
        yield github, url


def test_a_reproduction_edits_the_pull_requests_comment_that_announced_the_evidence(
    client: TestClient,
    db_session: Session,
    published: str,
    settings: Settings,
    sent_tasks: SentTasks,
    fake_github: tuple[FakeGitHub, str],
    tmp_path: Path,
) -> None:
    github, url = fake_github
    github.reset()
    github.add_pull(REPO, 7, base=BASE, head=HEAD)
    config = load_github_config(write_config(tmp_path / "github.toml", url))
    store = LocalArtifactStore(settings.artifact_dir)
    job = db_session.scalars(sa.select(Job).where(Job.evidence_id == published)).one()
    job.state = JobState.DONE
    pull = PullRequest(repository=REPO, number=7, head_sha=HEAD)
    db_session.add(pull)
    db_session.flush()
    db_session.add(
        PullRequestJob(
            job_id=job.id,
            pull_request_id=pull.id,
            base_sha=BASE,
            head_sha=HEAD,
            asked_by="@maintainer",
            command="/coldbench ab",
        )
    )
    db_session.commit()
    answer = github_answer.answer_pull_request
    answer(db_session=db_session, config=config, store=store, pull_request_id=pull.id)
    [(comment_id, comment)] = github.comments.items()
    assert comment["body"].startswith(MARKER) and published in comment["body"]
    assert "Reproduced on other hosts" not in comment["body"]
    # A pull request whose comment never showed this evidence is not sent again.
    db_session.add(PullRequest(repository=REPO, number=8, head_sha=HEAD))
    db_session.commit()

    _host, secret = make_host(db_session, "lab-2")
    body = zip_bytes(_bundle("x-1", "lab-2", reproduces=published))
    assert _upload(client, published, body, secret).status_code == 201
    # Sent after the commit, and due for the beat should that task be lost.
    assert sent_tasks.named("github_answer_pull_request") == [(pull.id,)]
    db_session.refresh(pull)
    assert pull.answer_due is True
    assert github_answer.unanswered_pull_request_ids(db_session=db_session) == [pull.id]
    answer(db_session=db_session, config=config, store=store, pull_request_id=pull.id)
    assert list(github.comments) == [comment_id] and github.comments[comment_id]["edits"] == 1
    edited = github.comments[comment_id]["body"]
    assert "### Reproduced on other hosts" in edited and "lab-2" in edited
    assert edited.index(published) < edited.index("### Reproduced on other hosts")
    # Sent again (the same bundle): nothing new to say, no task and no edit.
    assert _upload(client, published, body, secret).status_code == 200
    assert len(sent_tasks.named("github_answer_pull_request")) == 1
    assert github_answer.unanswered_pull_request_ids(db_session=db_session) == []
