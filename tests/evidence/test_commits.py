"""Mode commits: the spec's rules, the resolved variants, and the section of a seeded bundle."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from coldbench.evidence.analysis.commits import commits_sentences, commits_spec
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.bundles.bundle import first_difference
from coldbench.evidence.contract.schemas import JobSpec, error_field
from coldbench.evidence.contract.summary_schema import Summary
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html
from coldbench.evidence.spec.resolution import resolution_problem
from tests.evidence.builders import provenance, simulate_run

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("COLDBENCH_UPDATE_GOLDEN") == "1"

BASE, C1, C2, C3, C4 = (f"{digit}" * 40 for digit in "01234")
HEAD = C4
TREES = {C1: "a1" * 20, C2: None, C3: "a3" * 20, C4: "a4" * 20}
SUBJECTS = {
    C1: "prefill: keep the buffer cache",
    C2: "docs: notes",
    C3: "prefill: sync after each chunk",
    C4: "docs: tidy notes",
}


def submitted(**commits: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "mode": "commits",
            "adapter": "mlx-lm",
            "repository": "mlx-lm",
            "variants": [{"name": "base", "flags": {"prefill_step_size": 256}}],
            "contexts": [256],
            "rounds": 12,
            "seed": 5,
            "commits": {"base": "main", "head": "my-pr", **commits},
        }
    )


def resolved(**commits: Any) -> JobSpec:
    return commits_spec(submitted(**commits), [BASE, C1, C2, C3, C4])


def test_a_submitted_commits_job_leaves_its_commits_to_the_host() -> None:
    spec = submitted()
    assert spec.needs_host_resolution
    assert [v.name for v in spec.variants] == ["base"]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"repository": None, "adapter": "embedded"}, "repository", "needs a repository"),
        ({"commits": None}, "commits", "needs base and head"),
        ({"features": ["compile"]}, "features", "takes no ablation features"),
        (
            {
                "variants": [{"name": "a", "ref": "main"}, {"name": "b", "ref": "pr"}],
                "baseline": None,
            },
            "variants",
            "one variant without a ref",
        ),
        ({"mode": "ab"}, "commits", "commits settings given for mode ab"),
        ({"commits": {"base": "--upload-pack=x", "head": "pr"}}, "commits.base", "plain"),
        ({"commits": {"base": "a..b", "head": "pr"}}, "commits.base", "plain"),
    ],
)
def test_commits_spec_rules_name_their_field(change: dict, field: str, message: str) -> None:
    raw = submitted().model_dump(mode="json", by_alias=True) | change
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(raw)
    assert error_field(caught.value) == field
    assert message in str(caught.value)


def test_the_resolved_spec_is_base_head_and_head_without_each_commit() -> None:
    spec = resolved()
    assert [(v.name, v.ref) for v in spec.variants] == [
        (f"base-{BASE[:10]}", BASE),
        (f"head-{HEAD[:10]}", HEAD),
        *((f"minus-c{n:02d}-{c[:10]}", HEAD) for n, c in enumerate((C1, C2, C3, C4), 1)),
    ]
    assert all(v.flags == {"prefill_step_size": 256} for v in spec.variants)
    assert spec.baseline == f"base-{BASE[:10]}" and not spec.needs_host_resolution
    alone = resolved(alone=True)
    assert [(v.name, v.ref) for v in alone.variants[6:]] == [
        (f"only-c{n:02d}-{c[:10]}", BASE) for n, c in enumerate((C1, C2, C3, C4), 1)
    ]
    plans = {p.name: p for p in alone.commits.planned()}  # type: ignore[union-attr]
    assert plans[f"minus-c02-{C2[:10]}"].change == "revert"
    assert plans[f"only-c02-{C2[:10]}"].commit == C2


def test_the_server_accepts_only_the_commits_a_host_resolved() -> None:
    spec = resolved()
    assert resolution_problem(submitted(), spec) is None
    raw = spec.model_dump(mode="json", by_alias=True)
    raw["variants"][2]["flags"] = {"prefill_step_size": 4096}
    assert "more than its commits" in (
        resolution_problem(submitted(), JobSpec.model_validate(raw)) or ""
    )
    raw = spec.model_dump(mode="json", by_alias=True)
    raw["commits"]["alone"] = True
    with pytest.raises(ValidationError, match="commits mode: a line of 4 commits runs"):
        JobSpec.model_validate(raw)
    unresolved = submitted().model_dump(mode="json", by_alias=True)
    unresolved["commits"]["line"] = None
    assert "did not resolve" in (
        resolution_problem(submitted(), JobSpec.model_validate(unresolved)) or ""
    )


def test_a_line_longer_than_the_service_allows_is_refused() -> None:
    spec = submitted(max_commits=3)
    with pytest.raises(ValueError, match="holds 4 commits; at most 3"):
        commits_spec(spec, [BASE, C1, C2, C3, C4])


def _provenance(spec: JobSpec) -> Any:
    assert spec.commits is not None
    targets = []
    for plan in spec.commits.planned():
        target: dict[str, Any] = {
            "variant": plan.name,
            "adapter": "mlx-lm",
            "ref": plan.onto,
            "commit": plan.onto,
        }
        if plan.change is not None:
            assert plan.commit is not None
            tree = TREES[plan.commit]
            target["commit"] = ("f" + plan.commit[1:]) if tree else None
            target["synthesized"] = {
                "change": plan.change,
                "onto": plan.onto,
                "commit": plan.commit,
                "subject": SUBJECTS[plan.commit],
                "tree": tree,
                "conflicts": [] if tree else ["NOTES.md"],
            }
            if tree is None:
                target["skipped"] = "conflicts in NOTES.md"
        targets.append(target)
    return provenance(targets=targets, command="coldbench run --mode commits")


def commits_summary() -> tuple[Summary, Any]:
    """A fixed, seeded commits job: c1 carries the gain, c3 costs, c4 changes nothing, and c2's
    revert conflicts (never measured)."""
    spec = resolved()
    names = [v.name for v in spec.variants]
    effects = {
        names[0]: 1.0,  # base
        names[1]: 1.10,  # head
        names[2]: 1.0,  # head without c1: c1 carries the gain
        names[4]: 1.14,  # head without c3: c3 costs
        names[5]: 1.10,  # head without c4: nothing
    }
    records = simulate_run(effects=effects, contexts=(256,), rounds=12, seed=21, noise=0.01)
    prov = _provenance(spec)
    return summarize(records, spec=spec, provenances=[prov]), prov


def test_the_section_ranks_the_commits_as_planted() -> None:
    summary, _ = commits_summary()
    commits = summary.commits
    assert commits is not None and summary.mode == "commits"
    assert [e.position for e in commits.commits] == [1, 2, 3, 4]
    conflicting = commits.commits[1]
    assert conflicting.not_separable == "conflicts in NOTES.md"
    assert conflicting.tree is not None and conflicting.tree.conflicts == ["NOTES.md"]
    assert conflicting.subject == "docs: notes"
    verdicts = {m.position: m.verdict for m in commits.marginals}
    assert verdicts == {1: "faster", 3: "slower", 4: "no established change"}
    assert all(m.variant == f"head-{HEAD[:10]}" for m in commits.marginals)
    assert all(m.p_adjusted is not None for m in commits.marginals)
    (total,) = commits.total
    assert total.verdict == "faster" and total.ci_low is not None and total.ci_low > 1.05
    (sums,) = commits.additivity
    assert sums.marginals == 3 and sums.commits == 4
    assert sums.total_pct is not None and sums.sum_of_marginals_pct is not None
    assert sums.interaction_pct == pytest.approx(sums.total_pct - sums.sum_of_marginals_pct)
    assert commits.commits[0].parity.exact == 12 and commits.commits[1].parity.exact == 0


def test_the_answer_comes_first_in_words() -> None:
    summary, _ = commits_summary()
    assert summary.commits is not None
    sentences = commits_sentences(summary.commits)
    assert sentences[0].startswith(f"The PR ({BASE[:10]}..{HEAD[:10]}, 4 commits) is +")
    gains = sentences[1]
    assert gains.startswith(f"c1 ({C1[:10]}) carries the gain (+")
    assert f"c3 ({C3[:10]}) costs " in gains
    assert f"c4 ({C4[:10]}): no established change" in gains
    assert gains.endswith(f"c2 ({C2[:10]}) is not separable (conflicts in NOTES.md).")
    assert gains.index("carries") < gains.index("costs") < gains.index("no established")
    assert "not additive" in sentences[2]


def test_summary_md_and_json_goldens_of_a_commits_job() -> None:
    summary, prov = commits_summary()
    text = render_summary_md(summary, [prov], evidence_id="0" * 24)
    path = GOLDEN / "summary_commits.md"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with COLDBENCH_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(encoding="utf-8")
    assert "### Commits of" in text and "Not separable (never measured)" in text
    assert f"tree `{TREES[C1]}`" in text
    value = json.dumps(summary.to_json_value(), indent=1, sort_keys=True) + "\n"
    path = GOLDEN / "summary_commits.json"
    if UPDATE:
        path.write_text(value, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with COLDBENCH_UPDATE_GOLDEN=1 once"
    assert first_difference(json.loads(path.read_text()), json.loads(value)) is None
    assert first_difference(Summary.model_validate_json(path.read_text()), summary) is None


def test_the_report_has_the_commits_section_and_figure() -> None:
    summary, prov = commits_summary()
    html = render_report_html(summary, [], [prov], None, plotly_js_src="/p.js")
    assert 'id="commits"' in html and 'id="fig-commits"' in html
    assert TREES[C1] in html and "not separable: conflicts in NOTES.md" in html
    assert summary.commits is not None
    assert commits_sentences(summary.commits)[1] in html


def test_alone_on_base_is_compared_with_base_and_summed() -> None:
    spec = resolved(alone=True)
    names = [v.name for v in spec.variants]
    effects = {name: 1.0 for name in names if "c02" not in name}
    effects[names[1]] = 1.10
    effects[names[6]] = 1.08  # c1 alone on base
    records = simulate_run(effects=effects, contexts=(256,), rounds=12, seed=3, noise=0.01)
    summary = summarize(records, spec=spec, provenances=[_provenance(spec)])
    commits = summary.commits
    assert commits is not None
    alone = {a.position: a for a in commits.alone}
    assert alone[1].verdict == "faster" and alone[1].baseline == names[0]
    assert commits.commits[0].alone == names[6]
    assert commits.additivity[0].sum_alone_pct is not None
    text = render_summary_md(summary, [])
    assert "base with only it / base" in text


def test_a_long_reason_keeps_its_kind_and_its_end_in_the_answer() -> None:
    summary, _ = commits_summary()
    commits = summary.commits
    assert commits is not None
    path = "/host/state/worktrees/mlx-lm/" + "f" * 40 + "/mlx_lm/utils.py"
    reason = (
        f"did not load: cannot load model /models/tiny with {path}: Model type llama not supported."
    )
    entries = list(commits.commits)
    entries[1] = entries[1].model_copy(update={"not_separable": reason})
    sentence = commits_sentences(commits.model_copy(update={"commits": entries}))[1]
    clause = sentence[sentence.index("c2 (") :]
    assert clause.startswith(f"c2 ({C2[:10]}) is not separable (did not load: ...")
    assert clause.endswith("Model type llama not supported.).") and len(clause) < 200
