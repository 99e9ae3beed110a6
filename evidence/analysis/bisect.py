"""Bisection: which commit between a good and a bad one made a context slower (or faster).

Each step is a run of its own, pairing `lo` (known good), `mid` and `hi` (known bad) inside
every round; its ratios are mid / lo and hi / lo with their 95% intervals. The step decides:

- `hi` must still be `direction` against `lo` (its interval excludes 1 on that side), else
  the change is not a single step between them;
- `mid` like `hi` (its interval excludes 1 on the `direction` side and overlaps hi's): the
  change is in (lo, mid] -> `lower`;
- `mid` like `lo` (not `direction`: its interval includes 1, or excludes it on the other side,
  and does not overlap hi's): in (mid, hi] -> `upper`. As in `git bisect`, "good" means "not
  bad": a mid established the other way (faster while the search is for slower) shows nothing
  `direction` happened by mid, and on a noisy host identical code can read so;
- anything else (between the two, or overlapping both): not a single step, or too noisy to
  tell -> stop and say so;
- with no `mid` (lo and hi are neighbours) the first `direction` commit is `hi`, its parent
  `lo` -> `found`; and `mid` like `hi` where `mid` is lo's child -> `found` at `mid` (the next
  step would measure that very pair again);
- hi's or mid's interval below 95% (too few pairs or process pairs for one, `ci_level` set,
  `coldbench.evidence.analysis.stats`) decides nothing -> `too few pairs`, and the bisection stops
  saying how many it had and how many a decision needs.

One rule in one place: a step's commits are `BisectSpec.step_commits` of its `line`, its
decision `decide_step`, the next step's line `next_line`, its spec `step_spec`. The local runner
(`coldbench run --mode bisect`) and the service (api/jobs/bisect.py) both call these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coldbench.evidence.analysis.stats import MIN_PAIRS, intervals_overlap
from coldbench.evidence.contract.schemas import BisectStep, JobSpec, Provenance
from coldbench.evidence.contract.summary_schema import (
    Bisect,
    BisectStepEntry,
    Comparison,
    StepResult,
    level_field,
)

Decision = str  # "lower" | "upper" | "found" | "not a single step" | "too few pairs"
# The decisions that end a bisection.
FINAL_DECISIONS = ("found", "not a single step", "too few pairs")
# A step that halves the line or names the commit: where a step measuring until decided stops.
STEP_DECIDED = ("lower", "upper", "found")


def _result(comparison: Comparison | None) -> StepResult | None:
    if comparison is None:
        return None
    return StepResult(
        ratio_median=comparison.ratio_median,
        ci_low=comparison.ci_low,
        ci_high=comparison.ci_high,
        verdict=comparison.verdict,
        n=comparison.n,
        **level_field(comparison.ci_level),
    )


def _interval(result: StepResult | None) -> tuple[float, float] | None:
    if not result or result.ci_low is None or result.ci_high is None:
        return None
    return (result.ci_low, result.ci_high)


def _too_few(name: str, result: StepResult | None) -> str | None:
    """Why `result`'s interval cannot decide a step (None: it can, or it has none)."""
    if result is None or result.n == 0 or _interval(result) is not None:
        return None
    return (
        f"{name} has {result.n} pairs, too few independent units for an interval "
        f"({MIN_PAIRS} independent pairs or process pairs give one): run the step with more "
        "rounds"
    )


def _excludes_one(interval: tuple[float, float], direction: str) -> bool:
    return interval[1] < 1 if direction == "slower" else interval[0] > 1


def decide_step(
    mid: StepResult | None,
    hi: StepResult | None,
    direction: str,
    has_mid: bool,
    *,
    mid_is_lo_child: bool = False,
) -> tuple[Decision, str]:
    """(decision, why) from mid/lo and hi/lo results (the module docstring's rules);
    `mid_is_lo_child`: lo and mid are neighbours on the line."""
    too_few = _too_few("hi", hi) or (_too_few("mid", mid) if has_mid else None)
    if too_few:
        return "too few pairs", too_few
    hi_interval = _interval(hi)
    if hi_interval is None or not _excludes_one(hi_interval, direction):
        return "not a single step", (
            f"hi is not established {direction} than lo (interval "
            f"{_fmt(hi_interval)}): the change is not a single step between them, or too "
            "small for these rounds"
        )
    if not has_mid:
        return "found", f"hi is {direction} than its parent lo (interval {_fmt(hi_interval)})"
    mid_interval = _interval(mid)
    if mid_interval is None:
        return "not a single step", "mid has no interval (no valid pairs)"
    like_hi = _excludes_one(mid_interval, direction) and intervals_overlap(
        mid_interval, hi_interval
    )
    like_lo = not _excludes_one(mid_interval, direction) and not intervals_overlap(
        mid_interval, hi_interval
    )
    if like_hi and mid_is_lo_child:
        return "found", (
            f"mid is {direction} like hi ({_fmt(mid_interval)}) and is lo's child: the first "
            f"{direction} commit (this step measured it against its parent)"
        )
    if like_hi:
        return "lower", f"mid is {direction} like hi ({_fmt(mid_interval)})"
    if like_lo:
        return "upper", f"mid is like lo ({_fmt(mid_interval)} is not {direction})"
    return "not a single step", (
        f"mid's interval {_fmt(mid_interval)} lies between or overlaps both lo (1) and hi "
        f"({_fmt(hi_interval)}): the change is not a single step, or too noisy to tell"
    )


def next_line(line: Sequence[str], decision: Decision) -> list[str] | None:
    """The next step's line after `decision` on `line` (None: the bisection has ended).

    `lower`: the change is in (lo, mid], so lo..mid; `upper`: in (mid, hi], so mid..hi."""
    if len(line) <= 2 or decision not in ("lower", "upper"):
        return None
    mid = (len(line) - 1) // 2  # BisectSpec.mid_index
    return list(line[: mid + 1]) if decision == "lower" else list(line[mid:])


def step_spec(spec: JobSpec, line: Sequence[str], steps: Sequence[BisectStep]) -> JobSpec:
    """The job spec of the step over `line` after `steps`: the bisection's spec (as submitted,
    or any earlier step's) with lo, (mid,) hi of `line` as variants, each in the one
    configuration (flags and recipe) of the bisection's first variant."""
    assert spec.bisect is not None
    template = spec.variants[0]
    bisect = spec.bisect.model_copy(update={"line": list(line), "steps": list(steps)})
    lo, mid, hi = bisect.step_commits()
    picked = [("lo", lo), *([("mid", mid)] if mid else []), ("hi", hi)]
    raw = spec.model_dump(mode="json", by_alias=True)
    raw["variants"] = [
        {
            "name": f"{role}-{commit[:10]}",
            "ref": commit,
            "recipe": template.recipe,
            "flags": dict(template.flags),
        }
        for role, commit in picked
    ]
    raw["baseline"] = None
    raw["bisect"] = bisect.model_dump(mode="json")
    return JobSpec.model_validate(raw)


def _fmt(interval: tuple[float, float] | None) -> str:
    return "n/a" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _step_results(
    spec: JobSpec, comparisons: Sequence[Comparison]
) -> tuple[StepResult | None, StepResult | None]:
    """(mid / lo, hi / lo) of a step's comparisons; mid None where lo and hi are neighbours."""
    _lo, *rest = spec.variants
    mid = rest[0] if len(rest) == 2 else None
    by_variant = {c.variant: c for c in comparisons}
    mid_result = _result(by_variant.get(mid.name)) if mid else None
    return mid_result, _result(by_variant.get(rest[-1].name))


def step_decision(spec: JobSpec, comparisons: Sequence[Comparison]) -> tuple[Decision, str]:
    """The decision of the step `spec` measures, from its prefill comparisons (`decide_step`):
    what its summary states, and what a step measuring until decided stops on."""
    assert spec.bisect is not None  # JobSpec's rule for mode bisect
    mid_result, hi_result = _step_results(spec, comparisons)
    has_mid = len(spec.variants) == 3
    line = spec.bisect.line or []
    return decide_step(
        mid_result,
        hi_result,
        spec.bisect.direction,
        has_mid,
        # lo..mid would be the next line: two neighbours, the pair this step measured
        mid_is_lo_child=has_mid and len(next_line(line, "lower") or []) == 2,
    )


def bisect_section(
    *,
    spec: JobSpec,
    comparisons: Sequence[Comparison],
    provenances: Sequence[Provenance],
) -> Bisect:
    """summary.json's `bisect`: this step's commits, results and decision; when it ends the
    bisection, `first_bad_commit` (full sha, or None with `reason`), its parent and ratio."""
    assert spec.bisect is not None  # JobSpec's rule for mode bisect
    commits = {t.variant: t.commit for p in provenances for t in p.targets if t.commit is not None}
    subjects = {t.variant: t.subject for p in provenances for t in p.targets}
    lo, *rest = spec.variants
    mid = rest[0] if len(rest) == 2 else None
    hi = rest[-1]
    mid_result, hi_result = _step_results(spec, comparisons)
    decision, why = step_decision(spec, comparisons)
    lo_commit, hi_commit = commits.get(lo.name, lo.ref), commits.get(hi.name, hi.ref)
    found = decision == "found"
    final = decision in FINAL_DECISIONS
    # found at mid (lo's child) or at hi (lo and hi neighbours)
    bad = mid if found and mid is not None else hi
    bad_result = mid_result if found and mid is not None else hi_result
    return Bisect(
        good=spec.bisect.good,
        bad=spec.bisect.bad,
        direction=spec.bisect.direction,
        context_tokens=spec.contexts[0],
        step=len(spec.bisect.steps) + 1,
        lo=lo_commit,
        mid=commits.get(mid.name, mid.ref) if mid else None,
        hi=hi_commit,
        mid_result=mid_result,
        hi_result=hi_result,
        decision=decision,
        why=why,
        final=final,
        first_bad_commit=commits.get(bad.name, bad.ref) if found else None,
        parent=lo_commit if found else None,
        subject=subjects.get(bad.name) if found else None,
        ratio=bad_result if found else None,
        reason=None if found else (why if final else "bisection not finished"),
        steps=[BisectStepEntry(**step.model_dump()) for step in spec.bisect.steps],
        # commits from lo to hi on the first-parent line (this step's stretch of good..bad)
        commits_apart=len(spec.bisect.line) - 1 if spec.bisect.line else None,
    )


def bisect_sentences(bisect: Bisect, text: Callable[[object], str] = str) -> list[str]:
    """The answer first for a bisection step or its end; `text` formats what a host wrote
    (the first bad commit's subject) as `history_sentences` does."""
    where = f"at {bisect.context_tokens} tokens"
    if bisect.first_bad_commit:
        ratio = bisect.ratio
        # A found step's ratio is hi's or mid's, whose interval excluded 1 (decide_step).
        assert ratio is not None and ratio.ratio_median is not None
        assert ratio.ci_low is not None and ratio.ci_high is not None
        change = abs(ratio.ratio_median - 1) * 100
        subject = f' "{text(bisect.subject)}"' if bisect.subject else ""
        return [
            f"First {bisect.direction} commit {where}: {bisect.first_bad_commit}{subject} "
            f"({change:.1f}% {bisect.direction} than its parent {bisect.parent}, 95% "
            f"interval of the ratio [{ratio.ci_low:.3f}, {ratio.ci_high:.3f}]), after "
            f"{bisect.step} step{'s' if bisect.step != 1 else ''}."
        ]
    if bisect.decision == "too few pairs":
        return [f"Bisection stopped at step {bisect.step} {where}: {bisect.reason}."]
    if bisect.final:
        return [f"No single first {bisect.direction} commit {where}: {bisect.reason}."]
    return [
        f"Step {bisect.step} {where}: {bisect.why}; the search continues in the "
        f"{'lower' if bisect.decision == 'lower' else 'upper'} half."
    ]
