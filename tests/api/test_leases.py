"""Lease claims with real concurrent connections on PostgreSQL, and the long-poll on the event
loop woken by LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from coldbench.api.auth.models import AuditEvent
from coldbench.api.database import utcnow
from coldbench.api.hosts.matching import LeasingHost
from coldbench.api.hosts.models import Host
from coldbench.api.runs import claim as run_claim
from coldbench.api.runs import completion, expiry
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.wakeup import WorkSignal, listen_for_work
from coldbench.api.settings import Settings
from coldbench.api.transactions import AsyncDatabase, Program, SessionDatabase, make_async_engine
from tests.api import agent_calls
from tests.api.factories import fingerprint, make_host, make_job

pytestmark = pytest.mark.postgres


def _settings(url: str, **overrides: Any) -> Settings:
    return Settings(database_url=url, **overrides)


def _report() -> run_claim.HostReport:
    return run_claim.HostReport(fingerprint=fingerprint())


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
                db_session.commit()
                barrier.wait()
                # One pass each, and a second for those that found their candidate taken.
                for _ in range(2):
                    leases[host_id] = agent_calls.claim_lease(
                        db_session=db_session, settings=settings, host=host, report=_report()
                    )
                    if leases[host_id] is not None:
                        break
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=claim, args=(h,)) for h in host_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    claimed = [lease.run_id for lease in leases.values() if lease is not None]
    assert len(claimed) == len(set(claimed))  # never one run to two hosts
    with live_sessionmaker() as db_session:
        runs = db_session.scalars(sa.select(Run)).all()
        leased = [run for run in runs if run.state == "leased"]
        assert sorted(run.id for run in leased) == sorted(claimed)
        assert {run.attempt for run in leased} == {1}
        assert len({run.host_id for run in leased}) == len(leased)
        assert db_session.scalar(sa.select(sa.func.count()).select_from(RunAttempt)) == len(leased)
    # SKIP LOCKED lets claimers pass each other, and a claimer whose every candidate was taken
    # meanwhile looks again at once: 20 hosts take all 15 runs.
    assert len(claimed) == 15


def test_a_claim_that_loses_its_race_looks_again_at_once(
    live_db: str, live_sessionmaker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        racer_id = make_host(db_session, "racer")[0].id
        other, _ = make_host(db_session, "other")
        first = make_job(db_session, settings)
        second = make_job(db_session, settings)
        taken = agent_calls.claim_lease(
            db_session=db_session, settings=settings, host=other, report=_report()
        )
        assert taken is not None and taken.job_id == first.id
    # The racer's first look saw only the run `other` took (read before that commit).
    real = run_claim._offer_runs
    looks: list[list[str]] = []

    def offer(
        is_pg: bool,
        hosts: list[LeasingHost],
        excluded: set[str],
        first_page: list[Any] | None = None,
    ) -> Program[run_claim._Offers]:
        offers = yield from real(is_pg, hosts, excluded, first_page)
        if not looks:
            offers.runs = {host.id: [taken.run_id] for host in hosts}
            offers.oldest_first = [taken.run_id]
            offers.jobs = {taken.run_id: taken.job_id}
        looks.append(offers.oldest_first)
        return offers

    monkeypatch.setattr(run_claim, "_offer_runs", offer)
    with live_sessionmaker() as db_session:
        racer = db_session.get(Host, racer_id)
        lease = agent_calls.claim_lease(
            db_session=db_session, settings=settings, host=racer, report=_report()
        )
    assert lease is not None and lease.job_id == second.id and len(looks) == 2


def _wait_in_loop(
    live_db: str, live_sessionmaker: Any, host_id: str, settings: Settings, *, wait_s: float
) -> dict[str, Any]:
    """Run one long-poll on a fresh event loop with the LISTEN task of an API process."""
    listening = threading.Event()
    result: dict[str, Any] = {}

    async def main() -> None:
        signal = WorkSignal()
        listener = asyncio.create_task(listen_for_work(live_db, signal))
        while signal.generation == 0:  # the listener notifies once it is LISTENing
            await asyncio.sleep(0.01)
        listening.set()
        with live_sessionmaker() as db_session:
            host = db_session.get(Host, host_id)
            started = time.monotonic()
            result["lease"] = await run_claim.wait_for_lease(
                db=SessionDatabase(db_session),
                request=run_claim.ClaimRequest(
                    host_id=host.id, report=_report(), settings=settings, dialect="postgresql"
                ),
                signal=signal,
                wait_s=wait_s,
            )
            result["waited_s"] = time.monotonic() - started
        listener.cancel()

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    assert listening.wait(15), "the listener never connected"
    result["thread"] = thread
    return result


def test_long_poll_is_woken_by_a_submission_not_by_polling(
    live_db: str, live_sessionmaker: Any
) -> None:
    # A poll interval longer than the test: only the notification can end the wait early.
    settings = _settings(live_db, lease_poll_s=20)
    with live_sessionmaker() as db_session:
        host, _ = make_host(db_session, "waiter")
    result = _wait_in_loop(live_db, live_sessionmaker, host.id, settings, wait_s=15)
    time.sleep(0.5)
    with live_sessionmaker() as db_session:
        job = make_job(db_session, settings)
    result["thread"].join(20)
    assert result["lease"] is not None and result["lease"].job_id == job.id
    assert 0.4 < result["waited_s"] < 3


def test_empty_long_poll_gives_up_after_wait_s(live_db: str, live_sessionmaker: Any) -> None:
    settings = _settings(live_db, lease_poll_s=0.3)
    with live_sessionmaker() as db_session:
        host, _ = make_host(db_session, "idle")
    result = _wait_in_loop(live_db, live_sessionmaker, host.id, settings, wait_s=1)
    result["thread"].join(10)
    assert result["lease"] is None and 0.9 < result["waited_s"] < 3


def test_claims_do_not_expire_leases_the_sweep_does_and_wakes_waiters(
    live_db: str, live_sessionmaker: Any
) -> None:
    settings = _settings(live_db, lease_poll_s=20)
    with live_sessionmaker() as db_session:
        lost_host, _ = make_host(db_session, "lost")
        waiter, _ = make_host(db_session, "waiter")
        make_job(db_session, settings)
        first = agent_calls.claim_lease(
            db_session=db_session, settings=settings, host=lost_host, report=_report()
        )
        assert first is not None
        run = db_session.get(Run, first.run_id)
        run.lease_expires_at = utcnow() - timedelta(seconds=1)
        db_session.commit()
        # A claim is only a claim: the expired lease is left to the sweep.
        host = db_session.get(Host, waiter.id)
        assert agent_calls.claim_lease(db_session=db_session, settings=settings, host=host) is None
        assert db_session.get(Run, first.run_id, populate_existing=True).state == "leased"
    result = _wait_in_loop(live_db, live_sessionmaker, waiter.id, settings, wait_s=15)
    time.sleep(0.5)
    with live_sessionmaker() as db_session:
        assert expiry.expire_leases(db_session=db_session, settings=settings) == []
    result["thread"].join(20)
    lease = result["lease"]
    assert lease is not None and (lease.run_id, lease.attempt) == (first.run_id, 2)
    assert result["waited_s"] < 3


def test_hosts_claiming_in_rounds_take_every_run_once_with_one_attempt_and_audit_each(
    live_db: str, live_sessionmaker: Any
) -> None:
    """The claim's Core statements under real contention: 12 hosts claim at once, round after
    round (each finishes its run between rounds), until 30 runs of jobs for 1 and 3 hosts are
    taken. No run twice, no host on two slots of one job, one attempt and one audit row per
    claim, jobs running, and each host's row and object say what was written."""
    from coldbench.api.auth.models import AuditEvent
    from coldbench.api.jobs.models import Job

    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        host_ids = [make_host(db_session, f"host-{i:02d}")[0].id for i in range(12)]
        for _ in range(18):
            make_job(db_session, settings)
        for _ in range(4):
            make_job(db_session, settings, hosts=3)
    claims: list[tuple[str, str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claim_round(host_id: str, barrier: threading.Barrier) -> None:
        try:
            with live_sessionmaker() as db_session:
                host = db_session.get(Host, host_id)
                db_session.commit()
                barrier.wait()
                lease = agent_calls.claim_lease(
                    db_session=db_session, settings=settings, host=host, report=_report()
                )
                # The object shows the committed row, with nothing left to write.
                assert host.health == ("busy" if lease else "ready")
                assert not db_session.dirty
                if lease is not None:
                    with lock:
                        claims.append((lease.run_id, host_id, lease.attempt))
                    # Done with it (as complete_run leaves them): it may claim again.
                    db_session.execute(
                        sa.update(Run).where(Run.id == lease.run_id).values(state="completed")
                    )
                    db_session.execute(
                        sa.update(Host).where(Host.id == host_id).values(health="ready")
                    )
                    db_session.commit()
        except BaseException as error:  # surfaced below
            errors.append(error)

    for _ in range(6):
        barrier = threading.Barrier(len(host_ids))
        threads = [threading.Thread(target=claim_round, args=(h, barrier)) for h in host_ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
    run_ids = [run_id for run_id, _, _ in claims]
    assert len(run_ids) == len(set(run_ids)) == 30  # every run, none twice
    with live_sessionmaker() as db_session:
        runs = {run.id: run for run in db_session.scalars(sa.select(Run))}
        assert all(run.state == "completed" and run.attempt == 1 for run in runs.values())
        slots = {(runs[run_id].job_id, host_id) for run_id, host_id, _ in claims}
        assert len(slots) == 30  # a host never on two slots of one job
        attempts = db_session.execute(sa.select(RunAttempt.run_id, RunAttempt.host_id)).all()
        assert sorted(attempts) == sorted((run_id, host_id) for run_id, host_id, _ in claims)
        audited = db_session.scalars(
            sa.select(AuditEvent.subject_id).where(AuditEvent.kind == "run.leased")
        ).all()
        assert sorted(audited) == sorted(run_ids)
        assert set(db_session.scalars(sa.select(Job.state))) == {"running"}


def test_a_completion_that_loses_its_race_with_expiry_is_kept_for_audit_and_refused(
    live_db: str, live_sessionmaker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease expires between the completion's read of the run and its guarded update:
    nothing of the completion is applied to the requeued run; it is refused and kept on its
    attempt, as a late completion is."""
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        host, _ = make_host(db_session, "slow")
        make_job(db_session, settings)
        lease = agent_calls.claim_lease(
            db_session=db_session, settings=settings, host=host, report=_report()
        )
        assert lease is not None
        host_id = host.id
    real = completion.Manifest.model_validate
    expired: list[str] = []

    def validate_after_expiry(value: Any) -> Any:
        # Between the read and the update: the sweep finds the lease lost and requeues it.
        with live_sessionmaker() as other:
            run = other.get(Run, lease.run_id)
            expiry.lose_attempt(db_session=other, settings=settings, run=run, why="test")
            other.commit()
        expired.append(lease.run_id)
        return real(value)

    monkeypatch.setattr(completion.Manifest, "model_validate", validate_after_expiry)
    with live_sessionmaker() as db_session, pytest.raises(Exception, match="no longer current"):
        agent_calls.complete_run(
            db_session=db_session,
            host_id=host_id,
            run_id=lease.run_id,
            attempt=lease.attempt,
            status="failed",
            reason="OOM",
            manifest={"files": {}},
        )
    assert expired == [lease.run_id]
    with live_sessionmaker() as db_session:
        run = db_session.get(Run, lease.run_id)
        assert run is not None and run.state == "queued" and run.manifest is None
        attempt = db_session.scalars(
            sa.select(RunAttempt).where(RunAttempt.run_id == lease.run_id)
        ).one()
        assert attempt.state == "expired"
        assert attempt.late_complete is not None and attempt.late_complete["reason"] == "OOM"
        # Nothing of the refused completion was recorded as the run's end.
        kinds = db_session.scalars(
            sa.select(AuditEvent.kind).where(AuditEvent.subject_id == lease.run_id)
        ).all()
        assert "run.failed" not in kinds


def test_groups_of_two_api_processes_never_give_one_run_to_two_hosts(
    live_db: str, live_sessionmaker: Any
) -> None:
    """Two async engines (two API processes' pools) each claiming for a group of ten hosts at
    once, fifteen runs queued: SKIP LOCKED lets the groups pass each other, and every run goes
    to exactly one host."""
    settings = _settings(live_db)
    with live_sessionmaker() as db_session:
        hosts = [make_host(db_session, f"two-{i:02d}") for i in range(20)]
        for _ in range(15):
            make_job(db_session, settings)

    async def main() -> list[Any]:
        processes = [AsyncDatabase(make_async_engine(live_db), live_sessionmaker) for _ in range(2)]
        try:
            claims = [
                processes[index % 2].run_grouped(
                    run_claim.claim_group_program,
                    run_claim.ClaimRequest(
                        host_id=host.id,
                        report=_report(),
                        settings=settings,
                        dialect="postgresql",
                        token=secret,
                    ),
                )
                for index, (host, secret) in enumerate(hosts)
            ]
            return await asyncio.gather(*claims)
        finally:
            for process in processes:
                await process.engine.dispose()

    answers = asyncio.run(main())
    leases = [answer.lease for answer in answers if answer.lease is not None]
    assert len(leases) == 15
    assert len({lease.run_id for lease in leases}) == 15
    with live_sessionmaker() as db_session:
        leased = db_session.execute(
            sa.select(Run.id, Run.host_id).where(Run.state == "leased")
        ).all()
        assert len(leased) == 15 and len({host_id for _, host_id in leased}) == 15
        assert db_session.scalar(sa.select(sa.func.count()).select_from(RunAttempt)) == 15


def test_offers_go_to_their_hosts_first_then_to_any_host_that_fits() -> None:
    def host(host_id: str) -> LeasingHost:
        return LeasingHost(host_id, host_id, [], [], {}, [], "ready")

    a, b, c = host("a"), host("b"), host("c")
    offers = run_claim._Offers(
        runs={"a": ["r1", "r4"], "b": ["r2", "r5"], "c": ["r3"]},
        oldest_first=["r1", "r2", "r3", "r4", "r5"],
        hosts=[a, b, c],
        jobs={f"r{i}": f"job{i}" for i in range(1, 6)},
        fits=lambda h, job: not (h.id == "c" and job == "job5"),
    )
    # r2 and r3 were held by a concurrent claimer: b takes its spare r5; c, whose only offer
    # is gone, takes a's spare r4 (c may not run job5).
    assert offers.assign(["r1", "r4", "r5"]) == {"a": "r1", "b": "r5", "c": "r4"}
    # Nothing left that c fits: c gets none (and looks again in the next round).
    assert offers.assign(["r1", "r5"]) == {"a": "r1", "b": "r5"}
