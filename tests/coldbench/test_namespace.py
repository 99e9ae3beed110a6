"""One import package: the card's folders at the top of the repository are the subpackages of
`coldbench` (coldbench/ links each of them), and nothing imports them by their old top-level
names, which this checkout's root on the path would still let through."""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("api", "engine", "evidence", "kernels", "migrations", "web", "worker")
# The top-level names of the packages before the move (`kernels` is now Hugging Face's).
OLD_NAMES = {"api", "engine", "evidence", "fastpaths", "migrations", "web", "worker"}


def test_coldbench_links_each_folder_of_the_card() -> None:
    for name in SUBPACKAGES:
        link = REPO_ROOT / "coldbench" / name
        assert link.is_symlink(), link
        assert link.readlink() == Path("..", name)
        assert (REPO_ROOT / name).is_dir() and not (REPO_ROOT / name).is_symlink()


def test_no_module_imports_an_old_top_level_name() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for path in listed:
        tree = ast.parse((REPO_ROOT / path).read_text(encoding="utf-8"), filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OLD_NAMES]
    assert len(listed) > 100
    assert found == []


def test_the_command_lines_contract_names_every_module_of_coldbench() -> None:
    """`coldbench` holds the command line's modules beside the subpackages, so the contract
    that no package imports the command line lists those modules: each one, new ones too."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [
        c for c in config["contracts"] if c["name"].startswith("coldbench (the command line)")
    ]
    modules = {f"coldbench.{p.stem}" for p in (REPO_ROOT / "coldbench").glob("*.py")}
    assert set(contract["forbidden_modules"]) == modules - {"coldbench.__init__"}
    assert set(contract["source_modules"]) == {f"coldbench.{n}" for n in SUBPACKAGES} - {
        "coldbench.migrations"
    }
    assert config["root_packages"] == ["coldbench", "benchmarks"]
