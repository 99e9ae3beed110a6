"""Row and payload builders for API tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from coldbench.api.auth import service as auth_service
from coldbench.api.hosts import service as host_service
from coldbench.api.hosts.models import Host
from coldbench.api.jobs import service as job_service
from coldbench.api.jobs.models import Job
from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import canonical_json, sha256_hex
from coldbench.evidence.contract.protocol import RepositoryOffer


def fingerprint(**overrides: Any) -> dict[str, Any]:
    return {"hostname": "box", "backend": "cpu", "os": "Linux 6.1", "cores": 2, **overrides}


def make_host(
    db_session: Session,
    name: str = "studio-1",
    *,
    labels: list[str] | None = None,
    enrolled_labels: list[str] | None = None,
    repositories: dict[str, Any] | None = None,
    models: list[str] | None = None,
) -> tuple[Host, str]:
    """A registered host and its secret (through the real enrollment path).

    `repositories` as an agent sends them: {"mlx-lm": {"recipes": ["editable"]}}, optionally
    with "adapter" and "options".
    """
    token = auth_service.create_enrollment_token(db_session=db_session, labels=enrolled_labels)
    return host_service.register_host(
        db_session=db_session,
        enrollment_token=token,
        name=name,
        fingerprint=fingerprint(hostname=name),
        labels=labels or [],
        repositories={
            name: RepositoryOffer.model_validate(offer)
            for name, offer in (repositories or {}).items()
        },
        models=["preset:tiny"] if models is None else models,
    )


def make_api_key(db_session: Session, name: str = "maintainer") -> str:
    return auth_service.create_api_key(db_session=db_session, name=name)


def job_payload(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "schema": "coldbench.job/1",
        "mode": "ab",
        "variants": [
            {"name": "base", "flags": {}},
            {"name": "cand", "flags": {"clear_cache": False}},
        ],
        "contexts": [64, 128],
        "rounds": 2,
        "decode_tokens": 2,
        "model": "preset:tiny",
    }
    payload.update(overrides)
    return payload


def make_job(db_session: Session, settings: Settings, **overrides: Any) -> Job:
    return job_service.create_job(
        db_session=db_session, settings=settings, payload=job_payload(**overrides)
    )


def record(
    run_id: str,
    variant: str,
    round_: int,
    context_tokens: int,
    *,
    order: int = 0,
    prefill_tps: float = 1000.0,
    status: str = "ok",
) -> dict[str, Any]:
    now = datetime(2026, 11, 29, 9, 0, tzinfo=UTC).isoformat()
    return {
        "schema": "coldbench.record/1",
        "run_id": run_id,
        "variant": variant,
        "round": round_,
        "order": order,
        "context_tokens": context_tokens,
        "prompt_tokens": context_tokens,
        "prompt_sha256": sha256_hex(f"{round_}-{context_tokens}".encode()),
        "cached_tokens": 0,
        "prefill_s": context_tokens / prefill_tps,
        "prefill_tps": prefill_tps,
        "decode_tokens": 2,
        "decode_s": 0.02,
        "decode_tps": 100.0,
        "output_sha256": sha256_hex(b"out"),
        "output_head": [1, 2],
        "peak_memory_bytes": 1 << 20,
        "counters": {"chunks": 1},
        "started_at": now,
        "ended_at": now,
        "status": status,
        "reason": None if status == "ok" else f"{status} cell",
    }


def records_jsonl(
    run_id: str,
    *,
    variants: tuple[str, ...] = ("base", "cand"),
    contexts: tuple[int, ...] = (64, 128),
    rounds: int = 2,
) -> bytes:
    """A plausible records.jsonl: one warm-up per variant, then every cell of every round."""
    lines = [record(run_id, v, -1, 16, order=-1, status="warmup") for v in variants]
    order = 0
    for round_ in range(rounds):
        for context in contexts:
            for index, variant in enumerate(variants):
                tps = 1000.0 * (1.1 if index else 1.0) + round_
                lines.append(record(run_id, variant, round_, context, order=order, prefill_tps=tps))
                order += 1
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def provenance_json(run_id: str) -> bytes:
    return canonical_json(
        {
            "schema": "coldbench.provenance/1",
            "run_id": run_id,
            "created_at": "2026-11-29T09:00:00+00:00",
            "host": {"hostname": "box", "backend": "cpu"},
            "software": {"python": "3.11"},
            "targets": [{"variant": "base"}, {"variant": "cand"}],
            "model": {"name": "preset:tiny"},
        }
    )


def manifest_for(files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "format": "coldbench.evidence/1",
        "files": {n: {"sha256": sha256_hex(b), "bytes": len(b)} for n, b in files.items()},
        "provenance": {},
    }
