"""Checkouts: a bare mirror per allow-listed repository, a worktree per commit.

Refs come from submitters, so they are validated (no option-looking names, no `..`) and every
git call puts them after `--end-of-options` or `--`. A ref is resolved to a commit once, when
the run starts; everything after uses the commit.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evidence.canonical import sha256_hex
from evidence.schemas import MAX_HISTORY_COMMITS, REF_PATTERN
from worker.config import RepositoryConfig

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 600.0
_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class CheckoutError(RuntimeError):
    """A repository could not be mirrored or a ref not resolved; the message says which."""


@dataclass(frozen=True)
class Checkout:
    repository: str
    url: str
    ref: str
    commit: str
    path: Path
    source_dirty: bool | None = None  # a local source repository had uncommitted changes


def _git(*args: str, cwd: Path | None = None, timeout_s: float = GIT_TIMEOUT_S) -> str:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # a private URL fails instead of waiting for a password
        "GIT_ASKPASS": "true",
        "LC_ALL": "C",
    }
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CheckoutError(f"git {args[0]} timed out after {timeout_s:.0f} s") from None
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
    commit = resolve_ref(mirror, ref)
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
