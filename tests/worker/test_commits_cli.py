"""`coldbench run --mode commits` end to end: a copy of the installed mlx_lm with a PR of five
commits (one removes a planted wait, one adds one, one changes nothing measurable, one's revert
conflicts, one's revert leaves a tree whose model does not load), ranked as planted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from coldbench.evidence.bundles.bundle import verify_bundle
from tests.conftest import SLOW_PREFILL_SYNC_OLD
from tests.worker.conftest import git

pytestmark = pytest.mark.slow

# A wait per prefill chunk, read from two modules a commit can change on its own. A 64-token
# prefill of the micro preset is 9-41 ms of compute on this CPU (2026-12-03, load 2-4); the faster
# commit takes 0.25 s of wait away, the slower one adds 0.25 s: head without the first waits
# 0.5 s, head 0.25 s, head without the second none. A pair flips only if one cell's compute
# alone runs 0.25 s (6x its slowest) over its partner's, far above what load does to it.
PLANTED = SLOW_PREFILL_SYNC_OLD + (
    "            from mlx_lm import planted_a, planted_b  # planted: a wait per chunk\n"
    "            time.sleep(planted_a.WAIT_S + planted_b.WAIT_S)\n"
)
CONTEXT = "64"
# 3 marginals corrected together (Bonferroni): 8 process pairs leave the planted waits' intervals
# far from 1
ROUNDS = "8"


@pytest.fixture(scope="module")
def pr_repo(
    mlx_lm_repo: tuple[Path, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    source, (main, _slow) = mlx_lm_repo
    repo = tmp_path_factory.mktemp("pr") / "mlx-lm"
    git(source.parent, "clone", "-q", "--branch", main, str(source), str(repo))
    package = repo / "mlx_lm"
    generate = package / "generate.py"
    text = generate.read_text()
    assert text.count(SLOW_PREFILL_SYNC_OLD) == 1 and "\nimport time\n" in text
    generate.write_text(text.replace(SLOW_PREFILL_SYNC_OLD, PLANTED))
    (package / "planted_a.py").write_text("WAIT_S = 0.25\n")
    (package / "planted_b.py").write_text("WAIT_S = 0.0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base: planted waits")
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    git(repo, "checkout", "-q", "-b", "pr")

    def commit(name: str, message: str) -> None:
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        shas[name] = git(repo, "rev-parse", "HEAD")

    (package / "planted_a.py").write_text("WAIT_S = 0.0\n")
    commit("faster", "prefill: wait less")
    (repo / "NOTES.md").write_text("notes\n")
    commit("notes", "docs: notes")
    (package / "planted_b.py").write_text("WAIT_S = 0.25\n")
    commit("slower", "prefill: wait more")
    (package / "models" / "llama_extra.py").write_text("EXTRA = 1\n")
    commit("extra", "models: an extra module")
    llama = package / "models" / "llama.py"
    llama.write_text("from . import llama_extra  # noqa: F401\n" + llama.read_text())
    (repo / "NOTES.md").write_text("notes, tidied\n")
    commit("tidy", "docs: tidy notes; llama imports the extra module")
    return repo, shas


def test_commits_rank_as_planted_and_the_inseparable_ones_say_why(
    pr_repo: tuple[Path, dict[str, str]],
    coldbench_cmd: list[str],
    micro_model_dir: Path,
    tmp_path: Path,
) -> None:
    repo, shas = pr_repo
    out = tmp_path / "commits"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--repo", str(repo), "--mode", "commits", "--base", shas["base"], "--head", "pr"),
            *(
                "--model",
                "preset:micro",
                "--contexts",
                CONTEXT,
                "--rounds",
                ROUNDS,
                "--decode-tokens",
                "2",
            ),
            *("--out", str(out), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert verify_bundle(out).is_intact
    summary = json.loads((out / "summary.json").read_text())
    commits = summary["commits"]
    order = ["faster", "notes", "slower", "extra", "tidy"]
    assert [c["commit"] for c in commits["commits"]] == [shas[name] for name in order]
    assert commits["base"]["commit"] == shas["base"] and commits["head"]["commit"] == shas["tidy"]
    entries = {c["commit"]: c for c in commits["commits"]}
    assert entries[shas["notes"]]["not_separable"] == "conflicts in NOTES.md"
    unloadable = entries[shas["extra"]]
    assert unloadable["not_separable"].startswith("did not load: "), unloadable
    assert "llama" in unloadable["not_separable"]
    assert "llama_extra" in unloadable["tree"]["failure_tail"]
    marginals = {m["commit"]: m for m in commits["marginals"]}
    assert set(marginals) == {shas["faster"], shas["slower"], shas["tidy"]}
    assert marginals[shas["faster"]]["verdict"] == "faster", marginals
    assert marginals[shas["slower"]]["verdict"] == "slower", marginals
    ranked = sorted(marginals.values(), key=lambda m: -m["ratio_median"])
    assert [m["commit"] for m in ranked] == [shas["faster"], shas["tidy"], shas["slower"]]
    (total,) = commits["total"]  # the gain and the cost cancel: head waits as long as base
    assert total["variant"].startswith("head-") and total["baseline"].startswith("base-")
    # every variant decoded what base decoded (the waits change time, not tokens)
    assert summary["parity"]["counts"]["diverged"] == 0
    # the tree the host made for head without the faster commit is git's own revert of it
    check = tmp_path / "check"
    git(tmp_path, "clone", "-q", "--branch", "pr", str(repo), str(check))
    git(check, "revert", "--no-commit", shas["faster"])
    expected_tree = git(check, "write-tree")
    faster = entries[shas["faster"]]["tree"]
    assert faster == {**faster, "change": "revert", "onto": shas["tidy"], "tree": expected_tree}
    provenance = json.loads((out / "provenance.json").read_text())
    target = next(
        t for t in provenance["targets"] if t["variant"] == entries[shas["faster"]]["without"]
    )
    assert target["synthesized"]["tree"] == expected_tree and target["dirty"] is False
    stdout = " ".join(done.stdout.split())
    assert f"c1 ({shas['faster'][:10]}) carries the gain" in stdout
    assert f"c3 ({shas['slower'][:10]}) costs" in stdout
    assert f"c2 ({shas['notes'][:10]}) is not separable (conflicts in NOTES.md)" in stdout
    assert f"c4 ({shas['extra'][:10]}) is not separable (did not load" in stdout
    report = (out / "report.html").read_text()
    assert 'id="commits"' in report and 'id="fig-commits"' in report


def test_commits_input_errors_are_one_line(
    pr_repo: tuple[Path, dict[str, str]], coldbench_cmd: list[str], tmp_path: Path
) -> None:
    """Refusals in this process (CliRunner: a `python -m coldbench` start costs seconds of CPU
    on this machine), and the first one through the real command as well."""
    from typer.testing import CliRunner

    from coldbench.worker.cli import app

    repo, shas = pr_repo
    cases = (
        (["--mode", "commits", "--base", "a", "--head", "b"], "--repo: commits mode needs a repo"),
        (
            ["--repo", str(repo), "--mode", "commits", "--base", "main"],
            "--head: commits needs head",
        ),
        (["--base", "main"], "--base: belongs to mode commits, not ab"),
        (
            ["--repo", str(repo), "--mode", "commits", "--base", "pr", "--head", "main"],
            "holds no commit",
        ),
        (
            ["--repo", str(repo), "--mode", "commits", "--base=-x", "--head", "pr"],
            "--base: ref '-x' is not a plain branch",
        ),
        (
            ["--repo", str(repo), "--mode", "commits", "--base", "main", "--head", "pr"]
            + ["--variant", "a:ref=main"],
            "the variant takes flags only",
        ),
    )
    state = ["--state-dir", str(tmp_path / "state")]
    first_args, first_message = cases[0]
    done = subprocess.run(
        [*coldbench_cmd, "run", *first_args, *state],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (first_args, done.stderr[-2000:])
    assert any(first_message in line for line in lines), (first_args, lines)
    for args, message in cases:
        invoked = CliRunner().invoke(app, ["run", *args, *state])
        lines = [line for line in invoked.stderr.splitlines() if line.strip()]
        assert invoked.exit_code == 2, (args, invoked.output[-2000:])
        assert any(message in line for line in lines), (args, lines)
