"""`coldbench calibrate`: how small an effect this host resolves (evidence/contract/calibration.py).

Runs `jobs` runs, each of identical variants a, b, c (a and c with `variants=2`) beside p, which
carries the planted flags (e.g. a narrower chunk width), through `coldbench.worker.run.execute_run`
exactly as `coldbench run` would (process blocks, per-context warm-up), each with its own seed
(seed + run index), hence its own prompts and order. Each run is then read as two jobs: the
A/A/A job (a, b, c) and the planted job (a, b, p), so N runs give N of each for the cost of N
starts. One analysis of variance of every run's paired ratios by process pair gives the host's
noise (`coldbench.evidence.contract.schemas.HostNoise`); each job's verdicts use the noise of the
other runs only, as a run on this calibrated host would (the design effect of
evidence/analysis/stats.py), so no job is judged by a bound it helped set. Without other runs (one
job) a job is judged as on an uncalibrated host.

Each run sizes itself as every run does (coldbench.engine.memory's plan): where its variants'
processes do not fit the device side by side they run in turns, one resident at a time, and
`on_phase` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from coldbench.evidence.analysis.stats import calibration_sums, cell_seconds_per_token
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.calibration import (
    CalibrationJob,
    HostCalibration,
    calibrate_result,
    job_of,
    noise_of,
)
from coldbench.evidence.contract.records import parse_records
from coldbench.evidence.contract.schemas import (
    FlagValue,
    HostInfo,
    HostNoise,
    JobSpec,
    Provenance,
    Record,
)
from coldbench.evidence.contract.timeline import TIMELINE_FILE, Timeline
from coldbench.evidence.spec.job_options import build_job_spec, resolve_job
from coldbench.worker.run import RunOutcome, execute_run

BASELINE = "a"
PLANTED_VARIANT = "p"


def identical_variants(variants: int) -> list[str]:
    if variants not in (2, 3):
        raise ValueError("a calibration job has 2 or 3 variants")
    return ["a", "b", "c"] if variants == 3 else ["a", "c"]


def calibration_spec(
    *,
    model: str,
    contexts: Sequence[int] | str,
    rounds: int | str,
    decode_tokens: int | str,
    seed: int | str | None,
    base_flags: Mapping[str, FlagValue],
    planted_flags: Mapping[str, FlagValue],
    rounds_per_process: int | str | None,
    variants: int = 3,
    residency: str | None = None,
) -> JobSpec:
    """One calibration run: `variants` identical variants and p with the planted flags, exactly
    `rounds` of them (its A/A and planted jobs are read at fixed rounds). Built by the one
    builder and resolved (evidence/spec/job_options.py): JobOptionsError names every bad
    option."""
    rows = [{"name": name, "flags": dict(base_flags)} for name in identical_variants(variants)]
    rows.append({"name": PLANTED_VARIANT, "flags": {**base_flags, **planted_flags}})
    request = build_job_spec(
        {
            "variants": rows,
            "contexts": contexts if isinstance(contexts, str) else list(contexts),
            "rounds": rounds,
            "until": "rounds",
            "decode_tokens": decode_tokens,
            "model": model,
            "seed": seed,
            "rounds_per_process": rounds_per_process,
            "residency": residency,
        }
    )
    return resolve_job(request)


@dataclass
class CalibrationRun:
    spec: JobSpec
    outcome: RunOutcome
    records: list[Record]
    provenance: Provenance | None
    timeline: Timeline | None


def _measured(spec: JobSpec, outcome: RunOutcome) -> CalibrationRun:
    records, _ = parse_records(outcome.files.get("records.jsonl", b""))
    provenance = None
    if "provenance.json" in outcome.files:
        provenance = Provenance.model_validate_json(outcome.files["provenance.json"])
    timeline = None
    if TIMELINE_FILE in outcome.files:
        timeline = Timeline.model_validate_json(outcome.files[TIMELINE_FILE])
    return CalibrationRun(spec, outcome, records, provenance, timeline)


def job_summary(run: CalibrationRun, *, kind: str, variants: int, noise: HostNoise | None) -> Any:
    """A run read as its A/A/A job or its planted job, judged with `noise` (None: as on an
    uncalibrated host); None when nothing was measured."""
    names = identical_variants(variants)
    if kind == "planted":
        names = [*names[:-1], PLANTED_VARIANT]
    if run.provenance is None or not any(r.round >= 0 for r in run.records):
        return None
    spec = JobSpec.model_validate(
        {
            **run.spec.model_dump(mode="json", by_alias=True),
            "variants": [v.model_dump(mode="json") for v in run.spec.variants if v.name in names],
        }
    )
    provenance = run.provenance.model_copy(update={"noise": noise})
    return summarize(
        [r for r in run.records if r.variant in names], spec=spec, provenances=[provenance]
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
    on_phase: Callable[[str], None] | None = None,
    residency: str | None = None,
) -> HostCalibration:
    """Every run, then the reduction (module docstring). Raises `coldbench.worker.run.RunRefused`
    for a run this host cannot do (unknown model, bad context); a run that fails is recorded."""
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    base_flags = dict(base_flags or {})
    started = datetime.now(UTC)
    stamp = f"{started:%Y%m%dT%H%M%S}"
    runs: list[CalibrationRun] = []
    for index in range(jobs):
        spec = calibration_spec(
            model=model,
            contexts=contexts,
            rounds=rounds,
            decode_tokens=decode_tokens,
            seed=seed + index,
            base_flags=base_flags,
            planted_flags=planted_flags,
            rounds_per_process=rounds_per_process,
            variants=variants,
            residency=residency,
        )
        if on_job is not None:
            on_job("run", index + 1, jobs)
        run_id = f"calibrate-{stamp}-{index + 1}"
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
            on_phase=on_phase,
        )
        if bundles_dir is not None:
            from coldbench.evidence.bundles.bundle import write_folder

            write_folder(bundles_dir / run_id, outcome.files)
        runs.append(_measured(spec, outcome))

    loads = [run.timeline.blocks[0].load_s for run in runs if run.timeline and run.timeline.blocks]
    timing = {
        "load_s": float(np.median(loads)) if loads else None,
        "cell_s_per_token": cell_seconds_per_token([run.records for run in runs]),
        "contexts": contexts,
        "model": model,
        "calibrated_at": started,
    }
    variance = calibration_sums([run.records for run in runs], baseline=BASELINE)
    results: list[CalibrationJob] = []
    for index, run in enumerate(runs):
        others = [other.records for other in runs if other is not run]
        noise = noise_of(calibration_sums(others, baseline=BASELINE), **timing) if others else None
        for kind in ("aa", "planted"):
            results.append(
                job_of(
                    kind="aa" if kind == "aa" else "planted",
                    seed=seed + index,
                    status=run.outcome.status,
                    reason=run.outcome.reason,
                    evidence_id=run.outcome.evidence_id,
                    summary=job_summary(run, kind=kind, variants=variants, noise=noise),
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
        variance=variance,
        noise=noise_of(variance, **timing),
    )
