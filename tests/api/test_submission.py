"""A submission: judged against the hosts' columns, written as Core inserts, answered from
what it wrote (api/jobs/service.py: submit_group_program, submitted_out)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from coldbench.api.errors import Invalid
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.jobs.schemas import JobOut
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings
from coldbench.api.transactions import run_one_in_session
from tests.api.factories import job_payload, make_host

# Submission's Core inserts and the key look-up differ by dialect.
pytestmark = pytest.mark.both_dialects


def _submit(db_session: Session, settings: Settings, payload: dict[str, Any]) -> JobOut:
    """What `POST /jobs` does for a job that is not a bisection."""
    dialect = db_session.get_bind().dialect.name
    submission = job_service.Submission(settings, payload, None, dialect)
    submitted = run_one_in_session(db_session, job_service.submit_group_program, submission)
    assert isinstance(submitted, job_service.Submitted)
    return job_service.submitted_out(submitted.job, submitted.runs, [], notice=submitted.notice)


def test_submission_answers_what_it_stored_and_reads_nothing_after_its_commit(
    db_session: Session, settings: Settings
) -> None:
    make_host(db_session, "studio-1")
    make_host(db_session, "studio-2", labels=["gpu"])
    make_host(db_session, "box", models=["other-model"])
    engine = db_session.get_bind().engine
    statements: list[str] = []
    committed: list[int] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    def on_commit(_session: Session) -> None:
        committed.append(len(statements))

    sa.event.listen(engine, "before_cursor_execute", note)
    sa.event.listen(db_session, "after_commit", on_commit)
    try:
        answer = _submit(db_session, settings, job_payload(hosts=2))
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)
        sa.event.remove(db_session, "after_commit", on_commit)
    assert committed and committed[-1] == len(statements)  # nothing read after the commit
    job = db_session.get(Job, answer.id)
    assert job is not None and sa.inspect(job).persistent
    runs = db_session.scalars(sa.select(Run).where(Run.job_id == answer.id)).all()
    assert sorted(run.slot for run in runs) == [0, 1]
    assert all(sa.inspect(run).persistent for run in runs)
    # The answer is the job as read back afresh from the database.
    db_session.expire_all()
    fresh = job_service.job_detail(db_session=db_session, job_id=answer.id)
    assert answer.model_dump() == fresh.model_dump()
    assert fresh.state == "queued" and [run.attempt for run in fresh.runs] == [0, 0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hosts": 3}, "only 2 can run it: studio-1, studio-2"),
        ({"host_labels": ["tpu"]}, "no registered host can run this job: box lacks labels tpu"),
        ({"model": "preset:huge"}, "studio-2 has no model 'preset:huge'"),
    ],
)
def test_refusals_still_judge_every_host(
    db_session: Session, settings: Settings, overrides: dict[str, Any], message: str
) -> None:
    make_host(db_session, "studio-1")
    make_host(db_session, "studio-2", labels=["gpu"])
    make_host(db_session, "box", models=["other-model"])
    with pytest.raises(Invalid) as refused:
        _submit(db_session, settings, job_payload(**overrides))
    assert message in refused.value.message
    assert db_session.scalar(sa.select(sa.func.count()).select_from(Job)) == 0


def test_a_range_warns_about_its_rounds_once_its_host_resolved_its_size(
    db_session: Session, settings: Settings
) -> None:
    """The rounds a verdict needs do not grow with the comparisons (a t interval widens, never
    becomes unreachable), so a range warns at submission when its rounds are too few, and says
    again what its host resolved it to."""
    from coldbench.evidence.analysis.history import history_spec

    make_host(db_session, "studio-1", repositories={"mlx-lm": {"recipes": ["editable"]}})
    payload = {
        "mode": "history",
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "variants": [{"name": "base"}],
        "history": {"range": "v1..main"},
        "contexts": [64],
        "rounds": 6,
    }
    answer = _submit(db_session, settings, payload)
    assert answer.rounds_warning is not None and answer.rounds_warning.startswith(
        "6 rounds cannot reach a verdict"
    )
    job = db_session.get_one(Job, answer.id)
    (run,) = db_session.scalars(sa.select(Run).where(Run.job_id == job.id)).all()
    commits = [f"{n:040x}" for n in range(1, 41)]
    run.resolved_spec = history_spec(job.spec, f"{0:040x}", commits)
    db_session.commit()
    detail = job_service.job_detail(db_session=db_session, job_id=job.id)
    assert (
        detail.rounds_warning
        == answer.rounds_warning
        == (
            "6 rounds cannot reach a verdict: the robust interval needs at least 10 rounds (10 "
            "independent process pairs, so that 2 stalled at each end cannot decide it), more when "
            "the spread is wide"
        )
    )
    assert detail.resolved_spec is not None and len(detail.resolved_spec["variants"]) == 41


def test_a_job_only_offline_hosts_can_run_says_so(db_session: Session, settings: Settings) -> None:
    """Accepted (the host may come back), and its answer, job page and JSON say it waits."""
    from datetime import timedelta

    from coldbench.api.database import utcnow
    from coldbench.api.hosts.models import Host

    host, _ = make_host(db_session, "studio-1", labels=["gpu"])
    make_host(db_session, "box")
    host.last_heartbeat_at = utcnow() - timedelta(hours=3)
    db_session.commit()
    answer = _submit(db_session, settings, job_payload(host_labels=["gpu"]))
    assert answer.notice == (
        "only offline hosts can run this job: studio-1 (last heard 3 h ago); it waits until one "
        "of them is back (coldbench worker)"
    )
    detail = job_service.job_detail(db_session=db_session, job_id=answer.id, settings=settings)
    assert detail.notice == answer.notice
    # A job the online host can run waits for nobody.
    assert _submit(db_session, settings, job_payload()).notice is None
    db_session.get_one(Host, host.id).last_heartbeat_at = utcnow()
    db_session.commit()
    fresh = job_service.job_detail(db_session=db_session, job_id=answer.id, settings=settings)
    assert fresh.notice is None


def test_a_commits_job_names_base_and_head_and_leaves_its_commits_to_its_host(
    settings: Settings,
) -> None:
    from coldbench.evidence.analysis.commits import commits_spec
    from coldbench.evidence.contract.schemas import JobSpec

    payload = job_payload(
        mode="commits",
        adapter="mlx-lm",
        repository="mlx-lm",
        variants=[{"name": "stock"}],
        contexts=[64],
        commits={"base": "main", "head": "my-pr"},
    )
    spec = job_service.checked_spec(settings, payload)
    assert spec.commits is not None
    assert spec.commits.max_commits == min(32, settings.max_variants - 2)
    line = [c * 40 for c in "abc"]
    resolved = commits_spec(JobSpec.model_validate(payload), line)
    with pytest.raises(Invalid, match="its host resolves base..head") as refused:
        job_service.checked_spec(settings, resolved.model_dump(mode="json", by_alias=True))
    assert refused.value.field == "variants"
    narrow = settings.model_copy(update={"max_variants": 3})
    with pytest.raises(Invalid, match="a commits job needs at least 4 variants"):
        job_service.checked_spec(
            narrow, {**payload, "commits": {**payload["commits"], "alone": True}}
        )


def test_a_spec_without_rounds_gets_the_default_of_every_other_door(settings: Settings) -> None:
    """`POST /jobs` with no rounds (or null) is resolved once, by the service (`resolve_job`):
    measuring until decided (the default of every door) within four first looks, and the
    service's default time budget; rounds given, or until=rounds, are kept."""
    from coldbench.evidence.contract.schemas import JobSpec
    from coldbench.evidence.spec.job_options import build_job_spec, default_rounds, resolve_job

    payload = job_payload()
    del payload["rounds"]
    spec = job_service.checked_spec(settings, payload)
    built = build_job_spec(
        {"variants": ["base", "cand:clear_cache=false"], "contexts": "64,128", "decode_tokens": 2}
    )
    assert type(spec) is JobSpec and built.rounds is None
    assert spec.until == built.until == "decided"
    assert spec.rounds == resolve_job(built).rounds == 40
    assert spec.budget_minutes == settings.default_budget_minutes == 60
    assert job_service.checked_spec(settings, {**payload, "rounds": None}).rounds == 40
    given = job_service.checked_spec(settings, {**payload, "rounds": 4})
    assert (given.rounds, given.until) == (4, "decided")
    fixed = job_service.checked_spec(settings, {**payload, "until": "rounds"})
    assert (fixed.rounds, fixed.until, fixed.budget_minutes) == (10, "rounds", None)
    own = job_service.checked_spec(settings, {**payload, "budget_minutes": 5})
    assert own.budget_minutes == 5
    untimed = settings.model_copy(update={"default_budget_minutes": 0})
    assert job_service.checked_spec(untimed, payload).budget_minutes is None
    history = {
        "mode": "history",
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "variants": [{"name": "base"}],
        "history": {"range": "v1..main"},
        "contexts": [64],
    }
    bounded = job_service.checked_spec(settings.model_copy(update={"max_variants": 3}), history)
    assert bounded.history is not None and bounded.history.max_commits == 2
    unbounded = job_service.checked_spec(settings, history)
    # the rounds a verdict needs do not grow with the commits a host may resolve
    assert bounded.rounds == default_rounds(bounded) == unbounded.rounds == 40
    narrow = settings.model_copy(update={"max_rounds": 39})
    with pytest.raises(Invalid) as refused:
        job_service.checked_spec(narrow, payload)
    assert refused.value.field == "rounds"
    assert refused.value.message == (
        "rounds: this job's default is 40 rounds, more than this service's limit of 39: give "
        "rounds (at most 39), or fewer rounds per process"
    )
    assert job_service.checked_spec(narrow, {**payload, "rounds": 39}).rounds == 39
    with pytest.raises(Invalid, match="rounds=40; at most 39 allowed"):
        job_service.checked_spec(narrow, {**payload, "rounds": 40})


def test_a_range_from_any_door_gets_the_default_the_service_sizes(settings: Settings) -> None:
    """The form, submit and a pull request send rounds left to the default as left out
    (service_payload), so the service sizes them as it does for the JSON API."""
    from coldbench.evidence.spec.job_options import build_job_spec, default_rounds, service_payload

    given = {
        "mode": "history",
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "range": "v1..main",
        "contexts": "64",
    }
    built = build_job_spec(given)
    via_a_door = job_service.checked_spec(settings, service_payload(built))
    raw = {
        "mode": "history",
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "variants": [{"name": "base"}],
        "history": {"range": "v1..main"},
        "contexts": [64],
    }
    via_json = job_service.checked_spec(settings, raw)
    assert via_a_door.rounds == via_json.rounds == default_rounds(via_json) == 40
    assert built.rounds is None
    asked = build_job_spec({**given, "rounds": "20"})
    assert job_service.checked_spec(settings, service_payload(asked)).rounds == 20
