"""Checkouts: a bare mirror per allow-listed repository, a worktree per commit.

Refs come from submitters, so they are validated (no option-looking names, no `..`) and every
git call puts them after `--end-of-options` or `--`. A ref is resolved to a commit once, when
the run starts; everything after uses the commit.

A commits job also needs trees no ref names: head with one commit reverted, base with one
commit picked (`synthesize`). The host makes each in a scratch worktree with git's own revert
and cherry-pick, writes the result as a commit of its mirror (fixed identity and dates, so the
same change gives the same commit id on every host) and checks that commit out like any other.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from coldbench.evidence.contract.canonical import sha256_hex
from coldbench.evidence.contract.schemas import MAX_HISTORY_COMMITS, REF_PATTERN
from coldbench.worker.config import RepositoryConfig

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 600.0
_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class CheckoutError(RuntimeError):
    """A repository could not be mirrored or a ref not resolved; the message says which."""


class NotSeparable(CheckoutError):
    """A commit's change does not apply where a commits job needs it (its revert on head, or
    its pick onto base, conflicts); `conflicts` are the files git could not merge."""

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message)
        self.conflicts = conflicts


@dataclass(frozen=True)
class Checkout:
    repository: str
    url: str
    ref: str
    commit: str
    path: Path
    source_dirty: bool | None = None  # a local source repository had uncommitted changes


def _git_run(
    *args: str,
    cwd: Path | None = None,
    timeout_s: float = GIT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # a private URL fails instead of waiting for a password
        "GIT_ASKPASS": "true",
        "LC_ALL": "C",
        **(env or {}),
    }
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CheckoutError(f"git {args[0]} timed out after {timeout_s:.0f} s") from None


def _git(
    *args: str,
    cwd: Path | None = None,
    timeout_s: float = GIT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> str:
    done = _git_run(*args, cwd=cwd, timeout_s=timeout_s, env=env)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise CheckoutError(f"git {args[0]} failed: {detail[-1] if detail else done.returncode}")
    return done.stdout


def check_ref(ref: str) -> str:
    if not REF_PATTERN.fullmatch(ref) or ref.startswith("-") or ref.endswith((".lock", "/")):
        raise CheckoutError(
            f"ref {ref!r} refused: use a plain branch, tag or commit name (no leading '-', no '..')"
        )
    return ref


def mirror_path(repository: RepositoryConfig, *, state_dir: Path) -> Path:
    return state_dir / "mirrors" / f"{repository.name}.git"


def update_mirror(repository: RepositoryConfig, *, state_dir: Path) -> Path:
    """Clone the allow-listed URL as a bare mirror the first time, fetch afterwards."""
    path = mirror_path(repository, state_dir=state_dir)
    if (path / "HEAD").exists():
        _git("--git-dir", str(path), "fetch", "--prune", "--quiet", "origin")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        if partial.exists():
            _remove_tree(partial)
        _git("clone", "--mirror", "--quiet", "--", repository.url, str(partial))
        partial.rename(path)
    return path


def resolve_ref(mirror: Path, ref: str) -> str:
    """The full commit id a ref names in the mirror, now."""
    check_ref(ref)
    try:
        out = _git(
            "--git-dir",
            str(mirror),
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            f"{ref}^{{commit}}",
        )
    except CheckoutError:
        raise CheckoutError(f"ref {ref!r} not found in {mirror.name}") from None
    commit = out.strip()
    if not _COMMIT.fullmatch(commit):
        raise CheckoutError(f"ref {ref!r} did not resolve to a commit")
    return commit


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def worktree(mirror: Path, commit: str, *, repository: str, state_dir: Path) -> Path:
    """A worktree at `commit` (detached), reused when it already exists and is intact."""
    if not _COMMIT.fullmatch(commit):
        raise CheckoutError(f"not a commit id: {commit!r}")
    path = state_dir / "worktrees" / repository / commit
    if path.exists():
        try:
            head = _git("-C", str(path), "rev-parse", "HEAD").strip()
        except CheckoutError:
            head = ""
        if head == commit:
            return path
        _remove_tree(path)
        _git("--git-dir", str(mirror), "worktree", "prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    _git(
        "--git-dir", str(mirror), "worktree", "add", "--detach", "--quiet", "--", str(path), commit
    )
    return path


def is_local_source(url: str) -> bool:
    return "://" not in url and Path(url).is_dir()


def source_is_dirty(url: str) -> bool | None:
    """For a local source repository: does its working tree hold uncommitted changes?

    Those changes are not measured (only commits are), which the evidence should say.
    """
    if not is_local_source(url) or not (Path(url) / ".git").exists():
        return None
    try:
        return bool(_git("-C", url, "status", "--porcelain", "--untracked-files=no").strip())
    except CheckoutError:
        return None


def uncommitted_work_refusal(url: str, refs: Iterable[str]) -> str | None:
    """Why a run must not start, or None: a local source repository whose tracked files have
    uncommitted changes, asked to measure the very commit it has checked out (`HEAD`, its
    branch, or that commit by id). Only commits are measured, so the run would time the
    commit without the edits its author is looking at."""
    if not source_is_dirty(url):
        return None
    try:
        head = _git("-C", url, "rev-parse", "--verify", "HEAD").strip()
    except CheckoutError:
        return None
    for ref in refs:
        try:
            commit = _git(
                "-C",
                url,
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                f"{ref}^{{commit}}",
            ).strip()
        except CheckoutError:
            continue
        if commit == head:
            return (
                f"{url} has uncommitted changes to tracked files, and ref {ref!r} is the commit "
                "it has checked out: only commits are measured, so the changes would not be. "
                "Commit them (on a branch of their own) or stash them, then run again"
            )
    return None


def prepare(repository: RepositoryConfig, ref: str, *, state_dir: Path) -> Checkout:
    """Mirror, resolve the ref to a commit, and check the commit out."""
    check_ref(ref)
    mirror = update_mirror(repository, state_dir=state_dir)
    return _checked_out(repository, mirror, ref, resolve_ref(mirror, ref), state_dir=state_dir)


def _checked_out(
    repository: RepositoryConfig, mirror: Path, ref: str, commit: str, *, state_dir: Path
) -> Checkout:
    """`commit` of the mirror in a worktree of its own, as `ref` asked for it."""
    path = worktree(mirror, commit, repository=repository.name, state_dir=state_dir)
    return Checkout(
        repository=repository.name,
        url=repository.url,
        ref=ref,
        commit=commit,
        path=path,
        source_dirty=source_is_dirty(repository.url),
    )


def tree_state(path: Path) -> tuple[bool, str | None]:
    """(dirty, sha256 of `git diff HEAD`) of a worktree: tracked files changed since the commit.

    Untracked build products (egg-info, build/) are not changes to the code; a recipe that
    rewrites a tracked file is, and shows up here.
    """
    diff = _git("-C", str(path), "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color")
    return (bool(diff), sha256_hex(diff.encode()) if diff else None)


def commit_subject(checkout: Checkout) -> str | None:
    """The checked-out commit's subject line (history steps name it); None if git cannot say."""
    try:
        out = _git("-C", str(checkout.path), "log", "-1", "--format=%s", checkout.commit)
    except CheckoutError:
        return None
    return out.strip()[:200] or None


def history_commits(
    repository: RepositoryConfig,
    commit_range: str,
    *,
    state_dir: Path,
    every: int | None = None,
    last: int | None = None,
    limit: int = MAX_HISTORY_COMMITS,
    narrower: str = "narrow it, or use --every N or --last N",
) -> tuple[str, list[tuple[str, str]]]:
    """(reference commit, [(commit, subject), ...] oldest first) for `A..B`: the reference is
    A itself, the commits those on B's first-parent line after A; `last` keeps the newest N,
    `every` each Nth counted back from B (so B is always measured); more than `limit` left
    is refused, saying what to do (`narrower`).

    A..B must be one line: A an ancestor of B and on B's first-parent history, so each
    commit's parent in the list is the one before it (a history's steps and a bisection's
    halves compare neighbours). A from an unrelated history, or a commit of a branch merged
    into B, is refused."""
    start, sep, end = commit_range.partition("..")
    if not sep:
        raise CheckoutError(f"range {commit_range!r} is not A..B")
    mirror = update_mirror(repository, state_dir=state_dir)
    reference = resolve_ref(mirror, start)
    tip = resolve_ref(mirror, end)
    out = _git(
        "--git-dir",
        str(mirror),
        "log",
        "--first-parent",
        "--reverse",
        "--format=%H %s",
        "--end-of-options",
        f"{reference}..{tip}",
    )
    commits = [(line[:40], line[41:][:200]) for line in out.splitlines() if line.strip()]
    if not commits:
        raise CheckoutError(f"range {commit_range!r} holds no commit after {start}")
    _check_line(mirror, commit_range, reference, tip, commits[0][0])
    if every:
        commits = commits[::-1][::every][::-1]
    if last:
        commits = commits[-last:]
    if len(commits) > limit:
        raise CheckoutError(
            f"range {commit_range!r} holds {len(commits)} commits; at most {limit} ({narrower})"
        )
    return reference, commits


def _check_line(mirror: Path, commit_range: str, reference: str, tip: str, oldest: str) -> None:
    """CheckoutError unless `reference` is an ancestor of `tip` and the first parent of
    `oldest`, the first commit `git log --first-parent reference..tip` listed."""
    start, _, end = commit_range.partition("..")
    try:
        _git("--git-dir", str(mirror), "merge-base", "--is-ancestor", reference, tip)
    except CheckoutError:
        raise CheckoutError(
            f"range {commit_range!r}: {start} is not an ancestor of {end} (an unrelated "
            f"history, or a newer commit); name A..B with A in B's history"
        ) from None
    parents = _git("--git-dir", str(mirror), "rev-list", "--parents", "-n", "1", oldest).split()
    if parents[1:2] != [reference]:
        raise CheckoutError(
            f"range {commit_range!r}: {start} is not on the first-parent line of {end} (a "
            f"commit of a branch merged into it); name a commit of {end}'s first-parent "
            "history, such as the merge"
        )


def _parents(mirror: Path, commit: str) -> list[str]:
    out = _git("--git-dir", str(mirror), "rev-list", "--parents", "-n", "1", commit, "--")
    return out.split()[1:]


def commit_line(
    repository: RepositoryConfig, base: str, head: str, *, state_dir: Path, limit: int
) -> list[str]:
    """base, then each commit on head's first-parent line after it, oldest first (the last is
    head): what a commits job leaves out one at a time. base..head must be one line, as a
    history's range (`history_commits`: a PR's merge base is on it); more than `limit` commits
    are refused."""
    reference, commits = history_commits(
        repository,
        f"{base}..{head}",
        state_dir=state_dir,
        limit=limit,
        narrower="a commits job measures head without each one: give a base nearer head",
    )
    return [reference, *(sha for sha, _subject in commits)]


def commit_subject_of(mirror: Path, commit: str) -> str | None:
    """A commit's subject line in the mirror; None if git cannot say."""
    try:
        out = _git("--git-dir", str(mirror), "log", "-1", "--format=%s", commit, "--")
    except CheckoutError:
        return None
    return out.strip()[:200] or None


def _discard_worktree(mirror: Path, path: Path) -> None:
    if path.exists():
        _remove_tree(path)
    _git("--git-dir", str(mirror), "worktree", "prune")


def _conflicted_files(scratch: Path) -> list[str]:
    out = _git("-C", str(scratch), "diff", "--name-only", "-z", "--diff-filter=U")
    return sorted(name for name in out.split("\0") if name)


def _write_commit(mirror: Path, tree: str, onto: str, message: str) -> str:
    """A commit of `tree` on `onto`, by the host's fixed identity at onto's own commit time:
    the same tree on the same parent is the same commit id on every host."""
    when = _git("--git-dir", str(mirror), "show", "-s", "--format=%ct", onto, "--").strip()
    stamp = f"@{when} +0000"
    identity = {
        "GIT_AUTHOR_NAME": "coldbench",
        "GIT_AUTHOR_EMAIL": "coldbench@localhost",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_NAME": "coldbench",
        "GIT_COMMITTER_EMAIL": "coldbench@localhost",
        "GIT_COMMITTER_DATE": stamp,
    }
    out = _git(
        "--git-dir", str(mirror), "commit-tree", tree, "-p", onto, "-m", message, env=identity
    )
    return out.strip()


def synthesize(
    repository: RepositoryConfig, *, onto: str, commit: str, change: str, state_dir: Path
) -> tuple[Checkout, str]:
    """(the checkout, its git tree id) of `onto` with `commit` reverted (`revert`) or picked
    (`pick`), as `git revert`/`git cherry-pick` do it (a merge against its first parent, `-m 1`).
    Both are full commit ids of the mirror. Raises NotSeparable when the change conflicts."""
    if change not in ("revert", "pick"):
        raise ValueError(f"unknown change {change!r}")
    for sha in (onto, commit):
        if not _COMMIT.fullmatch(sha):
            raise CheckoutError(f"not a commit id: {sha!r}")
    mirror = mirror_path(repository, state_dir=state_dir)
    parents = _parents(mirror, commit)
    if not parents:
        raise NotSeparable(f"{commit[:10]} is a root commit: nothing to {change} it against", [])
    verb = "revert" if change == "revert" else "cherry-pick"
    scratch = state_dir / "worktrees" / repository.name / f"{change}-{onto[:12]}-{commit[:12]}"
    _discard_worktree(mirror, scratch)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    add = ("worktree", "add", "--detach", "--quiet", "--", str(scratch), onto)
    _git("--git-dir", str(mirror), *add)
    try:
        mainline = ["-m", "1"] if len(parents) > 1 else []
        done = _git_run(
            *("-C", str(scratch), "-c", "user.name=coldbench", "-c", "user.email=coldbench@local"),
            *(verb, "--no-commit", *mainline, "--end-of-options", commit),
        )
        if done.returncode != 0:
            conflicts = _conflicted_files(scratch)
            if conflicts:
                shown = ", ".join(conflicts[:5])
                more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
                raise NotSeparable(f"conflicts in {shown}{more}", conflicts)
            detail = (done.stderr or done.stdout).strip().splitlines()
            why = detail[-1] if detail else f"exit code {done.returncode}"
            raise NotSeparable(f"git {verb} failed: {why}", [])
        tree = _git("-C", str(scratch), "write-tree").strip()
    finally:
        _discard_worktree(mirror, scratch)
    done_as = "reverted" if change == "revert" else "picked"
    made = _write_commit(mirror, tree, onto, f"coldbench: {onto} with {commit} {done_as}\n")
    return _checked_out(repository, mirror, onto, made, state_dir=state_dir), tree
