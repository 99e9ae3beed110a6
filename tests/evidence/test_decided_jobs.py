"""The tally of jobs measured until decided (benchmarks/decided_jobs.py): each kind is scored by
the verdict it should reach, a failed job counts against its kind, a claim in an A/A is a wrong
claim, and a malformed line is refused with its place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.decided_jobs import main, read_jobs, tally


def _job(kind: str, verdict: str, ratio: float, *, taken: int = 1, wall: float = 100.0) -> dict:
    return {
        "pair": 1,
        "kind": kind,
        "ok": True,
        "verdicts": [{"verdict": verdict, "ratio": ratio, "ci": [ratio - 0.01, ratio + 0.01]}],
        "sequential": {"taken": taken, "stopped": f"every comparison decided at look {taken}"},
        "time_to_first_evidence_s": wall - 10,
        "wall_s": wall,
    }


def test_each_kind_is_scored_by_the_verdict_it_should_reach(tmp_path: Path) -> None:
    jobs = [
        _job("ab", "slower", 0.98, taken=2, wall=220),
        _job("ab", "faster", 1.02, wall=120),
        {"pair": 3, "kind": "ab", "ok": False},
        _job("aa", "no established change", 1.0, wall=110),
        _job("aa", "slower", 0.97, wall=130),
    ]
    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    first.write_text("\n".join(json.dumps(job) for job in jobs[:3]) + "\n\n")
    second.write_text("\n".join(json.dumps(job) for job in jobs[3:]) + "\n")

    tallies = tally(read_jobs([first, second]))

    ab, aa = tallies["ab"], tallies["aa"]
    assert (ab.jobs, ab.as_expected, ab.wrong_sign) == (3, 1, 1)
    assert ab.verdicts["no evidence"] == 1
    assert dict(ab.looks_taken) == {2: 1, 1: 1}
    assert (aa.jobs, aa.as_expected, aa.wrong_sign) == (2, 1, 1)
    report = ab.report()
    assert report["wall_s"] == {"median": 170.0, "min": 120.0, "max": 220.0}
    low, high = report["as_expected_interval"]
    assert 0 < low < 1 / 3 < high < 1


def test_the_printed_tally_and_its_json_agree(tmp_path: Path, capsys) -> None:
    lines = tmp_path / "alternate.jsonl"
    lines.write_text(json.dumps(_job("aa", "no established change", 1.001)) + "\n")
    out = tmp_path / "tally.json"

    main([str(lines), "--json", str(out)])

    printed = capsys.readouterr().out
    assert "A/A: `no established change` in 1 of 1 jobs" in printed
    assert json.loads(out.read_text())["aa"]["as_expected"] == 1


def test_a_malformed_line_is_refused_with_its_place(tmp_path: Path) -> None:
    lines = tmp_path / "alternate.jsonl"
    lines.write_text(json.dumps(_job("ab", "slower", 0.98)) + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"alternate.jsonl:2: not a JSON line"):
        read_jobs([lines])
    lines.write_text(json.dumps({"kind": "abc"}) + "\n")
    with pytest.raises(SystemExit, match=r":1: a job line needs a kind of ab or aa"):
        read_jobs([lines])
    with pytest.raises(SystemExit, match="no such file"):
        main([str(tmp_path / "missing.jsonl")])


def test_a_decided_step_file_is_tallied_as_the_kind_it_is_given(tmp_path: Path, capsys) -> None:
    step = tmp_path / "decided.jsonl"
    job = _job("ab", "slower", 0.983, taken=2)
    del job["kind"], job["pair"]
    step.write_text(json.dumps(job) + "\n")
    alternate = tmp_path / "alternate.jsonl"
    alternate.write_text(json.dumps(_job("ab", "slower", 0.98, taken=3)) + "\n")

    main(["--ab", str(step), str(alternate)])

    assert "A/B: `slower` in 2 of 2 jobs" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"decided.jsonl:1: a job line needs a kind"):
        read_jobs([step])
    alternate.write_text(json.dumps(_job("aa", "no established change", 1.0)) + "\n")
    with pytest.raises(SystemExit, match=r"alternate.jsonl:1: a job of kind aa, given as ab"):
        read_jobs([alternate], "ab")
