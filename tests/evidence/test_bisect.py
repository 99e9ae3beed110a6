"""Bisection steps: the decision rules and the section the last step's evidence carries."""

from __future__ import annotations

import pytest

from evidence.bisect import bisect_sentences, decide_step
from evidence.markdown import render_summary_md
from evidence.report import render_report_html
from evidence.schemas import JobSpec
from evidence.summary import summarize
from evidence.summary_schema import StepResult
from tests.evidence.builders import provenance, simulate_run


def _r(low: float, high: float) -> StepResult:
    return StepResult(
        ratio_median=(low + high) / 2, ci_low=low, ci_high=high, verdict="inconclusive", n=8
    )


@pytest.mark.parametrize(
    ("mid", "hi", "has_mid", "decision"),
    [
        (_r(0.90, 0.94), _r(0.91, 0.95), True, "lower"),  # mid is slower like hi
        (_r(0.98, 1.02), _r(0.91, 0.95), True, "upper"),  # mid is like lo
        (_r(0.95, 0.97), _r(0.90, 0.92), True, "not a single step"),  # in between
        (_r(0.93, 1.01), _r(0.91, 0.95), True, "not a single step"),  # overlaps both
        (None, _r(0.98, 1.03), False, "not a single step"),  # hi is not slower
        (None, _r(0.91, 0.95), False, "found"),
    ],
)
def test_decide_step(mid, hi, has_mid: bool, decision: str) -> None:
    assert decide_step(mid, hi, "slower", has_mid)[0] == decision


def test_faster_mirrors_slower() -> None:
    assert decide_step(_r(1.05, 1.09), _r(1.06, 1.10), "faster", True)[0] == "lower"
    assert decide_step(None, _r(0.91, 0.95), "faster", False)[0] == "not a single step"


def _spec(names: list[str], steps: list[dict]) -> JobSpec:
    return JobSpec.model_validate(
        {
            "mode": "bisect",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": n[-1] * 40} for n in names],
            "contexts": [64],
            "rounds": 8,
            "bisect": {"good": "v1", "bad": "main", "direction": "slower", "steps": steps},
        }
    )


def test_the_last_step_names_the_commit_its_parent_the_ratio_and_every_step() -> None:
    earlier = [
        {
            "lo": "a" * 40,
            "mid": "c" * 40,
            "hi": "f" * 40,
            "decision": "lower",
            "evidence_id": "1" * 24,
            "location": "../step-01/report.html",
        }
    ]
    spec = _spec(["lo-b", "hi-c"], earlier)
    records = simulate_run(effects={"lo-b": 1.0, "hi-c": 0.9}, contexts=(64,), rounds=8, seed=2)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": n, "commit": n[-1] * 40})
        for n in ("lo-b", "hi-c")
    ]
    summary = summarize(records, spec=spec, provenances=[measured], n_resamples=300)
    bisect = summary.bisect
    assert bisect.decision == "found" and bisect.final
    assert bisect.first_bad_commit == "c" * 40 and bisect.parent == "b" * 40
    assert bisect.ratio.ci_high < 1 and bisect.step == 2
    (sentence,) = bisect_sentences(bisect)
    assert sentence.startswith(f"First slower commit at 64 tokens: {'c' * 40} (")
    html = render_report_html(summary, records, [measured], None)
    assert 'href="../step-01/report.html"' in html
    assert html.index('<section id="answer">') < html.index('<section id="bisect">')
    text = render_summary_md(summary, [measured])
    assert text.index(sentence) < text.index("### Cold prefill")
    assert "`" + "1" * 24 + "` (../step-01/report.html)" in text


def test_a_step_that_is_not_the_last_says_the_search_goes_on() -> None:
    spec = _spec(["lo-a", "mid-c", "hi-f"], [])
    effects = {"lo-a": 1.0, "mid-c": 1.0, "hi-f": 0.9}
    records = simulate_run(effects=effects, contexts=(64,), rounds=8, seed=3)
    summary = summarize(records, spec=spec, n_resamples=300)
    bisect = summary.bisect
    assert bisect.decision == "upper" and not bisect.final
    assert bisect.first_bad_commit is None and bisect.reason == "bisection not finished"


def test_bisect_spec_rules() -> None:
    with pytest.raises(ValueError, match="exactly one context"):
        JobSpec.model_validate({**_spec(["lo-a", "hi-b"], []).model_dump(), "contexts": [64, 128]})
    with pytest.raises(ValueError, match="2 or 3 commits"):
        _spec(["lo-a"], [])
    with pytest.raises(ValueError, match="location"):
        _spec(
            ["lo-a", "hi-b"],
            [
                {
                    "lo": "a" * 40,
                    "hi": "b" * 40,
                    "decision": "lower",
                    "evidence_id": "1" * 24,
                    "location": "javascript:alert(1)",
                }
            ],
        )
