"""Hosts: registration with an enrollment token, listing, and what a host can run."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.auth import service as auth_service
from api.database import utcnow
from api.errors import Conflict, Invalid, NotAuthenticated, NotFound
from api.hosts.models import Host
from api.runs.models import Run
from api.settings import Settings
from api.transactions import Execute, Program
from evidence.calibration import HostCalibration
from evidence.protocol import RepositoryOffer, RunState
from evidence.schemas import BUILTIN_CORPUS, JobSpec
from evidence.variant import parse_feature

log = logging.getLogger(__name__)


class HostTraits(Protocol):
    """What matching a job to a host reads: a Host, or the lean HostView of a submission."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> list[str]: ...
    @property
    def fingerprint(self) -> dict[str, Any]: ...
    @property
    def repositories(self) -> dict[str, Any]: ...
    @property
    def models(self) -> list[str]: ...


@dataclass(frozen=True)
class HostView:
    """The columns of a host that job matching reads (HostTraits), without the ORM object."""

    name: str
    labels: list[str]
    fingerprint: dict[str, Any]
    repositories: dict[str, Any]
    models: list[str]


@dataclass(frozen=True)
class LeasingHost:
    """A host as its lease request is judged (HostTraits, plus its id and health): read by the
    claim's Core query of the hosts' rows (api/runs/service.py), never as an ORM object."""

    id: str
    name: str
    labels: list[str]
    fingerprint: dict[str, Any]
    repositories: dict[str, Any]
    models: list[str]
    health: str


def auto_labels(host: HostTraits) -> list[str]:
    """Labels every host has without configuring them: its name, backend and OS."""
    labels = [f"host:{host.name}"]
    backend = host.fingerprint.get("backend")
    if backend:
        labels.append(f"backend:{backend}")
    os_name = str(host.fingerprint.get("os") or "").split()
    if os_name:
        labels.append(f"os:{os_name[0].lower()}")
    return labels


def effective_labels(host: HostTraits) -> set[str]:
    return set(host.labels) | set(auto_labels(host))


# Namespaces of the labels the server derives itself (auto_labels): never taken from a host,
# so no host can carry `host:<another host's name>`.
AUTOMATIC_LABEL_PREFIXES = ("host:", "backend:", "os:")


def is_automatic_label(label: str) -> bool:
    return label.startswith(AUTOMATIC_LABEL_PREFIXES)


def _own_labels(labels: Iterable[str]) -> set[str]:
    return {label for label in labels if not is_automatic_label(label)}


def active_host_named(*, db_session: Session, name: str) -> Host | None:
    return db_session.scalars(
        sa.select(Host).where(Host.name == name, Host.revoked_at.is_(None))
    ).one_or_none()


def register_host(
    *,
    db_session: Session,
    enrollment_token: str,
    name: str,
    fingerprint: dict[str, Any],
    labels: list[str],
    repositories: dict[str, RepositoryOffer],
    models: list[str],
) -> tuple[Host, str]:
    """Spend an enrollment token on a new host; returns (host, secret). The secret is shown once.

    Identity is the enrolled id and secret, never the name: a name held by a host that is not
    revoked is refused (Conflict) and the token stays unspent. A reinstalled host keeps its
    secret file, or the admin revokes the old host first (`coldbench admin revoke host NAME`).
    Labels are the token's plus the host's configured ones, without the automatic namespaces.
    """
    token = auth_service.claim_enrollment_token(db_session=db_session, token=enrollment_token)
    if token is None:
        raise NotAuthenticated("enrollment token unknown or already used")
    holder = active_host_named(db_session=db_session, name=name)
    if holder is not None:
        db_session.rollback()  # the token stays unused
        raise Conflict(
            f"host name {name} is already enrolled (worker id {holder.id}); choose another "
            "name in worker.toml, keep the host's secret file when reinstalling, or revoke the "
            f"old host first: coldbench admin revoke host {name}"
        )
    host = Host(id=auth_service.new_id(), name=name)
    db_session.add(host)
    secret, secret_sha256 = auth_service.new_worker_secret(host.id)
    host.secret_sha256 = secret_sha256
    host.fingerprint = fingerprint
    host.enrolled_labels = sorted(_own_labels(token.labels))
    host.labels = sorted(_own_labels(token.labels) | _own_labels(labels))
    host.repositories = _stored_offers(repositories)
    host.models = sorted(set(models))
    host.last_heartbeat_at = utcnow()
    host.health = "ready"
    try:
        db_session.flush()
    except IntegrityError:
        # Another registration of the same name committed between the check and the insert.
        db_session.rollback()
        raise Conflict(f"host name {name} is already enrolled; choose another name") from None
    token.host_id = host.id
    auth_service.record_audit(
        db_session=db_session,
        actor=f"enrollment:{token.id}",
        kind="host.registered",
        subject_id=host.id,
        name=name,
    )
    db_session.commit()
    log.info("host registered", extra={"host_id": host.id, "host_name": name})
    return host, secret


def update_host_report(
    *,
    db_session: Session,
    host: Host,
    fingerprint: dict[str, Any],
    repositories: dict[str, RepositoryOffer] | None = None,
    models: Iterable[str] | None = None,
) -> None:
    """What a host says about itself on each lease request: its fingerprint and, from agents
    that send them, its repositories and models (an edited worker.toml is seen at the next
    lease instead of at the next enrollment). Never its labels: those are the admin's.
    """
    for name, value in host_report_values(
        fingerprint=fingerprint, repositories=repositories, models=models
    ).items():
        setattr(host, name, value)


def host_report_values(
    *,
    fingerprint: dict[str, Any],
    repositories: dict[str, RepositoryOffer] | None = None,
    models: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The host columns a report sets (update_host_report's rule), by column name."""
    values: dict[str, Any] = {"fingerprint": fingerprint, "last_heartbeat_at": utcnow()}
    if repositories is not None:
        values["repositories"] = _stored_offers(repositories)
    if models is not None:
        values["models"] = sorted(set(models))
    return values


def _stored_offers(repositories: dict[str, RepositoryOffer]) -> dict[str, Any]:
    return {name: offer.model_dump(mode="json") for name, offer in sorted(repositories.items())}


def repository_offers(host: HostTraits) -> dict[str, RepositoryOffer]:
    """What the host registered per repository (rows from before adapters were reported were
    given the mlx-lm adapter by the migration `repository_offers`)."""
    return {name: RepositoryOffer.model_validate(raw) for name, raw in host.repositories.items()}


def find_host(*, db_session: Session, name_or_id: str) -> Host:
    """The host not revoked with this name, else the host with this id; NotFound otherwise."""
    host = active_host_named(db_session=db_session, name=name_or_id) or db_session.get(
        Host, name_or_id
    )
    if host is None:
        raise NotFound(f"no host named {name_or_id!r}")
    return host


def set_labels(*, db_session: Session, name_or_id: str, labels: Iterable[str], actor: str) -> Host:
    """Replace a host's labels (the admin's command); automatic namespaces are refused."""
    wanted = sorted(set(labels))
    reserved = [label for label in wanted if is_automatic_label(label)]
    if reserved:
        raise Invalid(f"labels {', '.join(reserved)}: host:, backend: and os: labels are automatic")
    host = find_host(db_session=db_session, name_or_id=name_or_id)
    if host.revoked_at is not None:
        raise Conflict(f"host {host.name} ({host.id}) is revoked")
    before = host.labels
    host.enrolled_labels = wanted
    host.labels = wanted
    auth_service.record_audit(
        db_session=db_session,
        actor=actor,
        kind="host.labels_set",
        subject_id=host.id,
        before=before,
        after=wanted,
    )
    db_session.commit()
    return host


def revoke_host(
    *, db_session: Session, settings: Settings, name_or_id: str, actor: str
) -> tuple[Host, list[str]]:
    """Refuse the host's secret from now on and queue its leased run again; returns (host, ids
    of the runs requeued or expired). Idempotent."""
    from api import dispatch
    from api.runs import service as run_service
    from api.runs.wakeup import announce_work

    host = find_host(db_session=db_session, name_or_id=name_or_id)
    db_session.scalars(sa.select(Host.id).where(Host.id == host.id).with_for_update()).one()
    if host.revoked_at is None:
        host.revoked_at = utcnow()
        auth_service.record_audit(
            db_session=db_session, actor=actor, kind="host.revoked", subject_id=host.id
        )
    leased = list(
        db_session.scalars(
            sa.select(Run)
            .where(Run.host_id == host.id, Run.state == RunState.LEASED)
            .with_for_update()
        )
    )
    analyze = []
    for run in leased:
        if run_service.lose_attempt(
            db_session=db_session, settings=settings, run=run, why="host revoked by the admin"
        ):
            analyze.append(run.job_id)
    if any(run.state == RunState.QUEUED for run in leased):
        announce_work(db_session)  # waiting hosts may take it at once
    db_session.commit()
    for job_id in analyze:
        dispatch.send_task("analyze_job", job_id)
    log.info("host revoked", extra={"host_id": host.id, "host_name": host.name})
    return host, [run.id for run in leased]


def store_calibration(*, db_session: Session, host: Host, calibration: HostCalibration) -> None:
    """Keep the host's latest calibration (it replaces any earlier one)."""
    host.calibration = calibration.to_json_dict()
    db_session.commit()


def calibration_lines(host: Host) -> list[str]:
    """The host page's lines for its calibration; empty when it never reported one."""
    if not host.calibration:
        return []
    try:
        return HostCalibration.model_validate(host.calibration).lines()
    except ValueError:
        log.warning("host %s: stored calibration no longer parses", host.name)
        return []


def host_health(host: Host, *, settings: Settings) -> str:
    """ready, busy or lost as last recorded; offline when not heard from for 2 lease lives."""
    silent_after = timedelta(seconds=2 * settings.lease_ttl_s)
    if host.revoked_at is not None:
        return "revoked"
    if host.last_heartbeat_at is None or utcnow() - host.last_heartbeat_at > silent_after:
        return "offline"
    return host.health


def list_hosts(*, db_session: Session, include_revoked: bool = False) -> list[Host]:
    query = sa.select(Host).order_by(Host.name)
    if not include_revoked:
        query = query.where(Host.revoked_at.is_(None))
    return list(db_session.scalars(query))


def _host_views_query(repositories: bool) -> sa.Select[Any]:
    return (
        sa.select(
            Host.name,
            Host.labels,
            Host.fingerprint["backend"].as_string(),
            Host.fingerprint["os"].as_string(),
            Host.repositories if repositories else sa.null(),
            Host.models,
        )
        .where(Host.revoked_at.is_(None))
        .order_by(Host.name)
    )


_HOST_VIEWS = {repositories: _host_views_query(repositories) for repositories in (False, True)}


def host_views_program(repositories: bool = True) -> Program[list[HostView]]:
    """The hosts not revoked, by name, as the columns job matching reads: a Core query, no
    ORM objects (a submission checks its spec against every host; 50 Host objects with their
    calibrations were a third of a submission's CPU). Of the fingerprint only what
    auto_labels reads; the repository offers only with `repositories` (a job that names a
    repository)."""
    rows = (yield Execute(_HOST_VIEWS[repositories])).all()
    return [
        HostView(
            name=name,
            labels=labels,
            fingerprint={key: value for key, value in (("backend", backend), ("os", os_name))},
            repositories=offers or {},
            models=models,
        )
        for name, labels, backend, os_name, offers, models in rows
    ]


@dataclass(frozen=True)
class Refusal:
    """Why one host cannot run a job, and the job spec field (a JobSpec path) it is about.

    `depth` counts the checks the host passed first: the deepest refusal among hosts is the
    one a submitter should act on (a host that drives the repository with another adapter
    says more than one that does not allow the repository at all).
    """

    field: str
    reason: str
    depth: int


def why_host_cannot_run(host: HostTraits, spec: JobSpec) -> Refusal | None:
    """None when the host satisfies the job's labels, repository, adapter, recipes, options
    and model; otherwise the first thing it lacks."""
    missing = sorted(set(spec.host_labels) - effective_labels(host))
    if missing:
        return Refusal("host_labels", f"lacks labels {', '.join(missing)}", 0)
    if spec.repository is not None:
        offer = repository_offers(host).get(spec.repository)
        if offer is None:
            return Refusal("repository", f"does not allow repository {spec.repository!r}", 1)
        refusal = _why_offer_cannot_run(offer, spec)
        if refusal is not None:
            return refusal
    if spec.model not in host.models:
        # A preset is one of the host's models only where its worker.toml allows it
        # (allow_presets): a submitter must not make a host write a 61 GB checkpoint.
        return Refusal("model", f"has no model {spec.model!r}", 5)
    if spec.corpus != BUILTIN_CORPUS and f"corpus:{spec.corpus}" not in effective_labels(host):
        # the worker labels itself `corpus:NAME` for each corpus of its worker.toml
        return Refusal("corpus", f"has no corpus {spec.corpus!r}", 5)
    return None


def _why_offer_cannot_run(offer: RepositoryOffer, spec: JobSpec) -> Refusal | None:
    name = spec.repository
    if offer.adapter != spec.adapter:
        return Refusal(
            "adapter", f"drives {name} with the {offer.adapter} adapter, not {spec.adapter}", 2
        )
    for index, variant in enumerate(spec.variants):
        if variant.recipe is not None and variant.recipe not in offer.recipes:
            return Refusal(
                f"variants.{index}.recipe", f"defines no recipe {variant.recipe} for {name}", 3
            )
    if offer.adapter != "openai-server":
        return None  # mlx-lm flags are the engine's own, judged on the host (engine/flags.py)
    # A server's variant flags are the options its host declared, with values within bounds.
    for index, variant in enumerate(spec.variants):
        for option, value in variant.flags.items():
            problem = _option_problem(offer, name, option, value)
            if problem:
                return Refusal(f"variants.{index}.flags", problem, 4)
    for feature in spec.features:
        option, value = parse_feature(feature)
        problem = _option_problem(offer, name, option, value)
        if problem:
            return Refusal("features", problem, 4)
    return None


def _option_problem(
    offer: RepositoryOffer, repository: str | None, option: str, value: Any
) -> str | None:
    declaration = offer.options.get(option)
    if declaration is None:
        declared = ", ".join(f"{n} ({d.describe()})" for n, d in sorted(offer.options.items()))
        return f"declares no option {option} for {repository} (options: {declared or 'none'})"
    why = declaration.why_not(value)
    return None if why is None else f"refuses {option}={value}: {why}"


def describe_allow_lists(hosts: Sequence[HostTraits]) -> str:
    """`studio-1: mlx-lm (recipes editable), box: none` for error messages."""
    parts = []
    for host in hosts:
        allowed = [
            f"{name} (recipes {', '.join(offer.recipes) or 'none'})"
            for name, offer in repository_offers(host).items()
        ]
        parts.append(f"{host.name}: {', '.join(allowed) or 'none'}")
    return "; ".join(parts) or "no host is registered"


def adapters_by_repository(hosts: Iterable[Host]) -> dict[str, list[str]]:
    """repository -> every adapter some host drives it with (what the form offers)."""
    adapters: dict[str, set[str]] = {}
    for host in hosts:
        for name, offer in repository_offers(host).items():
            adapters.setdefault(name, set()).add(offer.adapter)
    return {name: sorted(found) for name, found in sorted(adapters.items())}


def current_runs(*, db_session: Session) -> dict[str, Run]:
    """host id -> the run it holds a lease on now (one run per host at a time)."""
    leased = db_session.scalars(
        sa.select(Run)
        .where(Run.state == RunState.LEASED, Run.host_id.is_not(None))
        .order_by(Run.leased_at)
    )
    return {run.host_id: run for run in leased if run.host_id is not None}
