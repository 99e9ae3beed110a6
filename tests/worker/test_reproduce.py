"""The `coldbench run` line a bundle carries repeats what was run, in each mode's own options."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from coldbench.evidence.analysis.bisect import step_spec
from coldbench.evidence.analysis.history import history_spec
from coldbench.evidence.bundles.compare import Source
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.worker.provenance import reproduce_command
from tests.worker.conftest import git

BASE = {"adapter": "mlx-lm", "repository": "r", "contexts": [64], "rounds": 6}
FLAGS = {"prefill_step_size": 64}


def _args(spec: JobSpec) -> list[str]:
    return shlex.split(reproduce_command(spec, repository_url="/src/r"))


def test_a_bisection_step_repeats_as_a_bisection_of_its_stretch() -> None:
    submitted = JobSpec.model_validate(
        {
            **BASE,
            "mode": "bisect",
            "variants": [{"name": "stock", "flags": FLAGS}],
            "bisect": {"good": "v1", "bad": "main", "direction": "faster"},
        }
    )
    args = _args(submitted)
    assert args[args.index("--good") + 1 :][:5] == ["v1", "--bad", "main", "--direction", "faster"]
    step = _args(step_spec(submitted, ["a" * 40, "b" * 40, "c" * 40], []))
    assert step[step.index("--good") + 1] == "a" * 40 and step[step.index("--bad") + 1] == "c" * 40
    assert [a for a in step if "ref=" in a] == []  # bisect mode refuses refs in --variant
    assert step[step.index("--variant") + 1] == "lo-aaaaaaaaaa:prefill_step_size=64"


def test_a_history_repeats_with_its_range_or_its_commits() -> None:
    submitted = JobSpec.model_validate(
        {
            **BASE,
            "mode": "history",
            "variants": [{"name": "x", "flags": FLAGS}],
            "history": {"range": "v1..main", "every": 2},
        }
    )
    args = _args(submitted)
    assert args[args.index("--range") :][:4] == ["--range", "v1..main", "--every", "2"]
    resolved = _args(history_spec(submitted, "a" * 40, ["b" * 40]))
    assert resolved[resolved.index("--commits") + 1] == f"{'a' * 40},{'b' * 40}"
    assert resolved.count("--variant") == 1 and not [a for a in resolved if "ref=" in a]


def test_an_ab_repeats_at_the_commits_it_measured_into_a_new_folder() -> None:
    """Branches move: the line names the commits measured; it names no `--out`, so running it
    twice writes two folders (`coldbench run` names its default after the time)."""
    spec = JobSpec.model_validate(
        {
            **BASE,
            "variants": [
                {"name": "main", "ref": "main"},
                {"name": "pr", "ref": "pr", "flags": FLAGS},
            ],
        }
    )
    args = shlex.split(
        reproduce_command(
            spec,
            repository_url="/src/r",
            commits={"main": "a" * 40, "pr": "b" * 40},
            local_arguments={"--model": "/models/tiny"},
        )
    )
    variants = [args[i + 1] for i, arg in enumerate(args) if arg == "--variant"]
    assert variants == [f"main:ref={'a' * 40}", f"pr:ref={'b' * 40},prefill_step_size=64"]
    assert "--out" not in args
    assert args[args.index("--model") + 1] == "/models/tiny"


def _bundle_of(spec: JobSpec, targets: list[dict], tmp_path: Path) -> Source:
    from coldbench.evidence.bundles.bundle import build_bundle
    from tests.evidence.builders import provenance, simulate_run

    records = simulate_run(effects={"main": 1.0, "pr": 1.0}, contexts=(64,), rounds=6)
    files, _ = build_bundle(
        records=records,
        provenances=provenance(
            "r-1", "studio-1", targets=targets, model={"name": spec.model}, corpus=None
        ),
        spec=spec,
        n_resamples=200,
    )
    return Source(name=str(tmp_path / "bundle"), files=files)


def test_a_bundle_naming_a_url_reproduces_from_it_and_a_missing_commit_is_named(
    stub_repo: Path, micro_model_dir: Path, tmp_path: Path
) -> None:
    """A repository the bundle names by a URL git fetches is mirrored from it; each variant's
    ref is pinned to the commit its target measured, and one the repository lacks refuses."""
    from coldbench.worker.reproduce import ReproductionRefused, plan_reproduction

    spec = JobSpec.model_validate(
        {
            **BASE,
            "repository": "stub",
            "model": "preset:micro",
            "contexts": [64],
            "variants": [{"name": "main", "ref": "main"}, {"name": "pr", "ref": "feature"}],
        }
    )
    url = f"file://{stub_repo}"
    commits = {"main": git(stub_repo, "rev-parse", "main"), "pr": git(stub_repo, "rev-parse", "v1")}
    targets = [
        {
            "variant": name,
            "repository": url,
            "ref": ref,
            "commit": commits[name],
            "recipe": "editable",
        }
        for name, ref in (("main", "main"), ("pr", "feature"))
    ]
    plan = plan_reproduction(_bundle_of(spec, targets, tmp_path), state_dir=tmp_path / "state")
    (repository,) = plan.repositories.values()
    assert (repository.name, repository.url, repository.default_recipe) == ("stub", url, "editable")
    assert [v.ref for v in plan.spec.variants] == [commits["main"], commits["pr"]]
    assert json.loads(plan.reproduces_file())["evidence_id"] == plan.evidence_id

    targets[1]["commit"] = "c" * 40
    with pytest.raises(ReproductionRefused, match=f"variant pr: commit {'c' * 40} is not in {url}"):
        plan_reproduction(_bundle_of(spec, targets, tmp_path), state_dir=tmp_path / "state")
    targets[1] |= {"commit": commits["pr"], "recipe": "fancy"}
    targets[0] |= {"commit": None}
    with pytest.raises(ReproductionRefused) as refused:
        plan_reproduction(_bundle_of(spec, targets, tmp_path), state_dir=tmp_path / "state")
    assert str(refused.value).splitlines() == [
        "variant main: the bundle names no commit",
        "recipe 'fancy' is not defined on this machine (defined: editable)",
    ]


def test_how_long_a_job_measures_repeats_as_asked() -> None:
    """Measuring until decided is `coldbench run`'s default; exactly N rounds, a time budget
    and a precision other than the default are repeated, so the line measures as the job did."""
    ab = {**BASE, "variants": [{"name": "main", "ref": "main"}]}
    decided = _args(JobSpec.model_validate({**ab, "until": "decided", "budget_minutes": 30}))
    assert "--until" not in decided and decided[decided.index("--budget-minutes") + 1] == "30"
    fixed = _args(JobSpec.model_validate({**ab, "until": "rounds", "precision": 0.05}))
    assert fixed[fixed.index("--until") + 1] == "rounds" and "--budget-minutes" not in fixed
    assert fixed[fixed.index("--precision") + 1] == "0.05"
    assert "--precision" not in decided  # 0.02, the default
