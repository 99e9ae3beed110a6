"""Lease claims with real concurrent connections on PostgreSQL, and the long-poll."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from api.hosts.models import Host
from api.runs import service as run_service
from api.runs.models import Run, RunAttempt
from api.settings import Settings
from tests.api.factories import fingerprint, make_host, make_job

pytestmark = pytest.mark.postgres


def _settings(url: str, **overrides: Any) -> Settings:
    return Settings(database_url=url, lease_poll_s=0.05, **overrides)


def test_twenty_concurrent_claimers_each_run_claimed_once(
    live_db: str, live_sessionmaker: Any
) -> None:
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        host_ids = [make_host(db_session, f"host-{i:02d}")[0].id for i in range(20)]
        for _ in range(15):
            make_job(db_session, settings)
    barrier = threading.Barrier(20)
    leases: dict[str, Any] = {}
    errors: list[BaseException] = []

    def claim(host_id: str) -> None:
        try:
            with live_sessionmaker() as db_session:
                host = db_session.get(Host, host_id)
                barrier.wait()
                leases[host_id] = run_service.claim_lease(
                    db_session=db_session,
                    settings=settings,
                    host=host,
                    fingerprint=fingerprint(),
                    wait_s=1,
                )
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=claim, args=(h,)) for h in host_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    claimed = [lease.run_id for lease in leases.values() if lease is not None]
    assert len(claimed) == 15 and len(set(claimed)) == 15
    with live_sessionmaker() as db_session:
        runs = db_session.scalars(sa.select(Run)).all()
        assert {run.state for run in runs} == {"leased"}
        assert {run.attempt for run in runs} == {1}
        assert len({run.host_id for run in runs}) == 15
        assert db_session.scalar(sa.select(sa.func.count()).select_from(RunAttempt)) == 15


def test_long_poll_returns_a_run_queued_while_waiting(live_db: str, live_sessionmaker: Any) -> None:
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        host, _ = make_host(db_session, "waiter")
        make_host(db_session, "other")
    result: dict[str, Any] = {}

    def wait_for_work() -> None:
        with live_sessionmaker() as db_session:
            started = time.monotonic()
            result["lease"] = run_service.claim_lease(
                db_session=db_session,
                settings=settings,
                host=db_session.get(Host, host.id),
                fingerprint=fingerprint(),
                wait_s=10,
            )
            result["waited_s"] = time.monotonic() - started

    thread = threading.Thread(target=wait_for_work)
    thread.start()
    time.sleep(0.5)
    with live_sessionmaker() as db_session:
        job = make_job(db_session, settings)
    thread.join(15)
    assert result["lease"] is not None and result["lease"].job_id == job.id
    assert 0.4 < result["waited_s"] < 10


def test_empty_long_poll_gives_up_after_wait_s(live_db: str, live_sessionmaker: Any) -> None:
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        host, _ = make_host(db_session, "idle")
        started = time.monotonic()
        lease = run_service.claim_lease(
            db_session=db_session,
            settings=settings,
            host=host,
            fingerprint=fingerprint(),
            wait_s=1,
        )
    assert lease is None and 0.9 < time.monotonic() - started < 5
