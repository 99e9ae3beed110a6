from __future__ import annotations

from coldbench.evidence.analysis.ablation import ABLATION_NOTE
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from tests.evidence.builders import simulate_run


def test_leave_one_out_ranks_what_each_feature_earns() -> None:
    spec = JobSpec.model_validate(
        {
            "mode": "ablation",
            "variants": [{"name": "cand"}],
            "features": ["compile", "prefill_step_size=4096"],
            "contexts": [256],
            "rounds": 10,
        }
    )
    records = simulate_run(
        effects={
            "none": 1.0,
            "all": 1.12,
            "all-minus-compile": 1.01,  # compile earns about 11%
            "all-minus-prefill_step_size": 1.12,  # the step size earns nothing here
        },
        contexts=(256,),
        rounds=10,
        noise=0.01,
    )
    summary = summarize(records, spec=spec, n_resamples=500, precision=0.05)
    assert summary.baseline == "none"
    assert summary.variants == [
        "none",
        "all",
        "all-minus-compile",
        "all-minus-prefill_step_size",
    ]
    ablation = summary.ablation
    assert ablation.note == ABLATION_NOTE and "not additive" in ablation.note
    by_feature = {entry.feature: entry for entry in ablation.entries}
    assert by_feature["compile"].baseline == "all-minus-compile"
    assert by_feature["compile"].verdict == "faster"
    assert 1.08 < by_feature["compile"].ratio_median < 1.14
    assert by_feature["prefill_step_size"].verdict == "no established change"
    # The main matrix compares every variant with `none`.
    assert {c.variant for c in summary.comparisons} == set(summary.variants[1:])
