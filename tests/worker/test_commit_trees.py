"""Mode commits on the host: base..head resolved in the mirror, head without each commit made
with git's own revert (and base with one commit picked), and the trees that do not apply,
build or import reported as not separable with their reason."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from coldbench.evidence.contract.schemas import JobSpec
from coldbench.evidence.contract.variant import expand_variants
from coldbench.worker.checkout import CheckoutError, NotSeparable, commit_line, synthesize
from coldbench.worker.config import Recipe, RepositoryConfig, default_recipes
from coldbench.worker.run import prepare_variants, resolve_on_host
from tests.worker.conftest import PATH_RECIPE_COMMAND, git


@pytest.fixture
def pr_repo(stub_repo: Path) -> tuple[Path, dict[str, str]]:
    """main of stub_repo, then branch `pr`: notes, tidy notes (c1's revert conflicts with
    it), an extra module, the package importing it (c3's revert leaves an import of nothing),
    and a merge of a side branch."""
    repo = stub_repo
    shas = {"base": git(repo, "rev-parse", "main")}
    git(repo, "checkout", "-q", "-b", "pr", "main")
    (repo / "NOTES.md").write_text("notes\n")
    git(repo, "add", "NOTES.md")
    git(repo, "commit", "-q", "-m", "docs: notes")
    shas["c1"] = git(repo, "rev-parse", "HEAD")
    (repo / "NOTES.md").write_text("notes, tidied\n")
    git(repo, "commit", "-q", "-am", "docs: tidy notes")
    shas["c2"] = git(repo, "rev-parse", "HEAD")
    (repo / "mlx_lm" / "extra.py").write_text("VALUE = 1\n")
    git(repo, "add", "mlx_lm/extra.py")
    git(repo, "commit", "-q", "-m", "extra module")
    shas["c3"] = git(repo, "rev-parse", "HEAD")
    (repo / "mlx_lm" / "__init__.py").write_text('from . import extra\nSTUB = "pr"\n')
    git(repo, "commit", "-q", "-am", "use the extra module")
    shas["c4"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "side", "main")
    (repo / "SIDE.md").write_text("side\n")
    git(repo, "add", "SIDE.md")
    git(repo, "commit", "-q", "-m", "side: a file")
    git(repo, "checkout", "-q", "pr")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    shas["merge"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return repo, shas


PATH_RECIPE = Recipe("path", PATH_RECIPE_COMMAND)


def _repository(repo: Path, *, recipes: dict[str, Recipe] | None = None) -> RepositoryConfig:
    return RepositoryConfig(
        name="stub", url=str(repo), module="mlx_lm", recipes=recipes or default_recipes()
    )


def _show(checkout_path: Path, name: str) -> str | None:
    path = checkout_path / name
    return path.read_text() if path.exists() else None


def test_the_line_is_base_then_heads_first_parent_commits(
    pr_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, shas = pr_repo
    repository = _repository(repo)
    state = tmp_path / "state"
    line = commit_line(repository, "main", "pr", state_dir=state, limit=32)
    # the side branch's own commit is not on the line: its merge is one change
    assert line == [shas[k] for k in ("base", "c1", "c2", "c3", "c4", "merge")]
    for base, head, message in (
        ("pr", "main", "holds no commit"),
        ("side", "pr", "not on the first-parent line"),
        ("nope", "pr", "ref 'nope' not found"),
    ):
        with pytest.raises(CheckoutError, match=message):
            commit_line(repository, base, head, state_dir=state, limit=32)
    with pytest.raises(CheckoutError, match="holds 5 commits; at most 4"):
        commit_line(repository, "main", "pr", state_dir=state, limit=4)


def test_reverts_and_picks_make_trees_with_the_same_commit_on_every_host(
    pr_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, shas = pr_repo
    repository = _repository(repo)
    head = shas["merge"]
    first_host, second_host = tmp_path / "a", tmp_path / "b"
    commit_line(repository, "main", "pr", state_dir=first_host, limit=32)
    commit_line(repository, "main", "pr", state_dir=second_host, limit=32)
    without_c2, tree = synthesize(
        repository, onto=head, commit=shas["c2"], change="revert", state_dir=first_host
    )
    assert _show(without_c2.path, "NOTES.md") == "notes\n"
    assert _show(without_c2.path, "mlx_lm/extra.py") == "VALUE = 1\n"
    assert git(without_c2.path, "rev-parse", "HEAD^{tree}") == tree
    assert git(without_c2.path, "rev-parse", "HEAD^") == head
    assert git(without_c2.path, "status", "--porcelain") == ""
    assert without_c2.ref == head and without_c2.commit != head
    again, tree_again = synthesize(
        repository, onto=head, commit=shas["c2"], change="revert", state_dir=second_host
    )
    assert (again.commit, tree_again) == (without_c2.commit, tree)
    without_merge, _ = synthesize(
        repository, onto=head, commit=shas["merge"], change="revert", state_dir=first_host
    )
    assert _show(without_merge.path, "SIDE.md") is None  # the whole merged side, as -m 1
    assert _show(without_merge.path, "NOTES.md") == "notes, tidied\n"
    only_c3, _ = synthesize(
        repository, onto=shas["base"], commit=shas["c3"], change="pick", state_dir=first_host
    )
    assert _show(only_c3.path, "mlx_lm/extra.py") == "VALUE = 1\n"
    assert _show(only_c3.path, "NOTES.md") is None
    with pytest.raises(NotSeparable, match="conflicts in NOTES.md") as caught:
        synthesize(repository, onto=head, commit=shas["c1"], change="revert", state_dir=first_host)
    assert caught.value.conflicts == ["NOTES.md"]
    # nothing of the failed attempt is left behind: no scratch worktree, the mirror's list clean
    worktrees = git(first_host / "mirrors" / "stub.git", "worktree", "list", "--porcelain")
    assert "revert-" not in worktrees and "pick-" not in worktrees
    with pytest.raises(CheckoutError, match="not a commit id"):
        synthesize(
            repository, onto="--exec=x", commit=shas["c1"], change="revert", state_dir=first_host
        )


@pytest.mark.slow
def test_trees_that_do_not_apply_or_import_are_not_separable_and_the_rest_go_on(
    pr_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    repo, shas = pr_repo
    repository = _repository(repo, recipes={"path": PATH_RECIPE})
    state = tmp_path / "state"
    submitted = JobSpec.model_validate(
        {
            "mode": "commits",
            "repository": "stub",
            "adapter": "mlx-lm",
            "variants": [{"name": "base"}],
            "contexts": [64],
            "rounds": 6,
            "commits": {"base": "main", "head": "pr"},
        }
    )
    spec = resolve_on_host(submitted, {"stub": repository}, state_dir=state)
    assert spec.commits is not None and spec.commits.line is not None
    assert spec.commits.line[-1] == shas["merge"]
    prepared, logs, failure = prepare_variants(
        spec,
        expand_variants(spec),
        run_id="r-1",
        model=tmp_path / "model",
        repositories={"stub": repository},
        state_dir=state,
        workdir=tmp_path / "work",
    )
    assert failure is None
    by_position = {p.synthesized.commit: p for p in prepared if p.synthesized is not None}
    conflict = by_position[shas["c1"]]
    assert conflict.skipped == "conflicts in NOTES.md" and conflict.checkout is None
    assert conflict.synthesized is not None and conflict.synthesized.conflicts == ["NOTES.md"]
    assert conflict.synthesized.subject == "docs: notes"
    no_import = by_position[shas["c3"]]
    assert no_import.skipped is not None and no_import.skipped.startswith("did not build: ")
    assert "extra" in no_import.skipped
    tail = no_import.synthesized.failure_tail if no_import.synthesized else None
    assert tail and "install-path check failed" in tail
    assert f"build-{no_import.spec.name}.log" in logs
    measured = [p for p in prepared if not p.skipped]
    assert [p.spec.name for p in measured][:2] == [v.name for v in spec.variants][:2]
    for p in measured:
        assert p.build is not None and p.build.ok and p.checkout is not None
        if p.synthesized is not None:
            assert p.synthesized.tree == git(p.checkout.path, "rev-parse", "HEAD^{tree}")
            assert p.build.dirty is False
    assert {p.synthesized.commit for p in measured if p.synthesized} == {
        shas["c2"],
        shas["c4"],
        shas["merge"],
    }


@pytest.mark.slow
def test_a_runs_builds_go_at_once_and_come_back_in_the_variants_order(
    pr_repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Every tree of a commits job is built at once (one per core): each build writes when it
    began and ended, and on a machine of two cores or more two of them overlap."""
    repo, _shas = pr_repo
    times = tmp_path / "build-times.txt"
    timed = Recipe(
        "timed",
        (
            "{python}",
            "-c",
            "import os, site, time; began = time.time(); time.sleep(1.0); "
            "open(os.environ['BUILD_TIMES'], 'a').write(f'{began} {time.time()}\\n'); "
            "open(os.path.join(site.getsitepackages()[0], 'checkout.pth'), 'w')"
            ".write(os.getcwd())",
        ),
        env={"BUILD_TIMES": str(times)},
    )
    repository = _repository(repo, recipes={"timed": timed})
    state = tmp_path / "state"
    submitted = JobSpec.model_validate(
        {
            "mode": "commits",
            "repository": "stub",
            "adapter": "mlx-lm",
            "variants": [{"name": "base"}],
            "contexts": [64],
            "rounds": 6,
            "commits": {"base": "main", "head": "pr"},
        }
    )
    spec = resolve_on_host(submitted, {"stub": repository}, state_dir=state)
    variants = expand_variants(spec)
    prepared, logs, failure = prepare_variants(
        spec,
        variants,
        run_id="r-1",
        model=tmp_path / "model",
        repositories={"stub": repository},
        state_dir=state,
        workdir=tmp_path / "work",
    )
    assert failure is None
    assert [p.spec.name for p in prepared] == [v.name for v in variants]
    built = [p for p in prepared if p.build is not None]
    assert all(f"build-{p.spec.name}.log" in logs for p in built)
    spans = sorted(tuple(map(float, line.split())) for line in times.read_text().splitlines())
    assert len(spans) == len({(p.build.commit, p.build.recipe) for p in built if p.build}) >= 3
    if (os.cpu_count() or 1) >= 2:
        assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans
