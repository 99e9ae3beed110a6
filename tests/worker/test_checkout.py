from __future__ import annotations

from pathlib import Path

import pytest

from coldbench.worker.checkout import (
    CheckoutError,
    check_ref,
    history_commits,
    prepare,
    resolve_ref,
    tree_state,
    update_mirror,
)
from coldbench.worker.config import RepositoryConfig
from tests.worker.conftest import git


def test_refs_resolve_to_commits_in_a_bare_mirror(
    stub_repo: Path, stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    main = prepare(stub_repository, "main", state_dir=state)
    feature = prepare(stub_repository, "feature", state_dir=state)
    assert main.commit == git(stub_repo, "rev-parse", "main")
    assert feature.commit == git(stub_repo, "rev-parse", "feature")
    assert (state / "mirrors" / "stub.git" / "HEAD").exists()
    assert git(state / "mirrors" / "stub.git", "rev-parse", "--is-bare-repository") == "true"
    assert main.path != feature.path
    assert (main.path / "mlx_lm" / "__init__.py").read_text() == 'STUB = "main"\n'
    assert (feature.path / "mlx_lm" / "__init__.py").read_text() == 'STUB = "feature"\n'
    assert tree_state(main.path) == (False, None)
    assert main.source_dirty is False
    # A tag and a full commit id resolve too.
    mirror = state / "mirrors" / "stub.git"
    assert resolve_ref(mirror, "v1") == feature.commit
    assert resolve_ref(mirror, feature.commit) == feature.commit


def test_mirror_fetches_new_commits_and_worktrees_are_reused(
    stub_repo: Path, stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = prepare(stub_repository, "main", state_dir=state)
    (stub_repo / "extra.txt").write_text("x\n")
    git(stub_repo, "add", "extra.txt")
    git(stub_repo, "commit", "-q", "-m", "more")
    second = prepare(stub_repository, "main", state_dir=state)
    assert second.commit != first.commit
    assert second.commit == git(stub_repo, "rev-parse", "main")
    again = prepare(stub_repository, "main", state_dir=state)
    assert again.path == second.path


def test_dirty_worktree_and_dirty_source_are_reported(
    stub_repo: Path, stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    (stub_repo / "mlx_lm" / "__init__.py").write_text("STUB = 'uncommitted'\n")
    checkout = prepare(stub_repository, "main", state_dir=tmp_path / "state")
    assert checkout.source_dirty is True
    # Uncommitted source changes are not measured: the worktree holds the commit.
    assert tree_state(checkout.path) == (False, None)
    (checkout.path / "mlx_lm" / "__init__.py").write_text("STUB = 'patched by a build'\n")
    dirty, digest = tree_state(checkout.path)
    assert dirty is True and digest is not None and len(digest) == 64


@pytest.mark.parametrize(
    "ref", ["--upload-pack=touch /tmp/pwned", "-b", "main..feature", "a b", "x;rm", "", "ref/"]
)
def test_option_like_and_malformed_refs_are_refused(
    ref: str, stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    with pytest.raises(CheckoutError, match="refused"):
        check_ref(ref)
    with pytest.raises(CheckoutError, match="refused"):
        prepare(stub_repository, ref, state_dir=tmp_path / "state")
    # Refused before any git call: nothing was mirrored.
    assert not (tmp_path / "state").exists()


def test_unknown_ref_and_unreachable_repository(
    stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    with pytest.raises(CheckoutError, match="'no-such-branch' not found"):
        prepare(stub_repository, "no-such-branch", state_dir=tmp_path / "state")
    gone = RepositoryConfig(name="gone", url=str(tmp_path / "missing"), recipes={})
    with pytest.raises(CheckoutError, match="git clone failed"):
        update_mirror(gone, state_dir=tmp_path / "state")
    assert not (tmp_path / "state" / "mirrors" / "gone.git").exists()


def test_uncommitted_edits_to_the_commit_measured_refuse_the_run(
    stub_repo: Path, stub_repository: RepositoryConfig, tmp_path: Path
) -> None:
    """Only commits are measured: `ref=HEAD` on a dirty checkout would time the commit without
    the edits its author is looking at, so the run refuses and says what to do."""
    from coldbench.evidence.contract.schemas import HostInfo, JobSpec
    from coldbench.worker.checkout import uncommitted_work_refusal
    from coldbench.worker.run import RunRefused, execute_run

    url = str(stub_repo)
    head = git(stub_repo, "rev-parse", "HEAD")
    assert uncommitted_work_refusal(url, ["HEAD", "main", head, "feature"]) is None  # clean
    (stub_repo / "mlx_lm" / "__init__.py").write_text("STUB = 'uncommitted'\n")
    for ref in ("HEAD", "main", head):
        refusal = uncommitted_work_refusal(url, ["feature", ref])
        assert refusal == (
            f"{url} has uncommitted changes to tracked files, and ref {ref!r} is the commit it "
            "has checked out: only commits are measured, so the changes would not be. Commit "
            "them (on a branch of their own) or stash them, then run again"
        )
    # other commits of a dirty repository are what was asked for: measured, and said so
    assert uncommitted_work_refusal(url, ["feature", "v1", "no-such-ref"]) is None
    spec = JobSpec.model_validate(
        {
            "adapter": "mlx-lm",
            "repository": "stub",
            "model": "preset:tiny",
            "contexts": [64],
            "rounds": 3,
            "variants": [{"name": "pr", "ref": "feature"}, {"name": "mine", "ref": "HEAD"}],
        }
    )
    with pytest.raises(RunRefused, match=r"ref 'HEAD' is the commit it has checked out"):
        execute_run(
            spec,
            run_id="r-dirty",
            workdir=tmp_path / "work",
            state_dir=tmp_path / "state",
            host=HostInfo(),
            repositories={"stub": stub_repository},
        )
    assert not (tmp_path / "state").exists()  # refused before anything was cloned


def _line_repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """main: m0 - m1 - merge(m1, s2) - m3, side: m0 - s1 - s2, and an orphan branch o1."""
    repo = tmp_path / "line-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = {}
    for name in ("m0", "m1"):
        git(repo, "commit", "-q", "--allow-empty", "-m", name)
        commits[name] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "side", commits["m0"])
    for name in ("s1", "s2"):
        git(repo, "commit", "-q", "--allow-empty", "-m", name)
        commits[name] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    commits["merge"] = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "m3")
    commits["m3"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "--orphan", "orphan")
    git(repo, "commit", "-q", "--allow-empty", "-m", "o1")
    commits["o1"] = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return repo, commits


def test_a_range_is_one_first_parent_line(tmp_path: Path) -> None:
    repo, commits = _line_repo(tmp_path)
    repository = RepositoryConfig(name="line", url=str(repo), module="mlx_lm")
    state = tmp_path / "state"
    reference, listed = history_commits(repository, f"{commits['m0']}..main", state_dir=state)
    assert reference == commits["m0"]
    assert [sha for sha, _ in listed] == [commits["m1"], commits["merge"], commits["m3"]]
    # A good commit on the merged side branch: B's first-parent line does not continue from
    # it, so the "line" would jump from s1 to m1.
    with pytest.raises(CheckoutError, match="is not on the first-parent line of main"):
        history_commits(repository, f"{commits['s1']}..main", state_dir=state)
    # An unrelated history (an orphan branch) is no start of a line, nor a newer commit.
    with pytest.raises(CheckoutError, match="is not an ancestor of main"):
        history_commits(repository, "orphan..main", state_dir=state)
    with pytest.raises(CheckoutError, match="holds no commit after main"):
        history_commits(repository, f"main..{commits['m1']}", state_dir=state)


def test_too_long_a_range_says_how_to_narrow_it(tmp_path: Path) -> None:
    repo, commits = _line_repo(tmp_path)
    repository = RepositoryConfig(name="line", url=str(repo), module="mlx_lm")
    state = tmp_path / "state"
    with pytest.raises(CheckoutError, match=r"at most 2 \(narrow it, or use --every N"):
        history_commits(repository, f"{commits['m0']}..main", state_dir=state, limit=2)
    with pytest.raises(CheckoutError, match=r"at most 2 \(name a good commit closer\)$"):
        history_commits(
            repository,
            f"{commits['m0']}..main",
            state_dir=state,
            limit=2,
            narrower="name a good commit closer",
        )
