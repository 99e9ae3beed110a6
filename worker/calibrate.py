"""`coldbench calibrate`: how small an effect this host resolves (evidence/calibration.py).

Runs `jobs` A/A jobs (variants a, b, c with identical flags; a and c with `variants=2`, the
cheapest calibration that says anything) and `jobs` planted jobs (c with the planted flags,
e.g. a narrower chunk width), alternating so that whatever the machine does over
the calibration touches both kinds alike, each through `worker.run.execute_run`, exactly as
`coldbench run` would (process blocks, per-context warm-up, the same statistics). Each job gets
its own seed (seed + job index), hence its own prompts and order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evidence.calibration import CalibrationJob, HostCalibration, calibrate_result, job_of
from evidence.job_options import build_job_spec
from evidence.schemas import FlagValue, HostInfo, JobSpec
from worker.run import execute_run

PLANTED_VARIANT = "c"


def calibration_spec(
    *,
    model: str,
    contexts: Sequence[int] | str,
    rounds: int | str,
    decode_tokens: int | str,
    seed: int,
    base_flags: Mapping[str, FlagValue],
    planted_flags: Mapping[str, FlagValue] | None,
    rounds_per_process: int | str | None,
    variants: int = 3,
) -> JobSpec:
    """`variants` variants (a, [b,] c); c carries the planted flags (None: an A/A job). Built
    by the one builder (evidence/job_options.py): JobOptionsError names every bad option."""
    if variants not in (2, 3):
        raise ValueError("a calibration job has 2 or 3 variants")
    names = ["a", "b"][: variants - 1]
    rows = [{"name": name, "flags": dict(base_flags)} for name in names] + [
        {"name": PLANTED_VARIANT, "flags": {**base_flags, **(planted_flags or {})}}
    ]
    return build_job_spec(
        {
            "variants": rows,
            "contexts": contexts if isinstance(contexts, str) else list(contexts),
            "rounds": rounds,
            "decode_tokens": decode_tokens,
            "model": model,
            "seed": seed,
            "rounds_per_process": rounds_per_process,
        }
    )


def run_calibration(
    *,
    model: str,
    models: Mapping[str, Path] | None,
    contexts: Sequence[int],
    rounds: int,
    jobs: int,
    planted_flags: Mapping[str, FlagValue],
    base_flags: Mapping[str, FlagValue] | None = None,
    decode_tokens: int = 2,
    seed: int = 0,
    rounds_per_process: int | None = None,
    variants: int = 3,
    state_dir: Path,
    host: HostInfo,
    labels: Sequence[str] = (),
    bundles_dir: Path | None = None,
    cell_timeout_s: float = 600.0,
    on_job: Callable[[str, int, int], None] | None = None,
    on_progress: Callable[[Any], None] | None = None,
) -> HostCalibration:
    """Every job, then the reduction. Raises `worker.run.RunRefused` for a job this host
    cannot run (unknown model, bad context); a run that fails is recorded as such."""
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    base_flags = dict(base_flags or {})
    started = datetime.now(UTC)
    stamp = f"{started:%Y%m%dT%H%M%S}"
    results: list[CalibrationJob] = []
    plan = [(kind, j) for j in range(jobs) for kind in ("aa", "planted")]
    for index, (kind, j) in enumerate(plan):
        job_seed = seed + index
        spec = calibration_spec(
            model=model,
            contexts=contexts,
            rounds=rounds,
            decode_tokens=decode_tokens,
            seed=job_seed,
            base_flags=base_flags,
            planted_flags=planted_flags if kind == "planted" else None,
            rounds_per_process=rounds_per_process,
            variants=variants,
        )
        if on_job is not None:
            on_job(kind, index + 1, len(plan))
        run_id = f"calibrate-{stamp}-{kind}-{j + 1}"
        outcome = execute_run(
            spec,
            run_id=run_id,
            workdir=state_dir / "runs" / run_id,
            state_dir=state_dir,
            host=host,
            labels=labels,
            models=models,
            command=None,
            cell_timeout_s=cell_timeout_s,
            on_progress=on_progress,
        )
        if bundles_dir is not None:
            from evidence.bundle import write_folder

            write_folder(bundles_dir / run_id, outcome.files)
        results.append(
            job_of(
                kind="aa" if kind == "aa" else "planted",
                seed=job_seed,
                status=outcome.status,
                reason=outcome.reason,
                evidence_id=outcome.evidence_id,
                summary=outcome.summary,
            )
        )
    return calibrate_result(
        jobs=results,
        planted_variant=PLANTED_VARIANT,
        created_at=started,
        host=host,
        model=model,
        contexts=sorted(contexts),
        rounds=rounds,
        rounds_per_process=rounds_per_process,
        variants=variants,
        decode_tokens=decode_tokens,
        base_flags=base_flags,
        planted_flags=dict(planted_flags),
    )
