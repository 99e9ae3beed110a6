"""Bisection steps: the decision rules and the section the last step's evidence carries."""

from __future__ import annotations

import pytest

from coldbench.evidence.analysis.bisect import bisect_sentences, decide_step, next_line, step_spec
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.contract.summary_schema import StepResult
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html
from coldbench.evidence.spec.resolution import resolution_problem
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
        # mid changed the other way (read so for identical code on a noisy host): not slower
        (_r(1.044, 1.672), _r(0.852, 0.965), True, "upper"),
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


def _spec(names: list[str], steps: list[dict], line: list[str] | None = None) -> JobSpec:
    """A step over `line` (by default the variants' own commits, one letter each)."""
    commits = [n[-1] * 40 for n in names]
    return JobSpec.model_validate(
        {
            "mode": "bisect",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": c} for n, c in zip(names, commits, strict=True)],
            "contexts": [64],
            "rounds": 8,
            "bisect": {
                "good": "v1",
                "bad": "main",
                "direction": "slower",
                "steps": steps,
                "line": line or commits,
            },
        }
    )


def _submitted(**bisect: object) -> JobSpec:
    """A bisection as the service receives it: one variant without a ref, good..bad."""
    return JobSpec.model_validate(
        {
            "mode": "bisect",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": "wide", "flags": {"prefill_step_size": 64}}],
            "contexts": [64],
            "rounds": 6,
            "bisect": {"good": "v1", "bad": "main", "direction": "slower", **bisect},
        }
    )


def test_the_halving_rule_walks_a_line_to_its_first_changed_commit() -> None:
    """The one rule both the local runner and the service follow: step commits, next line."""
    line = [c * 40 for c in "abcdef"]  # a good ... f bad; the change is at d
    submitted = _submitted()
    assert submitted.needs_host_resolution
    spec = step_spec(submitted, line, [])
    assert not spec.needs_host_resolution
    assert [v.ref for v in spec.variants] == ["a" * 40, "c" * 40, "f" * 40]
    assert [v.name for v in spec.variants] == ["lo-aaaaaaaaaa", "mid-cccccccccc", "hi-ffffffffff"]
    assert all(v.flags == {"prefill_step_size": 64} for v in spec.variants)
    assert spec.baseline == "lo-aaaaaaaaaa"
    assert resolution_problem(submitted, spec) is None
    walked = []
    decisions = {"c": "upper", "e": "lower", "d": "lower"}  # mid like lo, like hi, like hi
    while line is not None:
        lo, mid, hi = step_spec(submitted, line, []).bisect.step_commits()  # type: ignore[union-attr]
        walked.append((lo[0], mid and mid[0], hi[0]))
        line = next_line(line, decisions[mid[0]] if mid else "found")
    assert walked == [("a", "c", "f"), ("c", "d", "f"), ("c", None, "d")]
    assert next_line(["a" * 40, "b" * 40, "c" * 40], "not a single step") is None


def test_a_host_resolution_may_choose_commits_and_nothing_else() -> None:
    submitted = _submitted()
    line = [c * 40 for c in "abc"]
    honest = step_spec(submitted, line, [])
    assert resolution_problem(submitted, honest) is None
    other_flags = honest.model_copy(
        update={"variants": [v.model_copy(update={"flags": {}}) for v in honest.variants]}
    )
    assert "more than its commits" in (resolution_problem(submitted, other_flags) or "")
    more_rounds = honest.model_copy(update={"rounds": 60})
    assert "more than its commits" in (resolution_problem(submitted, more_rounds) or "")
    assert "did not resolve" in (resolution_problem(submitted, submitted) or "")
    named = _spec(["lo-a", "hi-b"], [])
    assert resolution_problem(named, named) is None
    assert resolution_problem(named, honest) == "the spec the host ran is not the job's"


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
    with pytest.raises(ValueError, match="lo, mid, hi of its line"):
        _spec(["lo-a", "hi-c"], [], line=[c * 40 for c in "abc"])  # no mid
    with pytest.raises(ValueError, match="one variant without a ref"):
        JobSpec.model_validate(
            {**_spec(["lo-a", "hi-b"], []).model_dump(), "bisect": _submitted().bisect}
        )
    # A ref is never an option for git: refused before it reaches a host.
    with pytest.raises(ValueError, match="not a plain branch"):
        _submitted(good="--upload-pack=touch /tmp/x")
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


def _summarized(names: list[str], effects: dict[str, float], rounds: int = 8):
    spec = _spec(names, [])
    records = simulate_run(effects=effects, contexts=(64,), rounds=rounds, seed=3)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": n, "commit": n[-1] * 40}) for n in names
    ]
    return summarize(records, spec=spec, provenances=[measured], n_resamples=300)


def test_a_mid_like_hi_next_to_lo_is_the_first_bad_commit_without_measuring_it_again() -> None:
    # lo a, mid b, hi c: b is slower like c and is a's child, and this step measured b / a
    summary = _summarized(["lo-a", "mid-b", "hi-c"], {"lo-a": 1.0, "mid-b": 0.9, "hi-c": 0.9})
    bisect = summary.bisect
    assert (bisect.decision, bisect.final) == ("found", True)
    assert bisect.first_bad_commit == "b" * 40 and bisect.parent == "a" * 40
    assert bisect.ratio == bisect.mid_result and bisect.ratio.ci_high < 1
    assert next_line(["a" * 40, "b" * 40, "c" * 40], bisect.decision) is None
    # a longer line still halves: a mid further from lo is not its child
    longer = _spec(["lo-a", "mid-c", "hi-f"], [], line=[c * 40 for c in "abcdef"])
    records = simulate_run(
        effects={"lo-a": 1.0, "mid-c": 0.9, "hi-f": 0.9}, contexts=(64,), rounds=8, seed=3
    )
    assert summarize(records, spec=longer, n_resamples=300).bisect.decision == "lower"


def test_no_decision_rests_on_an_interval_of_too_few_pairs() -> None:
    few = StepResult(ratio_median=0.9, ci_low=None, ci_high=None, verdict="inconclusive", n=2)
    decision, why = decide_step(None, few, "slower", False)
    assert decision == "too few pairs"
    assert why.startswith("hi has 2 pairs, too few independent units for an interval (3 ")
    assert decide_step(few, _r(0.91, 0.95), "slower", True)[0] == "too few pairs"
    # 2 rounds: a 10% slowdown has no interval at all, so no first bad commit
    summary = _summarized(["lo-b", "hi-c"], {"lo-b": 1.0, "hi-c": 0.9}, rounds=2)
    bisect = summary.bisect
    assert bisect.hi_result.ci_high is None and bisect.hi_result.n == 2
    assert (bisect.decision, bisect.final, bisect.first_bad_commit) == ("too few pairs", True, None)
    (sentence,) = bisect_sentences(bisect)
    assert sentence.startswith("Bisection stopped at step 1 at 64 tokens: hi has 2 pairs, too few")
    # 4 rounds are enough for the t interval: the 10% slowdown is found
    found = _summarized(["lo-b", "hi-c"], {"lo-b": 1.0, "hi-c": 0.9}, rounds=4).bisect
    assert found.hi_result.ci_high < 1 and found.decision == "found"
