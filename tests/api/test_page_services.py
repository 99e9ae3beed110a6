"""Service functions added for the pages: a host's current run, a session's API key."""

from __future__ import annotations

from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.hosts import service as host_service
from coldbench.api.runs import claim as run_claim
from coldbench.api.settings import Settings
from tests.api import agent_calls
from tests.api.factories import fingerprint, make_api_key, make_host, make_job


def test_current_runs_maps_each_leasing_host_to_its_run(
    db_session: Session, settings: Settings
) -> None:
    busy, _ = make_host(db_session, "busy")
    make_host(db_session, "idle")
    job = make_job(db_session, settings)
    assert host_service.current_runs(db_session=db_session) == {}
    lease = agent_calls.claim_lease(
        db_session=db_session,
        settings=settings,
        host=busy,
        report=run_claim.HostReport(fingerprint=fingerprint(hostname="busy")),
    )
    current = host_service.current_runs(db_session=db_session)
    assert list(current) == [busy.id]
    assert current[busy.id].id == lease.run_id and current[busy.id].job_id == job.id


def test_active_api_key_refuses_unknown_and_revoked(db_session: Session) -> None:
    key = make_api_key(db_session)
    key_id = key.split("_")[1]
    assert auth_service.active_api_key(db_session=db_session, key_id=key_id).id == key_id
    assert auth_service.active_api_key(db_session=db_session, key_id="0" * 16) is None
    auth_service.active_api_key(db_session=db_session, key_id=key_id).revoked_at = utcnow()
    db_session.commit()
    assert auth_service.active_api_key(db_session=db_session, key_id=key_id) is None


def test_job_summary_is_the_typed_summary_or_none_for_one_that_no_longer_matches(
    db_session: Session, settings: Settings, caplog
) -> None:
    from coldbench.api.jobs import service as job_service
    from coldbench.evidence.analysis.summary import summarize
    from tests.evidence.builders import simulate_run

    make_host(db_session, "studio")
    job = make_job(db_session, settings)
    assert job_service.job_summary(db_session=db_session, job_id=job.id) is None
    records = simulate_run(effects={"base": 1.0, "fast": 1.05}, rounds=6)
    summary = summarize(records, baseline="base", n_resamples=50)
    job.summary = summary.to_json_value()
    db_session.commit()
    stored = job_service.job_summary(db_session=db_session, job_id=job.id)
    assert stored == summary and stored.comparisons[0].variant == "fast"
    # A summary stored by an older coldbench, in a shape the contract no longer accepts: the
    # job page shows no answer rather than an error (the bundle still holds the summary).
    job.summary = {"comparisons": []}
    db_session.commit()
    assert job_service.job_summary(db_session=db_session, job_id=job.id) is None
    assert "stored summary does not match the summary contract" in caplog.text
