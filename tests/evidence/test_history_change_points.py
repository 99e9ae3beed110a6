"""A history of 14 commits with a slow drift and one step (evidence/analysis/history.py): the paired
step rule names the step and only it; the change-point library finds the drift as well, and the
drift is told apart from the step.

Per-cell noise 2% (the builders' default): each point's interval is then about +-1.3%, so
neighbours 1% apart overlap. Seeds 1, 2 and 11 were checked to give one paired step (c12) and
drift change points inside c04..c10; the test pins seed 11 (the statistics are seeded too)."""

from __future__ import annotations

import pytest

from coldbench.evidence.analysis.history import history_sentences
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html
from tests.evidence.builders import provenance, simulate_run

# Flat for three commits, then 1% slower at each of c04..c09 (a drift: every neighbouring
# pair 1% apart, inside each other's intervals), flat again, then 8% slower at c12 at once.
LEVELS = [1.0, 1.0, 1.0, 0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.94, 0.94, 0.86, 0.86, 0.86]
NAMES = ["ref", *(f"c{i:02d}" for i in range(1, len(LEVELS) + 1))]


def _sha(name: str) -> str:
    return (name.encode().hex() * 20)[:40]


def _history_spec() -> JobSpec:
    """A history of NAMES' commits at 64 tokens, 12 rounds."""
    return JobSpec.model_validate(
        {
            "mode": "history",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": _sha(n)} for n in NAMES],
            "contexts": [64],
            "rounds": 12,
            "history": {"range": "v1..main"},
        }
    )


@pytest.fixture(scope="module")
def history():
    spec = _history_spec()
    effects = {"ref": 1.0, **dict(zip(NAMES[1:], LEVELS, strict=True))}
    records = simulate_run(effects=effects, contexts=(64,), rounds=12, noise=0.02, seed=11)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": n, "commit": _sha(n), "ref": _sha(n)})
        for n in NAMES
    ]
    return summarize(records, spec=spec, provenances=[measured], n_resamples=300)


def test_the_step_rule_names_the_step_and_the_library_the_drift(history) -> None:
    found = history.history
    # the paired rule: one step, at c12, none inside the drift
    assert [(s.from_variant, s.to_variant) for s in found.steps] == [("c11", "c12")]
    kinds = {(cut.variant, cut.kind) for cut in found.change_points}
    # the library cuts at the step too, and calls it one
    assert [v for v, kind in kinds if kind == "step"] == ["c12"]
    drifts = [cut for cut in found.change_points if cut.kind == "drift"]
    assert drifts, found.change_points
    for cut in drifts:  # inside the drift, a level lower than the one before
        assert cut.variant in {f"c{i:02d}" for i in range(4, 11)}
        assert cut.level_after < cut.level_before
    assert found.change_point_rule.startswith("change points: ruptures' PELT")


def test_the_answer_tells_the_drift_from_the_step(history) -> None:
    sentences = history_sentences(history.history)
    assert sentences[0].startswith("64 tokens: ") and "slower at" in sentences[0]
    assert any("a drift, not a step" in s for s in sentences[1:])
    markdown = render_summary_md(history, [])
    assert "a drift, not a step" in markdown and "| change point at |" in markdown
    html = render_report_html(history, [], [], None, plotly_js_src="plotly.js")
    assert 'id="change-points"' in html and "<td>drift</td>" in html and "<td>step</td>" in html


def test_a_flat_history_has_no_change_point() -> None:
    spec = _history_spec()
    records = simulate_run(
        effects=dict.fromkeys(NAMES, 1.0), contexts=(64,), rounds=12, noise=0.01, seed=3
    )
    found = summarize(records, spec=spec, n_resamples=300).history
    assert found.steps == [] and found.change_points == []
