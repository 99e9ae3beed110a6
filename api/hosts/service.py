"""Hosts: registration with an enrollment token, listing, and what a host can run."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
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
from evidence.protocol import RepositoryOffer, RunState
from evidence.schemas import JobSpec
from evidence.variant import parse_feature

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
    repositories: dict[str, RepositoryOffer],
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
    host.repositories = _stored_offers(repositories)
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
    *,
    db_session: Session,
    host: Host,
    fingerprint: dict[str, Any],
    labels: Iterable[str],
    repositories: dict[str, RepositoryOffer] | None = None,
    models: Iterable[str] | None = None,
) -> None:
    """What a host says about itself on each lease request (labels never drop enrolled ones).

    Repositories and models are replaced when the agent sends them, so an edited worker.toml
    is seen at the next lease instead of at the next enrollment.
    """
    host.fingerprint = fingerprint
    host.labels = sorted(set(host.enrolled_labels) | set(labels))
    if repositories is not None:
        host.repositories = _stored_offers(repositories)
    if models is not None:
        host.models = sorted(set(models))
    host.last_heartbeat_at = utcnow()


def _stored_offers(repositories: dict[str, RepositoryOffer]) -> dict[str, Any]:
    return {name: offer.model_dump(mode="json") for name, offer in sorted(repositories.items())}


def repository_offers(host: Host) -> dict[str, RepositoryOffer]:
    """What the host registered per repository (rows from before adapters were reported were
    given the mlx-lm adapter by the migration `repository_offers`)."""
    return {name: RepositoryOffer.model_validate(raw) for name, raw in host.repositories.items()}


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


def why_host_cannot_run(host: Host, spec: JobSpec) -> Refusal | None:
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
    if not spec.model.startswith("preset:") and spec.model not in host.models:
        return Refusal("model", f"has no model {spec.model!r}", 5)
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


def describe_allow_lists(hosts: list[Host]) -> str:
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
