"""Bisection, history ranges and commits jobs through the real service: PostgreSQL, `coldbench
server` (API, embedded Celery worker and beat), `coldbench worker` as the host, a copy of the
installed mlx_lm with one planted slowdown.

The host resolves good..bad (a history's range, a commits job's base..head) in its own mirror;
the server builds each later step from the previous one with evidence/analysis/bisect.py's rule,
each step a job with its own run and evidence; the bisection's job ends with the step that names the
commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SLOW_PREFILL_SYNC_OLD
from tests.stack import Stack
from tests.worker.conftest import PATH_RECIPE_COMMAND, git
from tests.worker.test_agent import write_config

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# 0.25 s per prefill chunk (one chunk at 64 tokens): six times the slowest whole cell of the
# micro model (9-41 ms), so 6 rounds settle every comparison even on a loaded 2-core machine.
PLANTED = SLOW_PREFILL_SYNC_OLD + "            time.sleep(0.25)  # planted: work per chunk\n"


@pytest.fixture(scope="module")
def planted_repo(
    mlx_lm_repo: tuple[Path, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """main of mlx_lm_repo, then the planted slowdown, then a later commit."""
    source, (main, _slow) = mlx_lm_repo
    repo = tmp_path_factory.mktemp("planted") / "mlx-lm"
    git(source.parent, "clone", "-q", "--branch", main, str(source), str(repo))
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    generate = repo / "mlx_lm" / "generate.py"
    text = generate.read_text()
    assert text.count(SLOW_PREFILL_SYNC_OLD) == 1 and "\nimport time\n" in text
    generate.write_text(text.replace(SLOW_PREFILL_SYNC_OLD, PLANTED))
    git(repo, "commit", "-q", "-am", "prefill: extra work per chunk")
    shas["slow"] = git(repo, "rev-parse", "HEAD")
    (repo / "NOTES.md").write_text("notes\n")
    git(repo, "add", "NOTES.md")
    git(repo, "commit", "-q", "-m", "docs: add notes")
    shas["after"] = git(repo, "rev-parse", "HEAD")
    return repo, shas


@pytest.fixture(scope="module")
def host(
    planted_repo: tuple[Path, dict[str, str]],
    micro_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    shared_stack: Stack,
) -> Iterator[tuple[Stack, Path]]:
    """The shared service, a Celery worker on its broker (ingest, analysis, rendering, and the
    bisection's next steps) and one enrolled host that allows the planted repository as
    `planted`, for this module's tests."""
    repo, _shas = planted_repo
    root = tmp_path_factory.mktemp("bisect-host")
    config = write_config(
        root / "host" / "worker.toml",
        name="host-b",
        repositories={"planted": (str(repo), ["e"])},
        command=PATH_RECIPE_COMMAND,  # the bisection is the subject, not the install
    )
    with shared_stack.scope() as service:
        service.start_celery("bisect-celery")
        log = root / "agent.log"
        agent = service.start_agent(config, token=service.enrollment_token(), log=log)
        service.wait_hosts({"host-b"}, [(agent, log)])
        yield service, log


def _spec(**extra: Any) -> dict[str, Any]:
    return {
        "adapter": "mlx-lm",
        "repository": "planted",
        "contexts": [64],
        "decode_tokens": 0,
        "model": "preset:micro",
        **extra,
    }


def _wait(service: Any, job_id: str, log: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = service.job(job_id)
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, (job, log.read_text()[-3000:])
        time.sleep(1)


def test_a_history_range_is_resolved_by_the_host_and_recorded(
    host: tuple[Any, Path], planted_repo: tuple[Path, dict[str, str]]
) -> None:
    service, log = host
    _repo, shas = planted_repo
    # A ref that git would read as an option never leaves the API.
    injected = service.submit(
        _spec(mode="history", variants=[{"name": "c"}], history={"range": "--output=/x..HEAD"})
    )
    assert injected.status_code == 422 and "range" in injected.text
    two_hosts = service.submit(
        _spec(mode="history", variants=[{"name": "c"}], history={"range": "a..b"}, hosts=2)
    )
    assert two_hosts.status_code == 422 and "resolved to commits by the one host" in two_hosts.text

    created = service.submit(
        _spec(
            mode="history",
            variants=[{"name": "c", "flags": {"prefill_step_size": 32}}],
            history={"range": f"{shas['base'][:12]}..HEAD", "last": 1},
            rounds=2,
            rounds_per_process=2,
        )
    )
    assert created.status_code == 201, created.text
    job = _wait(service, created.json()["id"], log, timeout_s=400)
    assert job["state"] == "done", (job, log.read_text()[-3000:])
    resolved = job["resolved_spec"]
    assert [v["ref"] for v in resolved["variants"]] == [shas["base"], shas["after"]]
    assert all(v["flags"] == {"prefill_step_size": 32} for v in resolved["variants"])
    assert job["spec"]["variants"] == [
        {"name": "c", "ref": None, "recipe": None, "flags": {"prefill_step_size": 32}}
    ]
    with service.http() as client:
        summary = client.get(f"{service.url}/e/{job['evidence_id']}.json").json()
    assert summary["history"]["reference"]["commit"] == shas["base"]
    assert [c["commit"] for c in summary["history"]["commits"]] == [shas["after"]]


def test_a_bisection_through_the_service_finds_the_planted_commit_step_by_step(
    host: tuple[Any, Path], planted_repo: tuple[Path, dict[str, str]]
) -> None:
    service, log = host
    _repo, shas = planted_repo
    listed = service.submit(
        _spec(
            mode="bisect",
            variants=[{"name": "lo", "ref": shas["base"]}, {"name": "hi", "ref": shas["after"]}],
            bisect={"good": shas["base"], "bad": "HEAD", "direction": "slower"},
        )
    )
    assert listed.status_code == 422 and "one variant without a ref" in listed.text

    created = service.submit(
        _spec(
            mode="bisect",
            variants=[{"name": "stock"}],
            bisect={"good": shas["base"][:12], "bad": "HEAD", "direction": "slower"},
            # 6 process pairs, one round each: the fewest that give a 95% interval, so the
            # fewest a bisection decision may rest on.
            rounds=6,
            rounds_per_process=1,
        )
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert created.json()["runs"] == [] and len(created.json()["steps"]) == 1
    job = _wait(service, job_id, log, timeout_s=900)
    assert job["state"] == "done", (job, log.read_text()[-3000:])

    # base slow after: the midpoint slow is slower like after and is base's child, and this
    # step measured slow / base: found, without a second step measuring that pair again.
    # Halving over several steps through the service is tests/api/test_bisection.py's, with a
    # real host tests/worker/test_history_cli.py's.
    steps = job["steps"]
    assert [(s["lo"], s["mid"], s["hi"]) for s in steps] == [
        (shas["base"], shas["slow"], shas["after"])
    ]
    assert [s["decision"] for s in steps] == ["found"]
    assert all(s["state"] == "done" and s["evidence_url"] for s in steps)
    assert job["evidence_url"] == steps[-1]["evidence_url"]

    with service.http() as client:
        summary = client.get(f"{service.url}{job['evidence_url']}.json").json()
        report = client.get(f"{service.url}{job['evidence_url']}").text
    section = summary["bisect"]
    assert section["first_bad_commit"] == shas["slow"] and section["parent"] == shas["base"]
    assert section["ratio"]["ci_high"] < 1 and section["subject"] == "prefill: extra work per chunk"
    assert section["ratio"] == section["mid_result"] and section["steps"] == []
    assert shas["slow"] in report
    # Each step's job points back to its bisection.
    first = service.job(steps[0]["id"])
    assert first["parent_id"] == job_id and first["step"] == 1
    assert first["resolved_spec"]["bisect"]["line"] == [shas["base"], shas["slow"], shas["after"]]
    response = httpx.get(f"{service.url}/api/v1/jobs/{job_id}", timeout=10)
    assert response.status_code == 401  # jobs are read with a key


def test_a_commits_job_is_resolved_and_synthesized_by_the_host_and_rendered(
    host: tuple[Any, Path], planted_repo: tuple[Path, dict[str, str]]
) -> None:
    service, log = host
    _repo, shas = planted_repo
    injected = service.submit(
        _spec(mode="commits", variants=[{"name": "c"}], commits={"base": "--x", "head": "HEAD"})
    )
    assert injected.status_code == 422 and "commits.base" in injected.text
    two_hosts = service.submit(
        _spec(
            mode="commits",
            variants=[{"name": "c"}],
            commits={"base": shas["base"], "head": "HEAD"},
            hosts=2,
        )
    )
    assert two_hosts.status_code == 422 and "resolved to commits by the one host" in two_hosts.text

    created = service.submit(
        _spec(
            mode="commits",
            variants=[{"name": "c"}],
            commits={"base": shas["base"][:12], "head": "HEAD"},
            rounds=2,
            rounds_per_process=2,
        )
    )
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["commits"]["max_commits"] >= 2  # the service's variant limit
    job = _wait(service, created.json()["id"], log, timeout_s=600)
    assert job["state"] == "done", (job, log.read_text()[-3000:])
    resolved = job["resolved_spec"]
    assert resolved["commits"]["line"] == [shas["base"], shas["slow"], shas["after"]]
    assert [v["ref"] for v in resolved["variants"]] == [shas["base"]] + [shas["after"]] * 3
    with service.http() as client:
        summary = client.get(f"{service.url}/e/{job['evidence_id']}.json").json()
        report = client.get(f"{service.url}/e/{job['evidence_id']}").text
        markdown = client.get(f"{service.url}/e/{job['evidence_id']}.md").text
    commits = summary["commits"]
    assert [c["commit"] for c in commits["commits"]] == [shas["slow"], shas["after"]]
    assert all(c["not_separable"] is None and c["tree"]["tree"] for c in commits["commits"])
    assert {m["commit"] for m in commits["marginals"]} == {shas["slow"], shas["after"]}
    assert 'id="commits"' in report and commits["commits"][0]["tree"]["tree"] in report
    assert "### Commits of" in markdown
