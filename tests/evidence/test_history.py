"""Mode history: each commit against one reference commit, steps where intervals part."""

from __future__ import annotations

import pytest

from coldbench.evidence.analysis.history import history_sentences
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.rendering.report import render_report_html
from tests.evidence.builders import provenance, simulate_run

# c1 and c2 harmless, c3 the planted 8% slowdown, c4 does not build, c5 harmless after it.
EFFECTS = {"ref": 1.0, "c1": 1.0, "c2": 1.0, "c3": 0.92, "c5": 0.92}
SUBJECTS = {"c1": "docs", "c2": "tidy", "c3": "add work per prefill chunk", "c5": "tests"}


def _sha(name: str) -> str:
    return (name.encode().hex() * 20)[:40]


@pytest.fixture(scope="module")
def history_job():
    names = ["ref", "c1", "c2", "c3", "c4", "c5"]
    spec = JobSpec.model_validate(
        {
            "mode": "history",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": _sha(n)} for n in names],
            "contexts": [64, 256],
            "rounds": 8,
            "history": {"range": "v1..main"},
        }
    )
    records = simulate_run(effects=EFFECTS, rounds=8, noise=0.01, seed=5)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(
            update={
                "variant": n,
                "commit": _sha(n),
                "ref": _sha(n),
                "subject": SUBJECTS.get(n),
                "skipped": "did not build: exit status 1" if n == "c4" else None,
            }
        )
        for n in names
    ]
    summary = summarize(records, spec=spec, provenances=[measured], n_resamples=300)
    return summary, records, measured


def test_each_commit_is_a_ratio_to_the_reference_and_the_step_is_found(history_job) -> None:
    summary, _records, _provenance = history_job
    history = summary.history
    assert history.range == "v1..main"
    assert history.reference.commit == _sha("ref")
    assert [c.variant for c in history.commits] == ["c1", "c2", "c3", "c4", "c5"]
    assert history.commits[3].skipped.startswith("did not build")
    for series in history.series:
        points = {p.variant: p for p in series.points}
        assert 0.98 < points["c1"].ratio_median < 1.02
        assert 0.90 < points["c3"].ratio_median < 0.94
        assert points["c4"].n == 0 and points["c4"].ratio_median is None
    # One step per context, at c3 (after c2), and none across the skipped c4.
    steps = history.steps
    assert [(s.context_tokens, s.from_variant, s.to_variant) for s in steps] == [
        (64, "c2", "c3"),
        (256, "c2", "c3"),
    ]
    assert all(s.direction == "slower" and s.to_commit == _sha("c3") for s in steps)
    assert steps[0].subject == "add work per prefill chunk"


def test_the_answer_names_the_step_and_the_skipped_commit(history_job) -> None:
    summary, _records, _provenance = history_job
    sentences = history_sentences(summary.history)
    assert sentences[0].startswith("64 tokens: ") and "slower at " + _sha("c3")[:10] in sentences[0]
    assert '("add work per prefill chunk")' in sentences[0]
    assert sentences[-1] == f"1 commit did not build or load and was skipped: {_sha('c4')[:10]}."


def test_the_report_draws_the_history_and_lists_its_steps(history_job) -> None:
    summary, records, measured = history_job
    html = render_report_html(summary, records, [measured], None)
    body = html[html.index("<body>") :]
    assert body.index('<section id="answer">') < body.index('<section id="history">')
    assert 'id="fig-history"' in body
    section = body[body.index('<section id="history">') :]
    section = section[: section.index("</section>")]
    assert "add work per prefill chunk" in section and "did not build" in section
    assert section.count('class="step"') == 2


def test_history_spec_rules() -> None:
    base = {"adapter": "mlx-lm", "repository": "r", "contexts": [64], "rounds": 3}
    with pytest.raises(ValueError, match="every variant is a commit"):
        JobSpec.model_validate(
            {**base, "mode": "history", "variants": [{"name": "a", "ref": "x"}, {"name": "b"}]}
        )
    with pytest.raises(ValueError, match="reference commit and at least one other"):
        JobSpec.model_validate({**base, "mode": "history", "variants": [{"name": "a", "ref": "x"}]})
    with pytest.raises(ValueError, match="not A..B"):
        JobSpec.model_validate(
            {
                **base,
                "mode": "history",
                "variants": [{"name": "a", "ref": "x"}, {"name": "b", "ref": "y"}],
                "history": {"range": "--upload-pack=x..main"},
            }
        )
    with pytest.raises(ValueError, match="history settings given for mode ab"):
        JobSpec.model_validate({**base, "variants": [{"name": "a"}], "history": {"range": "a..b"}})


def test_summary_md_opens_with_the_steps(history_job) -> None:
    from coldbench.evidence.rendering.markdown import render_summary_md

    summary, _records, measured = history_job
    text = render_summary_md(summary, [measured])
    head = text[: text.index("### Cold prefill")]
    assert head.count(" tokens: ") >= 2 and "### History against" in head
    assert "| 64 | " + _sha("c2")[:10] + " | " + _sha("c3")[:10] in head
    assert f"`{_sha('c4')[:10]}` skipped: did not build" in head


def _history(effects: dict[str, float], rounds: int = 8):
    names = list(effects)
    spec = JobSpec.model_validate(
        {
            "mode": "history",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": n, "ref": _sha(n)} for n in names],
            "contexts": [64],
            "rounds": rounds,
            "history": {"range": "v1..main", "last": len(names) - 1},
        }
    )
    records = simulate_run(effects=effects, contexts=(64,), rounds=rounds, noise=0.01, seed=5)
    measured = provenance()
    measured.targets = [
        measured.targets[0].model_copy(update={"variant": n, "commit": _sha(n), "ref": _sha(n)})
        for n in names
    ]
    return summarize(records, spec=spec, provenances=[measured], n_resamples=300).history


def test_a_change_at_the_first_commit_measured_is_a_step_after_the_reference() -> None:
    history = _history({"ref": 1.0, "c1": 0.6, "c2": 0.6, "c3": 0.6})
    (step,) = history.steps
    assert (step.from_variant, step.from_commit, step.from_ratio) == ("ref", _sha("ref"), 1.0)
    assert (step.to_variant, step.direction) == ("c1", "slower") and step.to_ratio < 0.62
    (sentence,) = history_sentences(history)
    assert sentence.startswith("64 tokens: 4") and f"slower at {_sha('c1')[:10]}" in sentence
    assert f"after {_sha('ref')[:10]}" in sentence and "1.000 to 0." in sentence


def test_a_commit_with_too_few_pairs_for_an_interval_is_no_neighbour() -> None:
    # 2 rounds: below the 3 units an interval needs
    history = _history({"ref": 1.0, "c1": 1.0, "c2": 0.6}, rounds=2)
    points = history.series[0].points
    assert [p.ci_low for p in points] == [None, None] and [p.n for p in points] == [2, 2]
    assert history.steps == []
    sentences = history_sentences(history)
    assert sentences[0].startswith("No step over 2 commits against ")
    assert sentences[1] == (
        f"2 commits had too few pairs for an interval and are no neighbour in the step rule: "
        f"{_sha('c1')[:10]}, {_sha('c2')[:10]}."
    )
