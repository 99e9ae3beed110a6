"""Host corpora: worker.toml's `[corpora]`, jobs naming one, and a run that records which ran."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from coldbench.engine import corpus as engine_corpus
from coldbench.evidence.contract import schemas
from coldbench.evidence.contract.records import read_records
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.worker.config import ConfigError, parse_host_config
from coldbench.worker.run import RunRefused, check_job


def _code(path: Path) -> Path:
    path.write_text(
        "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(300)), encoding="utf-8"
    )
    return path


def test_the_corpus_name_rule_is_one_rule() -> None:
    # engine/ cannot import evidence/: the two copies must say the same
    assert schemas.CORPUS_NAME_PATTERN == engine_corpus.CORPUS_NAME_PATTERN
    assert schemas.BUILTIN_CORPUS == engine_corpus.BUILTIN


def test_worker_toml_corpora_become_labels(tmp_path: Path) -> None:
    _code(tmp_path / "code.py")
    config = parse_host_config(
        {"name": "box", "labels": ["lab:1"], "corpora": {"code": "code.py"}}, base=tmp_path
    )
    assert config.corpora == {"code": (tmp_path / "code.py").resolve()}
    assert config.labels == ("lab:1", "corpus:code")


@pytest.mark.parametrize(
    ("corpora", "message"),
    [
        ({"code": "missing.txt"}, "corpora.code: .* is not a file"),
        ({"builtin": "code.py"}, "not 'builtin'"),
        ({"a+b": "code.py"}, "corpora.a\\+b: a plain name"),
        ({"code": 3}, "the path of a UTF-8 text file"),
    ],
)
def test_bad_corpora_are_one_line(tmp_path: Path, corpora: dict, message: str) -> None:
    _code(tmp_path / "code.py")
    with pytest.raises(ConfigError, match=message):
        parse_host_config({"name": "box", "corpora": corpora}, base=tmp_path)


def test_a_job_naming_a_corpus_the_host_lacks_is_refused(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {"variants": [{"name": "a"}], "contexts": [64], "rounds": 3, "corpus": "x"}
    )
    with pytest.raises(RunRefused, match=r"corpus 'x' is not on this host \(.*names: code\)"):
        check_job(spec, {}, {"code": _code(tmp_path / "code.py")})
    check_job(spec.model_copy(update={"corpus": "builtin"}), {}, {})
    with pytest.raises(ValueError, match="corpus"):
        JobSpec.model_validate(
            {"variants": [{"name": "a"}], "contexts": [64], "rounds": 3, "corpus": "/etc"}
        )


@pytest.mark.slow
def test_run_with_a_host_corpus_records_it(coldbench_cmd: list[str], tmp_path: Path) -> None:
    file = _code(tmp_path / "code.py")
    out = tmp_path / "bundle"
    done = subprocess.run(
        [
            *coldbench_cmd,
            "run",
            *("--contexts", "64", "--rounds", "2", "--decode-tokens", "1"),
            *("--corpus", f"code={file}", "--out", str(out), "--state-dir", str(tmp_path / "s")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    records = read_records(out / "records.jsonl")
    assert records and {r.prompt_corpus_sha256 for r in records} == {digest}
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["corpus"]["name"] == "code" and provenance["corpus"]["sha256"] == digest
    assert provenance["corpus"]["source"] == "host"
    assert json.loads((out / "job.json").read_text())["corpus"] == "code"
    summary_md = (out / "summary.md").read_text()
    assert f"- Prompts: host corpus `code`, sha256 `{digest[:16]}`" in summary_md
    assert re.search(r"\| 64 \| base \| 2 \| [\d,.]+ \| [\d.]+ \| [\d.]+ MiB \|", summary_md)
