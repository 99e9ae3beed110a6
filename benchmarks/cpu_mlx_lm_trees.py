"""Branches of real slowdowns in a clone of mlx-lm, for the CPU figures of docs/EVIDENCE.md
("On this CPU"): the `tiny` preset is llama, so each slowdown is redundant work in
mlx_lm/models/llama.py, the code path its prefill runs.

- `slow-mlp`: main, then the MLP evaluates its up projection twice and averages (one more
  256 x 704 matmul per layer; about 15% slower prefill);
- `hist`: main, the MLP evaluated three times per layer (the history's slow reference), the
  fix, three docs commits;
- `histmid`: main, a docs commit, the MLP three times, two docs commits (a step in the middle);
- `bis`: main, two docs commits, the MLP twice per layer (about 1.7x slower), two docs commits.

Usage: python benchmarks/cpu_mlx_lm_trees.py MLX_LM (a clone of ml-explore/mlx-lm; its
checked-out branch is the base; the branches must not exist yet).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LLAMA = Path("mlx_lm/models/llama.py")
MLP_CALL = "        r = self.mlp(self.post_attention_layernorm(h))\n"
UP_CALL = "        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))\n"
UP_TWICE = (
    "        # Average two evaluations of the up projection (a redundant matmul per layer).\n"
    "        up = (self.up_proj(x) + self.up_proj(x)) * 0.5\n"
    "        return self.down_proj(swiglu(self.gate_proj(x), up))\n"
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def commit(repo: Path, message: str) -> None:
    git(
        repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qam", message
    )


def edit(repo: Path, old: str, new: str) -> None:
    path = repo / LLAMA
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{LLAMA}: expected one {old.strip()!r}; is this mlx-lm?")
    path.write_text(text.replace(old, new))


def mlp_times(k: int) -> str:
    return (
        "        n = self.post_attention_layernorm(h)\n"
        f"        # Average {k} evaluations of the MLP (redundant work per layer).\n"
        f"        r = sum(self.mlp(n) for _ in range({k})) / {k}\n"
    )


def notes(repo: Path, *names: str) -> None:
    for name in names:
        path = repo / "NOTES.md"
        path.write_text((path.read_text() if path.exists() else "") + f"note {name}\n")
        git(repo, "add", "NOTES.md")
        commit(repo, f"docs: note {name}")


def main(repo: Path) -> None:
    base = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    stock = (repo / LLAMA).read_text()
    git(repo, "checkout", "-q", "-b", "slow-mlp", base)
    edit(repo, UP_CALL, UP_TWICE)
    commit(repo, "llama MLP: evaluate the up projection twice")
    git(repo, "checkout", "-q", "-b", "hist", base)
    edit(repo, MLP_CALL, mlp_times(3))
    commit(repo, "llama: MLP evaluated three times per layer")
    (repo / LLAMA).write_text(stock)
    commit(repo, "llama: MLP evaluated once again")
    notes(repo, "1", "2", "3")
    git(repo, "checkout", "-q", "-b", "histmid", base)
    notes(repo, "m1")
    edit(repo, MLP_CALL, mlp_times(3))
    commit(repo, "llama: MLP evaluated three times per layer")
    notes(repo, "m2", "m3")
    git(repo, "checkout", "-q", "-b", "bis", base)
    notes(repo, "a", "b")
    edit(repo, MLP_CALL, mlp_times(2))
    commit(repo, "llama: MLP evaluated twice per layer")
    notes(repo, "c", "d")
    git(repo, "checkout", "-q", base)
    for branch in ("slow-mlp", "hist", "histmid", "bis"):
        print(branch, git(repo, "rev-parse", branch))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
