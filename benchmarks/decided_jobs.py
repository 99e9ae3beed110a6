"""Tally jobs measured until decided: how often each kind got the verdict it should (not a test).

Reads the JSON lines that `benchmarks/device_session.sh alternate` writes, one per job of
`benchmarks/host_e2e.py --until decided` with its `pair` and `kind` (`ab`: the two refs, `aa`:
the first ref against itself), from one or more files (device sessions append, so several
files make one tally), and prints, per kind: how many jobs ended with each verdict, the rate of
the verdict that kind should reach (`slower` for an A/B of a planted slowdown, `no established
change` for an A/A) with its exact 95% interval (Clopper-Pearson, as benchmarks/aa_simulation.py
states its rates), wrong-sign claims, the looks taken and why each run stopped, and the median
and range of time to evidence (submission to the evidence's page) and of GPU time (the job's
wall on the host machine).

    python -m benchmarks.decided_jobs alternate.jsonl [more.jsonl ...]
    python -m benchmarks.decided_jobs --expect-ab faster --json tally.json alternate.jsonl
    python -m benchmarks.decided_jobs --ab decided.jsonl --aa decided-aa.jsonl alternate.jsonl

`--ab` and `--aa` take the files of the `decided` and `decided-aa` steps, whose lines carry no
kind: the option names it.

A job that failed (`"ok": false`, or no verdict) counts against its kind: a job that gives no
evidence did not decide.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.aa_simulation import proportion_interval

A_A_VERDICT = "no established change"
WRONG_SIGN = {"slower": "faster", "faster": "slower"}


@dataclass
class KindTally:
    """What the jobs of one kind showed."""

    kind: str
    expected: str
    jobs: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    stopped: Counter[str] = field(default_factory=Counter)
    looks_taken: Counter[int] = field(default_factory=Counter)
    time_to_evidence_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    @property
    def as_expected(self) -> int:
        return self.verdicts[self.expected]

    @property
    def wrong_sign(self) -> int:
        """Claims opposite to the planted effect (an A/A has no sign: any claim is wrong)."""
        if self.expected == A_A_VERDICT:
            return self.verdicts["slower"] + self.verdicts["faster"]
        return self.verdicts[WRONG_SIGN.get(self.expected, "")]

    def report(self) -> dict[str, Any]:
        low, high = proportion_interval(self.as_expected, self.jobs)
        return {
            "kind": self.kind,
            "expected": self.expected,
            "jobs": self.jobs,
            "verdicts": dict(self.verdicts),
            "stopped": dict(self.stopped),
            "looks_taken": {str(look): n for look, n in sorted(self.looks_taken.items())},
            "ratios": self.ratios,
            "as_expected": self.as_expected,
            "as_expected_interval": [low, high],
            "wrong_sign": self.wrong_sign,
            "time_to_evidence_s": _spread(self.time_to_evidence_s),
            "wall_s": _spread(self.wall_s),
        }


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def read_jobs(paths: Iterable[Path], kind: str | None = None) -> list[dict[str, Any]]:
    """Every job line of the files, in order; a line that is not a JSON object is an error.
    `kind` (ab or aa) is the kind of lines that carry none; a line of another kind is an error."""
    jobs = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                job = json.loads(line)
            except json.JSONDecodeError as error:
                raise SystemExit(f"{path}:{number}: not a JSON line ({error.msg})") from None
            if not isinstance(job, dict):
                raise SystemExit(f"{path}:{number}: a job line must be a JSON object")
            if kind is not None:
                if job.setdefault("kind", kind) != kind:
                    raise SystemExit(
                        f"{path}:{number}: a job of kind {job['kind']}, given as {kind}"
                    )
            elif job.get("kind") not in ("ab", "aa"):
                raise SystemExit(f"{path}:{number}: a job line needs a kind of ab or aa")
            jobs.append(job)
    return jobs


def tally(jobs: Iterable[dict[str, Any]], expect_ab: str = "slower") -> dict[str, KindTally]:
    """The jobs' verdicts by kind (each job of these runs has one comparison at one context)."""
    tallies = {"ab": KindTally("ab", expect_ab), "aa": KindTally("aa", A_A_VERDICT)}
    for job in jobs:
        kind = tallies[job["kind"]]
        kind.jobs += 1
        verdicts = job.get("verdicts") or []
        if not job.get("ok") or not verdicts:
            kind.verdicts["no evidence"] += 1
            continue
        for verdict in verdicts:
            kind.verdicts[verdict["verdict"]] += 1
            kind.ratios.append(round(verdict["ratio"], 4))
        sequential = job.get("sequential") or {}
        kind.stopped[sequential.get("stopped", "not measuring until decided")] += 1
        if "taken" in sequential:
            kind.looks_taken[sequential["taken"]] += 1
        if job.get("time_to_first_evidence_s") is not None:
            kind.time_to_evidence_s.append(job["time_to_first_evidence_s"])
        if job.get("wall_s") is not None:
            kind.wall_s.append(job["wall_s"])
    return tallies


def _text(tallies: dict[str, KindTally]) -> str:
    lines = []
    for kind in tallies.values():
        if not kind.jobs:
            continue
        report = kind.report()
        low, high = report["as_expected_interval"]
        name = "A/B" if kind.kind == "ab" else "A/A"
        lines.append(
            f"{name}: `{kind.expected}` in {kind.as_expected} of {kind.jobs} jobs "
            f"({100 * kind.as_expected / kind.jobs:.0f}%, 95% [{100 * low:.0f}, {100 * high:.0f}]),"
            f" wrong-sign claims {kind.wrong_sign}"
        )
        lines.append("  verdicts: " + ", ".join(f"{v} {n}" for v, n in kind.verdicts.most_common()))
        lines.append(
            "  looks taken: "
            + ", ".join(f"{n} job(s) at look {look}" for look, n in report["looks_taken"].items())
        )
        for reason, n in kind.stopped.most_common():
            lines.append(f"  stopped ({n}): {reason}")
        for label, key in (("time to evidence", "time_to_evidence_s"), ("GPU wall", "wall_s")):
            if spread := report[key]:
                lines.append(
                    f"  {label}: median {spread['median']} s"
                    f" (range {spread['min']}-{spread['max']} s)"
                )
        if kind.ratios:
            lines.append(f"  ratios: {min(kind.ratios):.4f} to {max(kind.ratios):.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", type=Path, help="alternate.jsonl files")
    parser.add_argument(
        "--ab",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a file of the decided step: every line an A/B job",
    )
    parser.add_argument(
        "--aa",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a file of the decided-aa step: every line an A/A job",
    )
    parser.add_argument("--expect-ab", default="slower", choices=("slower", "faster"))
    parser.add_argument("--json", type=Path, help="also write the tally as JSON")
    args = parser.parse_args(argv)
    given = [*args.jobs, *args.ab, *args.aa]
    if not given:
        parser.error("give at least one file")
    missing = [str(p) for p in given if not p.is_file()]
    if missing:
        raise SystemExit(f"no such file: {', '.join(missing)}")
    jobs = [*read_jobs(args.jobs), *read_jobs(args.ab, "ab"), *read_jobs(args.aa, "aa")]
    tallies = tally(jobs, expect_ab=args.expect_ab)
    print(_text(tallies))
    if args.json:
        report = {name: kind.report() for name, kind in tallies.items()}
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
