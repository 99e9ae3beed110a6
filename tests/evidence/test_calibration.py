from __future__ import annotations

import functools

import pytest
from pydantic import ValidationError

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.calibration import (
    HostCalibration,
    calibrate_result,
    job_of,
    merge_calibrations,
)
from coldbench.evidence.contract.schemas import HostInfo
from tests.evidence.builders import START, calibration_sample, simulate_run


def _rotated(effects: dict[str, float], seed: int) -> dict:
    records = simulate_run(effects=effects, contexts=(256,), rounds=16, noise=0.01, seed=seed)
    stamped = [r.model_copy(update={"process": max(r.round, 0) // 2 + 1}) for r in records]
    return summarize(stamped, baseline="a", n_resamples=200)


def test_calibration_counts_claims_detections_and_the_resolvable_effect() -> None:
    summaries = [
        _rotated({"a": 1.0, "b": 1.0, "c": 1.0}, seed=1),
        _rotated({"a": 1.0, "b": 1.0, "c": 0.8}, seed=2),
    ]
    jobs = [
        job_of(kind=kind, seed=i, status="succeeded", reason=None, evidence_id=None, summary=s)
        for i, (kind, s) in enumerate(zip(("aa", "planted"), summaries, strict=True))
    ]
    result = calibrate_result(
        jobs=jobs,
        planted_variant="c",
        created_at=START,
        host=HostInfo(hostname="cpu-box"),
        model="preset:tiny",
        contexts=[256],
        rounds=12,
        decode_tokens=1,
        planted_flags={"prefill_step_size": 8},
    )
    assert (result.aa_jobs, result.planted_jobs) == (1, 1)
    assert result.aa_claims == 0 and result.planted_detected == 1
    assert result.planted_verdicts == {"slower": 1}
    aa_widths = [(c.ci_high - c.ci_low) / 2 for c in jobs[0].comparisons]
    assert min(aa_widths) <= result.resolvable <= max(aa_widths)
    assert result.between_process_sd == summaries[0].noise_floor.between_process_sd
    assert result.statistics["unit"].startswith("process pair")
    lines = result.lines()
    assert lines[0] == "A/A jobs with a faster/slower verdict: 0 of 1 (0%)"
    assert lines[1] == "planted effect (prefill_step_size=8) detected: 1 of 1 (slower 1)"
    assert lines[2].startswith("smallest effect this host resolves: +-")
    again = HostCalibration.model_validate(result.to_json_dict())
    assert again == result


def test_a_malformed_calibration_is_refused_naming_the_field() -> None:
    HostCalibration.model_validate(calibration_sample())
    with pytest.raises(ValidationError, match="aa_claims"):
        HostCalibration.model_validate({**calibration_sample(), "aa_claims": -1})
    with pytest.raises(ValidationError, match="extra"):
        HostCalibration.model_validate({**calibration_sample(), "command": "rm -rf /"})


def test_calibrations_run_side_by_side_merge_into_one() -> None:
    one = HostCalibration.model_validate(calibration_sample())
    other_jobs = [job.model_copy(update={"seed": job.seed + 100}) for job in one.jobs]
    two = one.model_copy(update={"jobs": other_jobs})
    merged = merge_calibrations([one, two])
    assert (merged.aa_jobs, merged.planted_jobs) == (2, 2)
    assert merged.planted_detected == 2 and merged.aa_claims == 0
    assert merged.resolvable == pytest.approx(0.008)
    with pytest.raises(ValueError, match="share job seeds"):
        merge_calibrations([one, one])
    with pytest.raises(ValueError, match="different rounds"):
        merge_calibrations([one, two.model_copy(update={"rounds": 12})])


def test_a_run_in_turns_is_priced_a_load_per_variant_per_block_above_side_by_side() -> None:
    """Side by side a block's processes load together (one load); in turns each variant's turn
    is a start of its own. The same run is priced above side by side by (variants - 1) loads a
    block, and its blocks come out no shorter (the start they amortise costs more)."""
    from coldbench.evidence.contract.calibration import (
        VarianceSums,
        block_length,
        noise_of,
        run_cost_s,
    )

    sums = VarianceSums(ss_between=0.0009, df_between=9, ss_within=0.011, df_within=110, m0=12.0)
    noise = noise_of(sums, load_s=8.0, cell_s_per_token=0.75 / 16384, contexts=[16384])
    assert noise is not None
    shape = functools.partial(run_cost_s, contexts=[16384], variants=2, noise=noise)
    length = functools.partial(block_length, contexts=[16384], variants=2, noise=noise)
    side, turns = shape(24, 4), shape(24, 4, in_turns=True)
    # 6 blocks of 4 rounds: a load of 8 s more per block for the second variant's turn
    assert turns - side == pytest.approx(6 * 8.0)
    # the cells and warm-ups are the same either way: 24 rounds x 2 cells + 6 x 2 warm-ups
    assert side == pytest.approx(6 * (8.0 + 2 * 0.75) + 24 * 2 * 0.75)
    (length_side, _), (length_turns, why) = length(48), length(48, in_turns=True)
    assert length_turns >= length_side and "(2 turn starts)" in why
    assert shape(0, 4, in_turns=True) == 0.0
