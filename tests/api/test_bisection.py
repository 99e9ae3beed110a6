"""A bisection's job and its steps in the service (api/jobs/bisect.py), step ends simulated on
the database: the next step's commits follow evidence/analysis/bisect.py's rule, a failed step fails
the bisection, cancelling the bisection cancels its running step. The real thing, with processes
and a planted slowdown, is tests/worker/test_bisect_service.py."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from coldbench.api.errors import Invalid
from coldbench.api.jobs import bisect
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.evidence.analysis.bisect import step_spec
from coldbench.evidence.contract.protocol import JobState
from coldbench.evidence.contract.schemas import JobSpec
from tests.api.factories import job_payload, make_host

LINE = [c * 40 for c in "abcde"]  # a good ... e bad


@pytest.fixture(autouse=True)
def _host(db_session: Session) -> None:
    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})


def _bisection(db_session: Session, settings: Settings, **extra: Any) -> Job:
    payload = job_payload(
        mode="bisect",
        adapter="mlx-lm",
        repository="mlx-lm",
        variants=[{"name": "stock", "flags": {"prefill_step_size": 64}}],
        contexts=[64],
        rounds=6,
        bisect={"good": "v1", "bad": "main", "direction": "slower"},
        **extra,
    )
    return job_service.create_job(db_session=db_session, settings=settings, payload=payload)


def _end_step(
    db_session: Session, step: Job, decision: str, evidence: str, line: list[str] | None = None
) -> None:
    """What ingest, analysis and rendering leave behind when a step ends with `decision`."""
    if line is not None:  # step 1: its host resolved good..bad
        (run,) = job_service.job_runs(db_session=db_session, job_id=step.id)
        run.resolved_spec = step_spec(step.spec, line, [])
    step.state = JobState.DONE
    step.evidence_id = evidence * 24
    step.summary = {"bisect": {"decision": decision, "why": f"because {decision}"}}
    db_session.commit()


def test_each_step_is_a_job_whose_commits_follow_the_halving_rule(
    db_session: Session, settings: Settings
) -> None:
    job = _bisection(db_session, settings)
    assert job_service.job_runs(db_session=db_session, job_id=job.id) == []
    (first,) = bisect.steps_of(db_session=db_session, job_id=job.id)
    assert (first.parent_id, first.step, first.state) == (job.id, 1, JobState.QUEUED)
    assert first.spec == job.spec  # its host resolves good..bad
    assert len(job_service.job_runs(db_session=db_session, job_id=first.id)) == 1
    detail = job_service.job_detail(db_session=db_session, job_id=job.id)
    assert [(s.step, s.lo, s.state) for s in detail.steps] == [(1, None, "queued")]

    _end_step(db_session, first, "upper", "1", line=LINE)
    assert bisect.advance(db_session=db_session, job_id=first.id) == "step 2"
    assert bisect.advance(db_session=db_session, job_id=first.id) is None  # idempotent
    second = bisect.steps_of(db_session=db_session, job_id=job.id)[-1]
    spec = JobSpec.model_validate(second.spec)
    assert [v.ref for v in spec.variants] == [LINE[2], LINE[3], LINE[4]]
    assert all(v.flags == {"prefill_step_size": 64} for v in spec.variants)
    assert spec.bisect is not None and spec.bisect.steps[0].location == "/e/" + "1" * 24
    assert db_session.get(Job, job.id).state == JobState.RUNNING

    _end_step(db_session, second, "lower", "2")
    assert bisect.advance(db_session=db_session, job_id=second.id) == "step 3"
    third = bisect.steps_of(db_session=db_session, job_id=job.id)[-1]
    assert [v.ref for v in JobSpec.model_validate(third.spec).variants] == [LINE[2], LINE[3]]
    _end_step(db_session, third, "found", "3")
    assert bisect.advance(db_session=db_session, job_id=third.id) == "done"

    done = job_service.job_detail(db_session=db_session, job_id=job.id)
    assert done.state == JobState.DONE and done.evidence_id == "3" * 24
    assert [(s.lo, s.mid, s.hi) for s in done.steps] == [
        (LINE[0], LINE[2], LINE[4]),
        (LINE[2], LINE[3], LINE[4]),
        (LINE[2], None, LINE[3]),
    ]
    assert [s.decision for s in done.steps] == ["upper", "lower", "found"]
    assert [s.evidence_url for s in done.steps] == ["/e/" + c * 24 for c in "123"]


def test_a_failed_step_fails_the_bisection_and_cancelling_stops_the_step(
    db_session: Session, settings: Settings
) -> None:
    job = _bisection(db_session, settings)
    (first,) = bisect.steps_of(db_session=db_session, job_id=job.id)
    first.state = JobState.FAILED
    first.reason = "refused by host studio-1: ref 'main' not found"
    db_session.commit()
    assert bisect.unfinished_step_ids(db_session=db_session) == [first.id]
    assert bisect.advance(db_session=db_session, job_id=first.id) == "failed"
    failed = db_session.get(Job, job.id)
    assert failed.state == JobState.FAILED and "step 1 failed: refused by host" in failed.reason

    other = _bisection(db_session, settings)
    job_service.cancel_job(db_session=db_session, job_id=other.id, submitted_by=None)
    (step,) = bisect.steps_of(db_session=db_session, job_id=other.id)
    assert step.state == JobState.CANCELLED
    (run,) = job_service.job_runs(db_session=db_session, job_id=step.id)
    assert run.state == "cancelled"


def test_the_service_takes_good_and_bad_and_one_host(
    db_session: Session, settings: Settings
) -> None:
    with pytest.raises(Invalid, match="resolved to commits by the one host"):
        _bisection(db_session, settings, hosts=2)
    with pytest.raises(Invalid, match="one variant without a ref"):
        job_service.create_job(
            db_session=db_session,
            settings=settings,
            payload=job_payload(
                mode="bisect",
                adapter="mlx-lm",
                repository="mlx-lm",
                variants=[
                    {"name": f"{r}-{c}", "ref": c * 40} for r, c in (("lo", "a"), ("hi", "b"))
                ],
                contexts=[64],
                bisect={"good": "v1", "bad": "main", "direction": "slower", "line": LINE[:2]},
            ),
        )
