"""The docs name what the code has: links, commands and their options, modules, tests, sections.

Each check reads README.md and docs/*.md as text and holds what they name against the tree and
the command line as they stand, so a renamed option, module or test fails here instead of in a
reader's shell. Text moved verbatim into benchmarks/results/ is a record of its day and is not
held to today's names.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from coldbench.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Paths of the machine the docs were written on, never of a reader's.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home)/")
CODE_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\s*\n))+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every code span and every line of a fenced block, shell line
    continuations joined."""
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        joined = re.sub(r"\\\n\s*", " ", block.group(1))
        for offset, line in enumerate(joined.splitlines()):
            yield first + offset, line
    outside = FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    # an indented code block: lines of four spaces or more after a blank line
    lines = outside.splitlines()
    in_block = False
    for number, line in enumerate(lines, 1):
        previous_blank = number == 1 or not lines[number - 2].strip()
        in_block = line.startswith("    ") and (in_block or previous_blank)
        if in_block:
            yield number, line.strip()
    for span in CODE_SPAN.finditer(outside):
        yield outside.count("\n", 0, span.start()) + 1, " ".join(span.group(1).split())


def _braces(path: str) -> list[str]:
    """A shell's brace expansion of one `{a,b}` group at a time: `x-{a,b}.json`."""
    group = re.search(r"\{([^{}]*)\}", path)
    if group is None:
        return [path]
    return [
        expanded
        for choice in group.group(1).split(",")
        for expanded in _braces(path[: group.start()] + choice + path[group.end() :])
    ]


def _command_tree() -> dict[tuple[str, ...], set[str]]:
    """Every `coldbench` command path and the options it takes."""
    tree: dict[tuple[str, ...], set[str]] = {("version",): {"--help"}}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        options = {"--help"}
        for param in command.params:
            options.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("-"))
        tree[path] = options
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    for name, entry in COMMANDS.items():
        if name == "version":
            continue
        group = typer.main.get_command(
            getattr(importlib.import_module(entry.module), entry.attribute)
        )
        commands = getattr(group, "commands", {})
        walk(commands.get(name, group), (name,))
    return tree


@pytest.fixture(scope="module")
def command_tree() -> dict[tuple[str, ...], set[str]]:
    return _command_tree()


def test_the_docs_name_no_path_of_this_machine() -> None:
    found = [
        f"{_name(doc)}:{number}: {line.strip()}"
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert found == []


def test_every_relative_link_and_image_resolves() -> None:
    broken = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+://|#|mailto:", target):
                    continue
                if not (doc.parent / target.split("#")[0]).exists():
                    broken.append(f"{_name(doc)}:{number}: {target}")
    assert broken == []


def test_every_coldbench_command_in_the_docs_exists_with_the_options_it_is_given(
    command_tree: dict[tuple[str, ...], set[str]],
) -> None:
    problems = []
    for doc in DOCS:
        for number, code in _code(doc.read_text()):
            # a quoted argument (a server's own argv) carries options of another program
            code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", code)
            for call in re.finditer(
                r"(?<![\w./<-])coldbench ([a-z][a-z-]*)((?: [a-z][a-z-]*)?)", code
            ):
                first, second = call.group(1), call.group(2).strip()
                if (first,) not in command_tree:
                    problems.append(f"{_name(doc)}:{number}: no command `coldbench {first}`")
                    continue
                path = (first, second) if (first, second) in command_tree else (first,)
                rest = code[call.end() if len(path) == 2 else call.start(2) :]
                rest = re.split(r"\s(?:&&|\|\||\||;)\s|(?<![\w./-])coldbench ", rest)[0]
                for option in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", rest):
                    if option not in command_tree[path]:
                        problems.append(
                            f"{_name(doc)}:{number}: `coldbench {' '.join(path)}` has no {option}"
                        )
    assert problems == []


def test_every_module_and_name_under_coldbench_the_docs_give_exists() -> None:
    missing = []
    for doc in DOCS:
        for number, code in _code(doc.read_text()):
            for dotted in re.findall(r"(?<![\w./-])(coldbench(?:\.[A-Za-z_]\w*)+)", code):
                parts = dotted.split(".")
                for cut in range(len(parts), 0, -1):
                    try:
                        found: Any = importlib.import_module(".".join(parts[:cut]))
                        break
                    except ModuleNotFoundError:
                        continue
                for attribute in parts[cut:]:
                    if not hasattr(found, attribute):
                        missing.append(f"{_name(doc)}:{number}: {dotted}")
                        break
                    found = getattr(found, attribute)
    # `coldbench.record/1` and `coldbench.evidence/1` are format names, not modules
    assert [m for m in missing if not re.search(r"coldbench\.(record|evidence)$", m)] == []


def test_every_file_and_test_the_docs_name_exists() -> None:
    missing = []
    pattern = re.compile(
        r"(?<![\w./-])((?:api|engine|kernels|evidence|worker|web|migrations|coldbench|tests|"
        r"benchmarks|docs|\.ci)/[\w./*{},-]*[\w*}])((?:::\w+)*)"
    )
    for doc in DOCS:
        text = doc.read_text().replace("::\n", "::")  # a test id wrapped after its file
        for number, line in enumerate(text.splitlines(), 1):
            for path, node in pattern.findall(line):
                if path.startswith("tests/_artifacts"):  # what the tests write (git-ignored)
                    continue
                if "*" in path or "{" in path:
                    missing += [
                        f"{_name(doc)}:{number}: {each} matches nothing"
                        for each in _braces(path)
                        if not list(ROOT.glob(each))
                    ]
                    continue
                if not (ROOT / path).exists() and not (doc.parent / path).exists():
                    missing.append(f"{_name(doc)}:{number}: {path}")
                    continue
                for name in filter(None, node.split("::")):
                    if not re.search(
                        rf"^\s*(?:async )?(?:def|class) {name}\b",
                        (ROOT / path).read_text(),
                        re.MULTILINE,
                    ):
                        missing.append(f"{_name(doc)}:{number}: {path}::{name}")
    assert missing == []


def test_every_section_a_doc_points_to_exists() -> None:
    """`docs/X.md, "Heading"`: X has a heading that holds the quoted words."""
    missing = []
    sources = [*DOCS, *ROOT.glob("*/**/*.py")]
    for source in sources:
        if ".venv" in source.parts or "tests" in source.relative_to(ROOT).parts[:1]:
            continue
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", source.read_text())
        for doc, section in re.findall(r'((?:docs/)?[A-Z]+\.md)[,:]? (?:section )?"([^"]+)"', text):
            target = (
                ROOT / doc if doc.startswith("docs/") or doc == "README.md" else ROOT / "docs" / doc
            )
            if not target.exists():
                missing.append(f"{_name(source)}: {doc} does not exist")
                continue
            headings = [
                line.lstrip("#").strip().lower()
                for line in target.read_text().splitlines()
                if line.startswith("#")
            ]
            if not any(section.lower() in heading for heading in headings):
                missing.append(f'{_name(source)}: {doc}, "{section}"')
    assert missing == []


def test_commands_md_names_every_command_and_option(
    command_tree: dict[tuple[str, ...], set[str]],
) -> None:
    """docs/COMMANDS.md says it has every command and option: each command path is written out
    (`coldbench db upgrade|downgrade|check` names three) and each option appears in it."""
    text = (ROOT / "docs" / "COMMANDS.md").read_text()
    unnamed = []
    for path, options in sorted(command_tree.items()):
        *parent, last = path
        written = r"\s+".join(["coldbench", *parent, rf"(?:[a-z-]+\|)*{last}\b"])
        if not re.search(written, text):
            unnamed.append(f"coldbench {' '.join(path)}")
        for option in sorted(options - {"--help", "--install-completion", "--show-completion"}):
            # a flag's negation (`--no-wait`) goes with the flag it negates
            shown = re.sub(r"^--no-", "--", option)
            if not re.search(rf"(?<![\w-]){re.escape(shown)}(?![\w-])", text):
                unnamed.append(f"coldbench {' '.join(path)} {option}")
    assert unnamed == []


def _toml_blocks(doc: str) -> list[str]:
    text = (ROOT / "docs" / doc).read_text()
    return re.findall(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("doc", ["worker.md", "COMMANDS.md"])
def test_the_worker_toml_of_a_doc_is_one_a_host_accepts(doc: str, tmp_path: Path) -> None:
    """Each `worker.toml` a doc shows loads as written, but for the files it names (a corpus
    must exist: here it is a file of this test's own)."""
    from coldbench.worker.config import load_host_config

    blocks = _toml_blocks(doc)
    assert blocks
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a corpus\n")
    for block in blocks:
        config = tmp_path / "worker.toml"
        config.write_text(re.sub(r'^(\w+) = "/[^"]+\.txt"', rf'\1 = "{corpus}"', block, flags=re.M))
        host = load_host_config(config)
        assert host.name and host.repositories


def test_the_github_configuration_in_the_docs_is_one_the_service_accepts() -> None:
    import tomllib

    from coldbench.api.github.config import GitHubConfig

    (block,) = _toml_blocks("github.md")
    # the example's secret is a placeholder ("..."); the service needs 16 characters or more
    raw = tomllib.loads(
        block.replace('webhook_secret = "..."', 'webhook_secret = "' + "s" * 16 + '"')
    )
    config = GitHubConfig.model_validate(raw)
    assert list(config.repositories) == ["ml-explore/mlx-lm"]


def test_every_benchmark_command_names_a_script_and_its_options() -> None:
    """`python -m benchmarks.NAME --option ...`: benchmarks/NAME.py exists and declares each
    option (argparse's `add_argument("--option"`)."""
    problems = []
    for doc in DOCS:
        for number, code in _code(doc.read_text()):
            for call in re.finditer(r"-m benchmarks\.(\w+)([^|;&]*)", code):
                script = ROOT / "benchmarks" / f"{call.group(1)}.py"
                if not script.exists():
                    problems.append(f"{_name(doc)}:{number}: no benchmarks/{script.name}")
                    continue
                declared = set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", script.read_text()))
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", call.group(2)):
                    if option not in declared | {"--help"}:
                        problems.append(f"{_name(doc)}:{number}: {script.name} has no {option}")
    assert problems == []
