"""Matching: whether a host may run a job, and why not (pure: no database, no session).

Submission (api/jobs/service.py: enough registered hosts can run the job) and the lease claim
(api/runs/claim.py: this host may take this run) judge with the same rule, `why_host_cannot_run`,
on the host's columns as each reads them (`HostTraits`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from coldbench.evidence.contract.protocol import RepositoryOffer
from coldbench.evidence.contract.schemas import BUILTIN_CORPUS, SERVER_ADAPTERS, JobSpec, is_label
from coldbench.evidence.contract.variant import parse_feature


class HostTraits(Protocol):
    """What matching a job to a host reads: a Host, or the lean HostView of a submission."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> list[str]: ...
    @property
    def system_labels(self) -> list[str]: ...
    @property
    def repositories(self) -> dict[str, Any]: ...
    @property
    def models(self) -> list[str]: ...


@dataclass(frozen=True)
class HostView:
    """The columns of a host that job matching reads (HostTraits), without the ORM object."""

    name: str
    labels: list[str]
    system_labels: list[str]
    repositories: dict[str, Any]
    models: list[str]
    last_heartbeat_at: datetime | None = None


@dataclass(frozen=True)
class LeasingHost:
    """A host as its lease request is judged (HostTraits, plus its id and health): read by the
    claim's Core query of the hosts' rows (api/runs/claim.py), never as an ORM object."""

    id: str
    name: str
    labels: list[str]
    system_labels: list[str]
    repositories: dict[str, Any]
    models: list[str]
    health: str


def system_labels(fingerprint: Mapping[str, Any]) -> list[str]:
    """`backend:` and `os:` labels from the fingerprint a host registers with. Kept with the
    host from then on (Host.system_labels): what it reports with each lease never changes
    them, so no host can report its way into jobs pinned to another backend or OS."""
    labels = []
    backend = fingerprint.get("backend")
    if backend:
        labels.append(f"backend:{backend}")
    os_name = str(fingerprint.get("os") or "").split()
    if os_name:
        labels.append(f"os:{os_name[0].lower()}")
    return [label for label in labels if is_label(label)]


def auto_labels(host: HostTraits) -> list[str]:
    """Labels every host has without configuring them: its name, backend and OS."""
    return [f"host:{host.name}", *host.system_labels]


def effective_labels(host: HostTraits) -> set[str]:
    return set(host.labels) | set(auto_labels(host))


# Namespaces of the labels the server derives itself (auto_labels): never taken from a host,
# so no host can carry `host:<another host's name>`.
AUTOMATIC_LABEL_PREFIXES = ("host:", "backend:", "os:")


def is_automatic_label(label: str) -> bool:
    return label.startswith(AUTOMATIC_LABEL_PREFIXES)


def own_labels(labels: Iterable[str]) -> set[str]:
    return {label for label in labels if not is_automatic_label(label)}


def is_silent(last_heartbeat_at: datetime | None, *, now: datetime, lease_ttl_s: float) -> bool:
    """A host not heard from for a lease's life is offline: its agent heartbeats every 15 s,
    idle or not, so a host that stopped is not shown ready."""
    return last_heartbeat_at is None or now - last_heartbeat_at > timedelta(seconds=lease_ttl_s)


class HeardFrom(HostTraits, Protocol):
    @property
    def last_heartbeat_at(self) -> datetime | None: ...


def offline_notice(
    spec: JobSpec, hosts: Sequence[HeardFrom], *, now: datetime, lease_ttl_s: float
) -> str | None:
    """Why a job that registered hosts can run will wait: every host able to run it is
    offline (None when one of them is online, or none can run it at all)."""
    able = []
    for host in hosts:
        if why_host_cannot_run(host, spec) is None:
            if not is_silent(host.last_heartbeat_at, now=now, lease_ttl_s=lease_ttl_s):
                # One online host that can run it is the answer: the others need not be
                # judged (a submission judges every registered host otherwise).
                return None
            able.append(host)
    if not able:
        return None

    def heard(host: HeardFrom) -> str:
        if host.last_heartbeat_at is None:
            return f"{host.name} (never heard from)"
        minutes = int((now - host.last_heartbeat_at).total_seconds() // 60)
        ago = f"{minutes} min" if minutes < 120 else f"{minutes // 60} h"
        return f"{host.name} (last heard {ago} ago)"

    return (
        f"only offline hosts can run this job: {', '.join(heard(h) for h in able)}; it waits "
        "until one of them is back (coldbench worker)"
    )


def repository_offers(host: HostTraits) -> dict[str, RepositoryOffer]:
    """What the host registered per repository (rows from before adapters were reported were
    given the mlx-lm adapter by the migration `repository_offers`)."""
    return {name: RepositoryOffer.model_validate(raw) for name, raw in host.repositories.items()}


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
    if offer.adapter not in SERVER_ADAPTERS:
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


def adapters_by_repository(hosts: Iterable[HostTraits]) -> dict[str, list[str]]:
    """repository -> every adapter some host drives it with (what the form offers)."""
    adapters: dict[str, set[str]] = {}
    for host in hosts:
        for name, offer in repository_offers(host).items():
            adapters.setdefault(name, set()).add(offer.adapter)
    return {name: sorted(found) for name, found in sorted(adapters.items())}
