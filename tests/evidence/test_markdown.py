from __future__ import annotations

import os
from pathlib import Path

from coldbench.evidence.analysis.stats import StatsOptions
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.contract.summary_schema import Comparison, Settings, Summary
from coldbench.evidence.rendering.markdown import MAX_CHARS, _render, render_summary_md
from tests.evidence.builders import provenance, record, simulate_run

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("COLDBENCH_UPDATE_GOLDEN") == "1"


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with COLDBENCH_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(encoding="utf-8")


def ab_summary() -> tuple[Summary, list]:
    """A fixed, seeded A/B job on two hosts with invalid cells and one parity divergence."""
    first = simulate_run(
        effects={"base": 1.0, "fast": 1.06, "same": 1.0}, rounds=8, seed=11, run_id="r-1"
    )
    second = simulate_run(
        effects={"base": 1.0, "fast": 1.05, "same": 1.0}, rounds=8, seed=12, run_id="r-2"
    )
    extra = [
        record(
            variant="fast",
            round=8,
            context_tokens=256,
            prompt_tokens=256,
            status="invalid",
            reason="silent no-op: prefill_step_size",
        ),
        record(
            variant="same",
            round=8,
            context_tokens=64,
            cached_tokens=64,
            status="invalid",
            reason="cached_tokens=64 (prefix cache hit)",
        ),
        record(
            variant="base",
            round=8,
            context_tokens=64,
            status="error",
            prefill_s=None,
            prefill_tps=None,
            reason="RuntimeError: out of memory | retry",
        ),
    ]
    diverged = next(r for r in first if r.variant == "same" and r.round == 3)
    diverged.output_head = [5, 6, 9, 9]
    provenances = [provenance("r-1", "studio-1"), provenance("r-2", "studio-2")]
    spec = JobSpec.model_validate(
        {
            "variants": [{"name": "base"}, {"name": "fast"}, {"name": "same"}],
            "contexts": [64, 256],
            "rounds": 8,
            "seed": 3,
        }
    )
    return summarize(first + second + extra, spec=spec, provenances=provenances), provenances


def test_summary_md_golden_ab() -> None:
    summary, provenances = ab_summary()
    text = render_summary_md(summary, provenances)
    _check_golden("summary_ab.md", text)
    assert len(text) < MAX_CHARS
    assert "| 256 | fast |" in text and "faster" in text
    assert "RuntimeError: out of memory \\| retry" in text
    assert "### Reproductions" in text


def test_summary_md_golden_ablation() -> None:
    spec = JobSpec.model_validate(
        {
            "mode": "ablation",
            "variants": [{"name": "cand"}],
            "contexts": [256],
            "rounds": 8,
            "features": ["compile", "clear_cache=false"],
        }
    )
    records = simulate_run(
        effects={
            "none": 1.0,
            "all": 1.10,
            "all-minus-compile": 1.02,
            "all-minus-clear_cache": 1.09,
        },
        contexts=(256,),
        rounds=8,
        seed=4,
    )
    text = render_summary_md(summarize(records, spec=spec), [provenance()], evidence_id="0" * 24)
    _check_golden("summary_ablation.md", text)
    assert "Evidence id: `000000000000000000000000`" in text
    assert "### Ablation (leave one out)" in text and "not additive" in text


def test_huge_matrix_stays_under_the_limit() -> None:
    variants = {f"v{i:02d}": 1.0 + i / 1000 for i in range(26)}
    records = simulate_run(effects=variants, contexts=tuple(range(64, 64 * 17, 64)), rounds=2)
    summary = summarize(records, baseline="v00", n_resamples=50)
    assert len(summary.comparisons) == 25 * 16
    assert len(_render(summary, [provenance()], None, compact=False)) > MAX_CHARS
    text = render_summary_md(summary, [provenance()])
    assert len(text) <= MAX_CHARS
    assert "### Decode" not in text  # dropped first when too long
    assert "| 1024 | v25 |" in text and "cut at 60,000" not in text


def test_summary_json_golden_ab() -> None:
    """The summary of the fixed seeded job; numbers compared to 1e-9 relative (platforms may
    differ in the last digit of a float)."""
    import json

    from coldbench.evidence.bundles.bundle import first_difference

    summary, _ = ab_summary()
    text = json.dumps(summary.to_json_value(), indent=1, sort_keys=True) + "\n"
    path = GOLDEN / "summary_ab.json"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with COLDBENCH_UPDATE_GOLDEN=1 once"
    assert first_difference(json.loads(path.read_text()), json.loads(text)) is None
    # The golden file is itself a summary the contract accepts, and reads back to this one.
    assert first_difference(Summary.model_validate_json(path.read_text()), summary) is None


def test_drift_interval_with_one_unknown_bound_renders() -> None:
    # A run of seconds extrapolated to an hour: one bound overflows to None, the other not.
    from coldbench.evidence.rendering.report import render_report_html

    summary, provenances = ab_summary()
    first, *rest = summary.drift.runs
    runs = [first.model_copy(update={"slope_ci_high": None}), *rest]
    summary = summary.model_copy(update={"drift": summary.drift.model_copy(update={"runs": runs})})
    text = render_summary_md(summary, provenances)
    assert summary.drift.runs[0].run_id in text
    html = render_report_html(summary, [], provenances, None, plotly_js_src="/p.js")
    assert "Drift of the baseline" in html


SETTINGS = Settings.model_validate(StatsOptions(precision=0.05).settings())


def _comparison(verdict: str, median: float, low: float, high: float, **extra) -> Comparison:
    return Comparison.model_validate(
        {
            "variant": "cand",
            "baseline": "base",
            "context_tokens": 128,
            "verdict": verdict,
            "ratio_median": median,
            "ci_low": low,
            "ci_high": high,
            "n": 8,
            "p_value": None,
            "p_adjusted": None,
            "rounds_needed": None,
            "ratios": [],
            **extra,
        }
    )


def test_verdict_clause_states_the_change_and_its_interval_in_the_verdicts_direction() -> None:
    from coldbench.evidence.rendering.markdown import verdict_clause

    slower = _comparison("slower", 0.930, 0.916, 0.968)
    assert verdict_clause(slower, SETTINGS) == (
        "cand is 7.0% slower at 128 tokens, 95% interval 3.2% to 8.4%"
    )
    faster = _comparison("faster", 1.062, 1.049, 1.077)
    assert verdict_clause(faster, SETTINGS) == (
        "cand is 6.2% faster at 128 tokens, 95% interval 4.9% to 7.7%"
    )
    same = _comparison("no established change", 0.99, 0.973, 1.0002)
    assert verdict_clause(same, SETTINGS) == (
        "cand: no established change at 128 tokens (95% interval 2.7% slower to no change, "
        "inside +-5%)"
    )
    unsure = _comparison("inconclusive", 0.99, 0.9, 1.1, rounds_needed=14)
    assert verdict_clause(unsure, SETTINGS) == (
        "cand: inconclusive at 128 tokens (8 pairs; about 14 rounds would bound it within +-5%)"
    )


def test_rounds_to_detect_a_change_are_told_apart_from_rounds_for_the_precision() -> None:
    """A large change is detected long before its interval is +-precision wide: the two costs
    are stated apart, never the second as if it were the first."""
    from coldbench.evidence.rendering.markdown import fmt_verdict, verdict_clause

    large = _comparison("inconclusive", 0.43, 0.31, 0.82, rounds_needed=90, rounds_to_detect=9)
    assert verdict_clause(large, SETTINGS) == (
        "cand: inconclusive at 128 tokens (8 pairs; about 9 rounds would detect a change this "
        "size, 90 would bound it within +-5%)"
    )
    assert fmt_verdict(large) == "inconclusive (~9 rounds to detect, ~90 for the precision)"
    same = _comparison("inconclusive", 1.0, 0.9, 1.1, rounds_needed=30)
    assert fmt_verdict(same) == "inconclusive (~30 rounds for the precision)"


def test_rounds_advice_says_the_time_those_rounds_would_take_where_it_was_measured() -> None:
    """Each cost in rounds with the time a run of them would take at the job's measured cost
    (`time_to_detect_s`, `time_needed_s`), where the runs kept their timelines."""
    from coldbench.evidence.rendering.markdown import fmt_verdict, verdict_clause

    priced = _comparison(
        "inconclusive",
        0.43,
        0.31,
        0.82,
        rounds_needed=90,
        rounds_to_detect=9,
        time_needed_s=5400.0,
        time_to_detect_s=45.0,
    )
    assert verdict_clause(priced, SETTINGS) == (
        "cand: inconclusive at 128 tokens (8 pairs; about 9 rounds (~45 s) would detect a "
        "change this size, 90 (~1.5 h) would bound it within +-5%)"
    )
    assert fmt_verdict(priced) == (
        "inconclusive (~9 rounds (~45 s) to detect, ~90 (~1.5 h) for the precision)"
    )
    minutes = _comparison("inconclusive", 1.0, 0.9, 1.1, rounds_needed=30, time_needed_s=754.0)
    assert fmt_verdict(minutes) == "inconclusive (~30 rounds (~13 min) for the precision)"


def test_summary_md_opens_with_one_sentence_per_context_then_the_table() -> None:
    from coldbench.evidence.rendering.markdown import verdict_sentences

    summary, provenances = ab_summary()
    sentences = verdict_sentences(summary)
    assert len(sentences) == len(summary.contexts)
    assert sentences[0].startswith("fast is ") and "at 64 tokens" in sentences[0]
    assert "same: inconclusive at 64 tokens" in sentences[0]
    text = render_summary_md(summary, provenances)
    head = text.split("### Cold prefill")[0]
    assert all(f"- {sentence}" in head for sentence in sentences)
    assert "Host:" not in head
    assert text.index("### Cold prefill") < text.index("Host:") < text.index("How to read")


def test_each_variant_shows_the_software_its_own_process_imported() -> None:
    from coldbench.evidence.rendering.report import render_report_html

    summary, _ = ab_summary()
    targets = [
        {
            "variant": name,
            "commit": commit * 40,
            "software": {
                "mlx": "0.30.1",
                "mlx_lm": version,
                "coldbench": None,
                "files": {
                    "engine": f"/wt/{name}/engine/__init__.py",
                    "mlx": "/venv/mlx/core.cpython-311-x86_64-linux-gnu.so",
                },
            },
        }
        for name, commit, version in (("base", "a", "0.32.2"), ("fast", "b", "0.31.0"))
    ]
    prov = provenance(targets=targets)
    text = render_summary_md(summary, [prov])
    assert "| base | embedded | n/a | aaaaaaaaaaaa | defaults | mlx 0.30.1, mlx-lm 0.32.2; " in text
    assert "engine `/wt/fast/engine/__init__.py`" in text and "mlx-lm 0.31.0" in text
    # The Markdown folds the table away and leaves out compiled extensions' paths (the
    # version names the build); the report's provenance keeps them.
    assert text.index("<details><summary>Variants as built</summary>") < text.index(
        "| base | embedded |"
    )
    assert ".so" not in text
    html = render_report_html(summary, [], [prov], None)
    assert (
        "<td>mlx 0.30.1, mlx-lm 0.31.0; engine /wt/fast/engine/__init__.py, "
        "mlx /venv/mlx/core.cpython-311-x86_64-linux-gnu.so</td>"
    ) in html


def test_uncommitted_changes_of_a_source_repository_are_said_to_be_unmeasured() -> None:
    from coldbench.evidence.analysis.summary import summarize
    from coldbench.evidence.rendering.markdown import render_summary_md
    from tests.evidence.builders import provenance, simulate_run

    records = simulate_run(effects={"base": 1.0, "cand": 1.0}, rounds=6)
    summary = summarize(records, baseline="base", n_resamples=100)
    clean = provenance()
    dirty = provenance()
    dirty.targets = [
        t.model_copy(update={"repository": "/src/mlx-lm", "source_dirty": True})
        for t in dirty.targets
    ]
    note = "- Uncommitted changes in `/src/mlx-lm` were not measured: only commits are"
    assert note in render_summary_md(summary, [dirty]).splitlines()
    assert "Uncommitted changes" not in render_summary_md(summary, [clean])
