from __future__ import annotations

from coldbench.evidence.analysis.summary import summarize
from tests.evidence.builders import provenance, simulate_run


def _two_hosts(second_effect: float):
    first = simulate_run(
        effects={"base": 1.0, "fast": 1.06}, contexts=(256,), rounds=10, run_id="r-1"
    )
    second = simulate_run(
        effects={"base": 1.0, "fast": second_effect},
        contexts=(256,),
        rounds=10,
        run_id="r-2",
        seed=5,
    )
    provenances = [provenance("r-1", "studio-1"), provenance("r-2", "studio-2")]
    return summarize(first + second, baseline="base", provenances=provenances, n_resamples=500)


def test_hosts_that_agree() -> None:
    summary = _two_hosts(1.06)
    reproductions = summary.reproductions
    (row,) = reproductions.comparisons
    assert [r.host for r in row.runs] == ["studio-1", "studio-2"]
    assert all(r.verdict == "faster" for r in row.runs)
    assert row.agree and reproductions.all_agree
    assert row.statement.startswith("hosts agree within +-")
    (difference,) = row.test.differences
    assert (difference.host, difference.reference) == ("studio-2", "studio-1")
    assert difference.ci_low < 1 < difference.ci_high
    assert summary.comparisons[0].n == 20  # pooled pairs of both runs


def test_hosts_that_measure_opposite_effects_disagree() -> None:
    reproductions = _two_hosts(0.94).reproductions
    (row,) = reproductions.comparisons
    assert [r.verdict for r in row.runs] == ["faster", "slower"]
    assert row.agree is False and not reproductions.all_agree
    assert row.statement.startswith("hosts disagree: studio-1 +")
    assert ", studio-2 -" in row.statement
    assert row.test.differences[0].ci_high < 1 and row.test.p_adjusted < 0.05
