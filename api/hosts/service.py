"""Hosts: registration with an enrollment token, the admin's labels, listing and health.

Whether a host may run a job is `api/hosts/matching.py` (pure); revoking a host requeues its
run, so it lives with lease expiry (api/runs/expiry.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.database import utcnow
from coldbench.api.errors import Conflict, Invalid, NotAuthenticated, NotFound
from coldbench.api.hosts import matching
from coldbench.api.hosts.matching import HostView, is_automatic_label
from coldbench.api.hosts.models import Host
from coldbench.api.runs.models import Run
from coldbench.api.settings import Settings
from coldbench.api.transactions import Execute, Program
from coldbench.evidence.contract.calibration import HostCalibration
from coldbench.evidence.contract.protocol import RepositoryOffer, RunState

log = logging.getLogger(__name__)


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
    host.system_labels = matching.system_labels(fingerprint)
    host.enrolled_labels = sorted(matching.own_labels(token.labels))
    host.host_labels = sorted(matching.own_labels(labels))
    host.labels = sorted(set(host.enrolled_labels) | set(host.host_labels))
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


def find_host(*, db_session: Session, name_or_id: str) -> Host:
    """The host not revoked with this name, else the host with this id; NotFound otherwise."""
    host = active_host_named(db_session=db_session, name=name_or_id) or db_session.get(
        Host, name_or_id
    )
    if host is None:
        raise NotFound(f"no host named {name_or_id!r}")
    return host


def set_labels(*, db_session: Session, name_or_id: str, labels: Iterable[str], actor: str) -> Host:
    """Replace the admin's labels of a host (the admin's command); the labels the host
    derives itself (`host_labels`: its corpora, chip, memory) and the automatic ones are
    kept, so a host's `corpus:NAME` outlives the admin's change. Automatic namespaces are
    refused."""
    wanted = sorted(set(labels))
    reserved = [label for label in wanted if is_automatic_label(label)]
    if reserved:
        raise Invalid(f"labels {', '.join(reserved)}: host:, backend: and os: labels are automatic")
    host = find_host(db_session=db_session, name_or_id=name_or_id)
    if host.revoked_at is not None:
        raise Conflict(f"host {host.name} ({host.id}) is revoked")
    before = host.enrolled_labels
    host.enrolled_labels = wanted
    host.labels = sorted(set(wanted) | set(host.host_labels))
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
    """ready, busy or lost as last recorded; offline when silent (matching.is_silent)."""
    if host.revoked_at is not None:
        return "revoked"
    if matching.is_silent(host.last_heartbeat_at, now=utcnow(), lease_ttl_s=settings.lease_ttl_s):
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
            Host.system_labels,
            Host.repositories if repositories else sa.null(),
            Host.models,
            Host.last_heartbeat_at,
        )
        .where(Host.revoked_at.is_(None))
        .order_by(Host.name)
    )


_HOST_VIEWS = {repositories: _host_views_query(repositories) for repositories in (False, True)}


def host_views_program(repositories: bool = True) -> Program[list[HostView]]:
    """The hosts not revoked, by name, as the columns job matching reads: a Core query, no
    ORM objects (a submission checks its spec against every host; 50 Host objects with their
    calibrations were a third of a submission's CPU). Never the fingerprint: what one host
    reported is no part of another's submission. The repository offers only with
    `repositories` (a job that names a repository)."""
    rows = (yield Execute(_HOST_VIEWS[repositories])).all()
    return [
        HostView(
            name=name,
            labels=labels,
            system_labels=system,
            repositories=offers or {},
            models=models,
            last_heartbeat_at=heard,
        )
        for name, labels, system, offers, models, heard in rows
    ]


def current_runs(*, db_session: Session) -> dict[str, Run]:
    """host id -> the run it holds a lease on now (one run per host at a time)."""
    leased = db_session.scalars(
        sa.select(Run)
        .where(Run.state == RunState.LEASED, Run.host_id.is_not(None))
        .order_by(Run.leased_at)
    )
    return {run.host_id: run for run in leased if run.host_id is not None}
