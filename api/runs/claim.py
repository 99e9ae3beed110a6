"""Lease claims: a host's lease request long-polls until a queued run it may run is its own.

A lease request waits on the event loop (`wait_for_lease`): each claim is one short
transaction grouped with the claims of concurrent requests (`claim_group_program`), and between
claims the request waits for `wakeup.announce_work` from whoever queued a run. Expiry is not
part of a claim: the periodic sweep (api/runs/expiry.py) requeues lost runs and announces them.
Whether a host may run a job is `api/hosts/matching.py`'s rule.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from coldbench.api.auth import service as auth_service
from coldbench.api.auth.models import AuditEvent
from coldbench.api.database import utcnow
from coldbench.api.errors import Invalid, NotAuthenticated
from coldbench.api.hosts import service as host_service
from coldbench.api.hosts.matching import LeasingHost, why_host_cannot_run
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.runs.models import Run, RunAttempt
from coldbench.api.runs.service import AUDIT_COLUMNS
from coldbench.api.runs.wakeup import WorkSignal
from coldbench.api.settings import Settings
from coldbench.api.transactions import Database, Execute, Program, among_ids
from coldbench.evidence.contract.boundary import value_problem
from coldbench.evidence.contract.protocol import JobState, Lease, RepositoryOffer, RunState
from coldbench.evidence.contract.schemas import JobSpec

log = logging.getLogger(__name__)

# Queued runs looked at per query while searching for one this host may take: the oldest
# first, then the next page, so a host that fits none of the oldest still finds newer work.
CANDIDATE_PAGE = 100
CANDIDATE_PAGES_MAX = 20
# Runs offered to a group beyond one per host: spares for when concurrent claimers (the groups
# of other API processes, the command line) hold some; each offered run is judged against the
# hosts, so not many more.
ELIGIBLE_SPARE = 32
_SPEC_CACHE_MAX = 4096
_spec_cache: OrderedDict[str, tuple[JobSpec, dict[str, Any]]] = OrderedDict()
_spec_cache_lock = threading.Lock()


@dataclass(frozen=True)
class HostReport:
    """What a host says about itself with a lease request: its fingerprint and (None from agents
    that do not send them, which keeps what the host registered) its repositories and models.
    Never labels: those come from enrollment and the admin."""

    fingerprint: dict[str, Any]
    repositories: dict[str, RepositoryOffer] | None = None
    models: list[str] | None = None


# The claim runs as SQLAlchemy Core statements on the session's connection (its transaction):
# no ORM unit of work, autoflush or identity-map bookkeeping, which would be most of a claim's
# CPU.
_runs = cast(sa.Table, Run.__table__)
_jobs = cast(sa.Table, Job.__table__)
_hosts = cast(sa.Table, Host.__table__)
_attempts = cast(sa.Table, RunAttempt.__table__)
_audit = cast(sa.Table, AuditEvent.__table__)


def _job_specs(job_ids: set[str]) -> Program[dict[str, tuple[JobSpec, dict[str, Any]]]]:
    """Parsed specs by job id; a job's spec never changes, so each is parsed once per process."""
    found: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
    with _spec_cache_lock:
        for job_id in job_ids:
            if job_id in _spec_cache:
                found[job_id] = _spec_cache[job_id]
    missing = job_ids - found.keys()
    if missing:
        rows = (
            yield Execute(sa.select(_jobs.c.id, _jobs.c.spec).where(_jobs.c.id.in_(missing)))
        ).all()
        with _spec_cache_lock:
            for job_id, spec in rows:
                found[job_id] = (spec, spec.model_dump(mode="json", by_alias=True))
                _spec_cache[job_id] = found[job_id]
            while len(_spec_cache) > _SPEC_CACHE_MAX:
                _spec_cache.popitem(last=False)
    return found


_CANDIDATES = (
    sa.select(_runs.c.id, _runs.c.job_id, _runs.c.slot, _jobs.c.created_at)
    .join(_jobs, _jobs.c.id == _runs.c.job_id)
    .where(
        _runs.c.state == RunState.QUEUED,
        _jobs.c.state.in_((JobState.QUEUED, JobState.RUNNING)),
    )
    .order_by(_jobs.c.created_at, _jobs.c.id, _runs.c.slot)
    .limit(CANDIDATE_PAGE)
)


@dataclass(frozen=True)
class ClaimRequest:
    """One lease request's claim: its host, what the host reports, and what it is judged with.

    `token` is the bearer token from the request, checked against the host's stored digest
    (constant time) and its revocation on the same row the claim locks, so a lease request
    reads its host once. None only where the caller loaded the host itself (tests).
    """

    host_id: str
    report: HostReport | None
    settings: Settings
    dialect: str
    token: str | None = None


@dataclass(frozen=True)
class Claimed:
    """What a claim did: the lease (None: nothing fits, or the host holds a run) and the host
    columns it wrote."""

    lease: Lease | None
    host_values: dict[str, Any]


# The claim's statements, built once (constructing a statement and its cache key costs more
# Python than executing a cached one), in the PostgreSQL form [True] and the other [False].
_CLAIMING_HOSTS = {
    is_pg: sa.select(
        _hosts.c.id,
        _hosts.c.secret_sha256,
        _hosts.c.revoked_at,
        _hosts.c.name,
        _hosts.c.labels,
        _hosts.c.system_labels,
        _hosts.c.repositories,
        _hosts.c.models,
        _hosts.c.health,
    )
    .where(among)
    .order_by(_hosts.c.id)  # one lock order for every claimer: no deadlock between groups
    .with_for_update(of=_hosts)
    for is_pg, among in among_ids(_hosts.c.id, "host_ids").items()
}
# Which of the group's hosts hold a run, and the first page of the oldest queued runs, in one
# statement (one round trip instead of two): read after the hosts' rows are locked, so it sees
# a claim of the same host committed by a concurrent transaction while this one waited for the
# lock. A row with `holder` set is a host holding a run; the others are `_CANDIDATES`' rows
# (a compound select keeps no order: sorted again by `_candidate_order`).
_candidates_page = _CANDIDATES.subquery("page")


def _holding_and_candidates(among: sa.ColumnElement[bool]) -> sa.CompoundSelect[Any]:
    holders = sa.select(
        sa.null().label("id"),
        sa.null().label("job_id"),
        sa.null().label("slot"),
        sa.null().label("created_at"),
        _runs.c.host_id.label("holder"),
    ).where(among, _runs.c.state == RunState.LEASED)
    page = sa.select(*_candidates_page.c, sa.null().label("holder"))
    return sa.union_all(page, holders)


_HOLDING_AND_CANDIDATES = {
    is_pg: _holding_and_candidates(among)
    for is_pg, among in among_ids(_runs.c.host_id, "host_ids").items()
}
_claim_times = {
    name: sa.bindparam(name, type_=_runs.c.leased_at.type)
    for name in ("now", "expires", "deadline")
}
_pairs = (
    sa.func.unnest(
        sa.bindparam("run_ids", type_=postgresql.ARRAY(sa.String)),
        sa.bindparam("host_ids", type_=postgresql.ARRAY(sa.String)),
    )
    .table_valued("run_id", "host_id")
    .render_derived(name="pick")
)
# PostgreSQL: lock the oldest of the runs offered to the group's hosts that no concurrent
# claimer (another API process's group, the command line) holds, as many as there are hosts;
# SKIP LOCKED, so claimers pass each other instead of queueing.
_LOCK_RUNS = (
    sa.select(_runs.c.id, _runs.c.job_id, _runs.c.attempt)
    .join(_jobs, _jobs.c.id == _runs.c.job_id)
    .where(
        _runs.c.id == sa.any_(sa.bindparam("run_ids", type_=postgresql.ARRAY(sa.String))),
        _runs.c.state == RunState.QUEUED,
    )
    .order_by(_jobs.c.created_at, _jobs.c.id, _runs.c.slot)
    .limit(sa.bindparam("how_many"))
    .with_for_update(of=_runs, skip_locked=True)
)


def _take(picked: sa.ColumnElement[bool], host_id: sa.ColumnElement[Any]) -> sa.UpdateBase:
    """What a taken run becomes: `picked` queued runs leased to `host_id` (the guard on state
    keeps a claim atomic also where there are no row locks)."""
    return (
        sa.update(_runs)
        .where(picked, _runs.c.state == RunState.QUEUED)
        .values(
            state=RunState.LEASED,
            host_id=host_id,
            attempt=_runs.c.attempt + 1,
            leased_at=_claim_times["now"],
            lease_expires_at=_claim_times["expires"],
            deadline_at=_claim_times["deadline"],
            progress=None,
        )
        .returning(_runs.c.id, _runs.c.job_id, _runs.c.attempt, _runs.c.host_id)
    )


# SQLite (one writer at a time, no row locks): one pick per statement, then the writes below
# one statement each.
_CLAIM_PICK = _take(
    _runs.c.id == sa.bindparam("run_id"), sa.bindparam("host_id", type_=_runs.c.host_id.type)
)
_INSERT_ATTEMPT = sa.insert(_attempts)
_INSERT_AUDIT = sa.insert(_audit)
_UPDATE_HOST = sa.update(_hosts).where(_hosts.c.id == sa.bindparam("w_host"))
# A claimed run makes its job running (refresh_job_state's rule, without reading every run of
# the job).
_JOBS_RUNNING = {
    is_pg: sa.update(_jobs)
    .where(among, _jobs.c.state == JobState.QUEUED)
    .values(state=JobState.RUNNING, updated_at=sa.bindparam("w_now", type_=_jobs.c.updated_at.type))
    for is_pg, among in among_ids(_jobs.c.id, "job_ids").items()
}


def _rows_of(name: str, table: sa.Table, *columns: str) -> sa.TableValuedAlias:
    """The JSON list parameter `name` as a table of `table`'s `columns`, typed as there
    (PostgreSQL's json_to_recordset): any number of rows in one parameter, so the statement's
    text, and its prepared statement, are the same for every group."""
    return (
        sa.func.json_to_recordset(sa.bindparam(name, type_=sa.JSON))
        .table_valued(*(sa.column(column, table.c[column].type) for column in columns))
        .render_derived(name=name, with_types=True)
    )


_attempt_rows = _rows_of(
    "attempt_rows", _attempts, "run_id", "attempt", "host_id", "state", "started_at"
)
_audit_rows = _rows_of("audit_rows", _audit, *AUDIT_COLUMNS)
_HOST_COLUMNS = ("fingerprint", "repositories", "models", "health", "last_heartbeat_at")
_host_rows = _rows_of("host_rows", _hosts, "id", *_HOST_COLUMNS)
# PostgreSQL: the group's writes in one statement, one round trip instead of five: the picks
# (runs this transaction holds locked, so each is taken), their attempts, their jobs made
# running, the audit rows, and the hosts' rows (a column a host's row leaves out keeps its
# value). Answers how many runs it took.
_WRITE_CLAIMS = (
    sa.select(sa.func.count())
    .select_from(_take(_runs.c.id == _pairs.c.run_id, _pairs.c.host_id).cte("picked"))
    .add_cte(
        sa.insert(_attempts)
        .from_select(list(_attempt_rows.c.keys()), sa.select(*_attempt_rows.c))
        .cte("attempts"),
        _JOBS_RUNNING[True].cte("running"),
        sa.insert(_audit)
        .from_select(list(_audit_rows.c.keys()), sa.select(*_audit_rows.c))
        .cte("audit"),
        sa.update(_hosts)
        .where(_hosts.c.id == _host_rows.c.id)
        .values(
            {name: sa.func.coalesce(_host_rows.c[name], _hosts.c[name]) for name in _HOST_COLUMNS}
        )
        .cte("hosts_seen"),
    )
)
_TOUCHED = {
    is_pg: sa.select(_attempts.c.host_id, _runs.c.job_id, _runs.c.slot)
    .join(_runs, _attempts.c.run_id == _runs.c.id)
    .where(among_ids(_attempts.c.host_id, "host_ids")[is_pg], among)
    for is_pg, among in among_ids(_runs.c.job_id, "job_ids").items()
}

# Rounds of picking for hosts whose picks were taken by a concurrent claimer before it gives
# up until the next notification (with work queued, waiting would cost up to lease_poll_s).
CLAIM_RACES_MAX = 3


def claim_group_program(requests: Sequence[ClaimRequest]) -> Program[list[Claimed | Exception]]:
    """One transaction for the claims of concurrent lease requests (a group commit,
    `Database.run_grouped`): each authenticated host that holds no run takes the oldest queued
    run it may run, and no run goes to two hosts.

    The same statements whatever the group's size (four on PostgreSQL, where no run is
    contested): lock the hosts' rows (which serializes the claims of one host, one run per
    host at a time, and authenticates the requests), see which hold a run and read the oldest
    queued runs (one statement, `_HOLDING_AND_CANDIDATES`), offer each to the first host, in
    turn, that may run it (`_offer_runs`), lock the oldest offered runs no concurrent claimer
    holds (SKIP LOCKED: claimers pass each other; `_take_runs`), then write the runs taken,
    their attempts, the jobs' state, the audit rows and the hosts' rows: on PostgreSQL in one
    statement (`_write_claims`), on SQLite one statement each. A request whose token does not
    match, or whose host is revoked or gone, gets NotAuthenticated.
    """
    settings, is_pg = requests[0].settings, requests[0].dialect == "postgresql"
    rows = {
        row.id: row
        for row in (
            yield Execute(
                _CLAIMING_HOSTS[is_pg], {"host_ids": sorted({r.host_id for r in requests})}
            )
        ).all()
    }
    answers: list[Claimed | Exception] = []
    claimers: dict[str, LeasingHost] = {}
    host_values: dict[str, dict[str, Any]] = {}
    for request in requests:
        row = rows.get(request.host_id)
        if (
            row is None
            or row.revoked_at is not None
            or (
                request.token is not None
                and not auth_service.token_matches(request.token, row.secret_sha256)
            )
        ):
            answers.append(NotAuthenticated(auth_service.WORKER_REFUSAL))
            continue
        if request.host_id in claimers:
            # The same host twice in one group (an agent's retry): the first request claims.
            answers.append(Claimed(None, {}))
            continue
        problem = _report_problem(request.report)
        if problem is not None:
            # What one host reports never reaches the group's statements (the request types
            # refuse it first; this keeps a caller that skipped them to its own request).
            answers.append(Invalid(f"lease request: {problem}"))
            continue
        values, host = _reported(request.report, row)
        claimers[host.id] = host
        host_values[host.id] = values
        answers.append(Claimed(None, values))  # its lease, if any, is filled in below
    holding: set[str] = set()
    first_page: list[Any] | None = None
    if claimers:
        rows_read = (
            yield Execute(_HOLDING_AND_CANDIDATES[is_pg], {"host_ids": list(claimers)})
        ).all()
        holding = {row.holder for row in rows_read if row.holder is not None}
        first_page = sorted((row for row in rows_read if row.holder is None), key=_candidate_order)
    taken = yield from _take_runs(
        settings,
        is_pg,
        [host for host in claimers.values() if host.id not in holding],
        first_page,
    )
    now = utcnow()
    attempt_rows = [
        {
            "run_id": run_id,
            "attempt": attempt,
            "host_id": host_id,
            "state": RunState.LEASED,
            "started_at": now,
        }
        for host_id, (run_id, _, attempt) in taken.items()
    ]
    audit_rows = [
        {
            "at": now,
            "actor": f"host:{host_id}",
            "kind": "run.leased",
            "subject_id": run_id,
            "detail": {"attempt": attempt},
        }
        for host_id, (run_id, _, attempt) in taken.items()
    ]
    job_ids = sorted({job_id for _, job_id, _ in taken.values()})
    for host_id in taken:
        host_values[host_id]["health"] = "busy"
    if is_pg:
        if taken or any(host_values.values()):
            yield from _write_claims(
                settings, taken, job_ids, attempt_rows, audit_rows, host_values, now
            )
    else:
        if taken:
            yield Execute(_INSERT_ATTEMPT, attempt_rows)
            yield Execute(_JOBS_RUNNING[is_pg], {"job_ids": job_ids, "w_now": now})
            yield Execute(_INSERT_AUDIT, audit_rows)
        # The hosts' rows, one executemany per set of columns written (the statement is built
        # once; the columns set are the parameters' keys).
        by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for host_id, values in host_values.items():
            if values:
                by_columns.setdefault(tuple(sorted(values)), []).append(
                    {"w_host": host_id, **values}
                )
        for params in by_columns.values():
            yield Execute(_UPDATE_HOST, params)
    specs = yield from _job_specs({job_id for _, job_id, _ in taken.values()})
    for index, request in enumerate(requests):
        answer = answers[index]
        # The first authenticated request of a host is its claimer (later ones got nothing).
        if not isinstance(answer, Claimed) or request.host_id not in taken:
            continue
        run_id, job_id, attempt = taken.pop(request.host_id)
        answers[index] = Claimed(
            Lease(
                run_id=run_id,
                attempt=attempt,
                job_id=job_id,
                spec=specs[job_id][1],
                timeout_s=settings.run_timeout_s,
                lease_ttl_s=settings.lease_ttl_s,
            ),
            answer.host_values,
        )
    return answers


def _write_claims(
    settings: Settings,
    taken: dict[str, tuple[str, str, int]],
    job_ids: list[str],
    attempt_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    host_values: dict[str, dict[str, Any]],
    now: datetime,
) -> Program[None]:
    """PostgreSQL: what a group's claims write, as `_WRITE_CLAIMS` (one statement)."""
    params = {
        "run_ids": [run_id for run_id, _, _ in taken.values()],
        "host_ids": list(taken),
        "now": now,
        "expires": now + timedelta(seconds=settings.lease_ttl_s),
        "deadline": now + timedelta(seconds=settings.run_timeout_s),
        "job_ids": job_ids,
        "w_now": now,
        "attempt_rows": _as_json(attempt_rows),
        "audit_rows": _as_json(audit_rows),
        "host_rows": _as_json(
            [{"id": host_id, **values} for host_id, values in host_values.items() if values]
        ),
    }
    took = (yield Execute(_WRITE_CLAIMS, params)).scalar()
    if took != len(taken):
        # Each pick was locked by this transaction as a queued run: this cannot happen, and
        # the attempts and audit rows written with it would not be true.
        raise RuntimeError(f"a claim took {took} of the {len(taken)} runs it held locked")


def _as_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for a JSON parameter: times as ISO 8601 text (which PostgreSQL reads back as
    `timestamp with time zone`)."""
    return [
        {
            key: (value.isoformat() if isinstance(value, datetime) else value)
            for key, value in row.items()
        }
        for row in rows
    ]


def _report_problem(report: HostReport | None) -> str | None:
    """What in a host's report the database could not hold (None: nothing)."""
    if report is None:
        return None
    return value_problem(report.fingerprint) or value_problem(report.models)


def _reported(report: HostReport | None, row: Any) -> tuple[dict[str, Any], LeasingHost]:
    """The host columns a lease request's report writes, and the host as it will be written
    (eligibility is judged on that: it is written in this transaction)."""
    host = LeasingHost(
        id=row.id,
        name=row.name,
        labels=row.labels,
        system_labels=row.system_labels,
        repositories=row.repositories,
        models=row.models,
        health=row.health,
    )
    if report is None:
        return {}, host
    values = host_service.host_report_values(
        fingerprint=report.fingerprint, repositories=report.repositories, models=report.models
    )
    if host.health == "lost":
        values["health"] = "ready"
    written = {
        name: values[name] for name in ("repositories", "models", "health") if name in values
    }
    return values, replace(host, **written)


def _take_runs(
    settings: Settings,
    is_pg: bool,
    hosts: list[LeasingHost],
    first_page: list[Any] | None = None,
) -> Program[dict[str, tuple[str, str, int]]]:
    """(run id, job id, attempt) by host id, for the hosts that take a run: on PostgreSQL
    the runs this transaction locked for them (`_write_claims` takes them), on SQLite the
    runs already taken. `first_page`: the first page of `_CANDIDATES`, read already in this
    transaction (with the hosts holding runs), for the first round."""
    taken: dict[str, tuple[str, str, int]] = {}
    leased: set[str] = set()
    lost: set[str] = set()  # runs a concurrent claimer holds: not offered again
    if not hosts:
        return taken
    for _ in range(CLAIM_RACES_MAX):
        offers = yield from _offer_runs(is_pg, hosts, lost | leased, first_page)
        first_page = None  # later rounds read again: concurrent claims have taken runs
        if not offers.oldest_first:
            break
        if is_pg:
            # The oldest offered runs that no concurrent claimer holds, as many as there are
            # hosts (SKIP LOCKED: claimers pass each other instead of queueing).
            params = {"run_ids": offers.oldest_first, "how_many": len(hosts)}
            locked_rows = [
                (str(run_id), str(job_id), int(attempt))
                for run_id, job_id, attempt in (yield Execute(_LOCK_RUNS, params)).all()
            ]
            locked = [run_id for run_id, _, _ in locked_rows]
            # Every offered run older than the youngest locked one (all of them, when fewer
            # than asked for were locked) that was not locked is held by a concurrent claimer,
            # or taken: never offered again in this transaction.
            reached = (
                len(offers.oldest_first)
                if len(locked) < len(hosts)
                else 1 + max(offers.oldest_first.index(run_id) for run_id in locked)
            )
            lost.update(set(offers.oldest_first[:reached]) - set(locked))
        else:
            locked = offers.oldest_first  # SQLite: one writer at a time, no row locks
        picks = offers.assign(locked)
        if is_pg:
            # Locked by this transaction: each pick is taken by `_write_claims`.
            attempts = {run_id: (job_id, attempt) for run_id, job_id, attempt in locked_rows}
            for host_id, run_id in picks.items():
                job_id, attempt = attempts[run_id]
                taken[host_id] = (run_id, job_id, attempt + 1)
                leased.add(run_id)
        elif picks:
            now = utcnow()
            times = {
                "now": now,
                "expires": now + timedelta(seconds=settings.lease_ttl_s),
                "deadline": now + timedelta(seconds=settings.run_timeout_s),
            }
            for host_id, run_id in picks.items():
                row = (
                    yield Execute(_CLAIM_PICK, {"run_id": run_id, "host_id": host_id, **times})
                ).one_or_none()
                if row is not None:
                    taken[str(row.host_id)] = (str(row.id), str(row.job_id), int(row.attempt))
                    leased.add(str(row.id))
        # Hosts that were offered runs but took none (held by concurrent claimers) look again
        # at once: each statement sees the latest commits (READ COMMITTED).
        hosts = [host for host in hosts if host.id not in taken and offers.runs.get(host.id)]
        if not hosts:
            break
    else:
        if hosts:
            log.warning(
                "%d hosts lost every run they were offered to concurrent claimers in %d rounds;"
                " they wait for the next notification",
                len(hosts),
                CLAIM_RACES_MAX,
            )
    return taken


@dataclass
class _Offers:
    """Queued runs offered to a group's hosts: each host's own, oldest first, no run offered
    to two hosts (the first picks of all hosts, then their spares, in turn); and whether a
    host fits a job, as judged."""

    runs: dict[str, list[str]]
    oldest_first: list[str]
    hosts: list[LeasingHost]
    jobs: dict[str, str]  # run id -> job id
    fits: Callable[[LeasingHost, str], bool]

    def assign(self, locked: list[str]) -> dict[str, str]:
        """A run for each host it can go to, out of `locked` (the runs this transaction may
        take, oldest first): a host's own offer first, else any other it fits."""
        free = dict.fromkeys(locked)
        picks: dict[str, str] = {}
        for host in self.hosts:
            for run_id in self.runs.get(host.id, ()):
                if run_id in free:
                    picks[host.id] = run_id
                    del free[run_id]
                    break
        for host in self.hosts:
            if host.id in picks or not self.runs.get(host.id):
                continue
            for run_id in free:
                if self.fits(host, self.jobs[run_id]):
                    picks[host.id] = run_id
                    del free[run_id]
                    break
        return picks


def _candidate_order(row: Any) -> tuple[Any, str, int]:
    """`_CANDIDATES`' order of its rows: oldest job first, then slot."""
    return (row.created_at, row.job_id, row.slot)


def _offer_runs(
    is_pg: bool,
    hosts: list[LeasingHost],
    excluded: set[str],
    first_page: list[Any] | None = None,
) -> Program[_Offers]:
    """Offers of the oldest queued runs to `hosts`: each run to the first host, in turn, that
    may run it, until every host has one and there are ELIGIBLE_SPARE more (runs that
    concurrent claimers may hold). No locks taken. `first_page`: `_CANDIDATES`' rows, read
    already, instead of reading them again."""
    specs: dict[str, tuple[JobSpec, dict[str, Any]]] = {}
    judged: dict[tuple[str, str], bool] = {}  # a host's eligibility depends only on the spec

    def fits(host: LeasingHost, job_id: str) -> bool:
        key = (host.id, job_id)
        if key not in judged:
            judged[key] = why_host_cannot_run(host, specs[job_id][0]) is None
        return judged[key]

    offers = _Offers({}, [], hosts, {}, fits)
    wanted = len(hosts) + ELIGIBLE_SPARE
    turn = list(hosts)  # who is offered the next run it fits: the host at the front
    after: tuple[Any, str, int] | None = None
    for _ in range(CANDIDATE_PAGES_MAX):
        if after is None and first_page is not None:
            page = first_page
        else:
            query = _CANDIDATES
            if after is not None:
                query = query.where(sa.tuple_(_jobs.c.created_at, _jobs.c.id, _runs.c.slot) > after)
            page = (yield Execute(query)).all()
        candidates = [row for row in page if row.id not in excluded]
        job_ids = {row.job_id for row in candidates}
        specs.update((yield from _job_specs(job_ids - specs.keys())))
        # `hosts: N` reproductions run on N distinct hosts: a host that held another slot of
        # a job never takes a second one (it may take a requeued attempt of its own slot).
        shared = sorted(job_id for job_id in job_ids if specs[job_id][0].hosts > 1)
        touched: dict[str, set[tuple[str, int]]] = {}  # host id -> (job id, slot) it held
        if shared:
            params = {"host_ids": [host.id for host in hosts], "job_ids": shared}
            for host_id, job_id, slot in (yield Execute(_TOUCHED[is_pg], params)).all():
                touched.setdefault(host_id, set()).add((job_id, slot))
        touched_jobs = {host_id: {job for job, _ in held} for host_id, held in touched.items()}
        for row in candidates:
            for index, host in enumerate(turn):
                if row.job_id in touched_jobs.get(host.id, ()) and (
                    (row.job_id, row.slot) not in touched[host.id]
                ):
                    continue
                if fits(host, row.job_id):
                    offers.runs.setdefault(host.id, []).append(row.id)
                    offers.oldest_first.append(row.id)
                    offers.jobs[row.id] = row.job_id
                    turn.append(turn.pop(index))  # served: to the back of the turn
                    break
            if len(offers.oldest_first) >= wanted:
                return offers
        if len(page) < CANDIDATE_PAGE or all(host.id in offers.runs for host in hosts):
            break
        after = (page[-1].created_at, page[-1].job_id, page[-1].slot)
    return offers


def _log_claim(claimed: Claimed, host_id: str) -> None:
    if claimed.lease is not None:
        log.info("run leased", extra={"run_id": claimed.lease.run_id, "host_id": host_id})


async def wait_for_lease(
    *,
    db: Database,
    request: ClaimRequest,
    signal: WorkSignal,
    wait_s: float,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> Lease | None:
    """Long-poll on the event loop: claim (grouped with the claims of concurrent requests), and
    between claims wait for a notification that work was queued (bounded by lease_poll_s); None
    after wait_s seconds without a run, or as soon as `gone()` says the client left (a run
    claimed for nobody would wait for expiry). NotAuthenticated when the request's token is not
    its host's.

    No database connection is held while waiting: each claim commits or rolls back.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait_s, request.settings.lease_wait_max_s)
    while True:
        seen = signal.generation
        claimed = await db.run_grouped(claim_group_program, request)
        _log_claim(claimed, request.host_id)
        # The report is written by the first claim; the host row is read again by each.
        request = replace(request, report=None)
        remaining = deadline - loop.time()
        if claimed.lease is not None or remaining <= 0:
            return claimed.lease
        await signal.wait(since=seen, timeout_s=min(remaining, request.settings.lease_poll_s))
        if gone is not None and await gone():
            return None
