"""Hosts: registration with an enrollment token, listing, and what a host can run."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.auth import service as auth_service
from api.database import utcnow
from api.errors import NotAuthenticated
from api.hosts.models import Host
from api.runs.models import Run
from api.settings import Settings
from evidence.calibration import HostCalibration
from evidence.schemas import BUILTIN_CORPUS, JobSpec

log = logging.getLogger(__name__)


def auto_labels(host: Host) -> list[str]:
    """Labels every host has without configuring them: its name, backend and OS."""
    labels = [f"host:{host.name}"]
    backend = host.fingerprint.get("backend")
    if backend:
        labels.append(f"backend:{backend}")
    os_name = str(host.fingerprint.get("os") or "").split()
    if os_name:
        labels.append(f"os:{os_name[0].lower()}")
    return labels


def effective_labels(host: Host) -> set[str]:
    return set(host.labels) | set(auto_labels(host))


def register_host(
    *,
    db_session: Session,
    enrollment_token: str,
    name: str,
    fingerprint: dict[str, Any],
    labels: list[str],
    repositories: dict[str, Any],
    models: list[str],
) -> tuple[Host, str]:
    """Spend an enrollment token on a host; returns (host, secret). The secret is shown once.

    Registering a name again (a reinstalled host) replaces its secret and configuration.
    """
    token = auth_service.claim_enrollment_token(db_session=db_session, token=enrollment_token)
    if token is None:
        raise NotAuthenticated("enrollment token unknown or already used")
    host = db_session.scalars(sa.select(Host).where(Host.name == name)).one_or_none()
    if host is None:
        host = Host(id=auth_service.new_id(), name=name)
        db_session.add(host)
        kind = "host.registered"
    else:
        kind = "host.reenrolled"
    secret, secret_sha256 = auth_service.new_worker_secret(host.id)
    host.secret_sha256 = secret_sha256
    host.fingerprint = fingerprint
    host.enrolled_labels = sorted(set(token.labels))
    host.labels = sorted(set(token.labels) | set(labels))
    host.repositories = repositories
    host.models = sorted(set(models))
    host.last_heartbeat_at = utcnow()
    host.health = "ready"
    db_session.flush()
    token.host_id = host.id
    auth_service.record_audit(
        db_session=db_session, actor=f"enrollment:{token.id}", kind=kind, subject_id=host.id
    )
    db_session.commit()
    log.info("host registered", extra={"host_id": host.id, "host_name": name})
    return host, secret


def update_host_report(
    *, db_session: Session, host: Host, fingerprint: dict[str, Any], labels: Iterable[str]
) -> None:
    """What a host says about itself on each lease request (labels never drop enrolled ones)."""
    host.fingerprint = fingerprint
    host.labels = sorted(set(host.enrolled_labels) | set(labels))
    host.last_heartbeat_at = utcnow()


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
    if host.last_heartbeat_at is None or utcnow() - host.last_heartbeat_at > silent_after:
        return "offline"
    return host.health


def list_hosts(*, db_session: Session) -> list[Host]:
    return list(db_session.scalars(sa.select(Host).order_by(Host.name)))


def why_host_cannot_run(host: Host, spec: JobSpec) -> str | None:
    """None when the host satisfies the job's labels, repository, recipes, model and corpus."""
    missing = sorted(set(spec.host_labels) - effective_labels(host))
    if missing:
        return f"lacks labels {', '.join(missing)}"
    if spec.repository is not None:
        repository = host.repositories.get(spec.repository)
        if repository is None:
            return f"does not allow repository {spec.repository!r}"
        recipes = set(repository.get("recipes", []))
        wanted = {v.recipe for v in spec.variants if v.recipe is not None}
        if wanted - recipes:
            return f"defines no recipe {', '.join(sorted(wanted - recipes))} for {spec.repository}"
    if not spec.model.startswith("preset:") and spec.model not in host.models:
        return f"has no model {spec.model!r}"
    if spec.corpus != BUILTIN_CORPUS and f"corpus:{spec.corpus}" not in effective_labels(host):
        # the worker labels itself `corpus:NAME` for each corpus of its worker.toml
        return f"has no corpus {spec.corpus!r}"
    return None


def describe_allow_lists(hosts: list[Host]) -> str:
    """`studio-1: mlx-lm (recipes editable), box: none` for error messages."""
    parts = []
    for host in hosts:
        allowed = [
            f"{name} (recipes {', '.join(entry.get('recipes', [])) or 'none'})"
            for name, entry in sorted(host.repositories.items())
        ]
        parts.append(f"{host.name}: {', '.join(allowed) or 'none'}")
    return "; ".join(parts) or "no host is registered"


def current_runs(*, db_session: Session) -> dict[str, Run]:
    """host id -> the run it holds a lease on now (one run per host at a time)."""
    leased = db_session.scalars(
        sa.select(Run)
        .where(Run.state == "leased", Run.host_id.is_not(None))
        .order_by(Run.leased_at)
    )
    return {run.host_id: run for run in leased if run.host_id is not None}
