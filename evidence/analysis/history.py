"""History: one configuration over a repository's commits, each against one reference commit.

Every commit is a variant paired with the reference commit inside every round (rotated, cold),
so each point is the paired ratio commit / reference with its 95% interval: the same comparison
an A/B verdict rests on, not a raw tok/s from another hour. A *step* is where two neighbouring
measured commits' intervals do not overlap: the performance changed between them. The reference
is the first of them, at ratio 1 exactly: the first commit measured is a step after it where
its verdict against the reference is `faster` or `slower` (the A/B rule: its interval,
corrected for the matrix, off 1), so a change at the first commit is found too. Commits that
did not build or load are listed with the reason and skipped, and so is, for the step rule, a
commit with too few pairs for an interval (`coldbench.evidence.analysis.stats`); the next measured
commit is the neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from coldbench.evidence.analysis.stats import intervals_overlap
from coldbench.evidence.contract.schemas import JobSpec, Provenance, TargetInfo
from coldbench.evidence.contract.summary_schema import (
    CLAIMS,
    CommitRef,
    Comparison,
    History,
    HistoryChangePoint,
    HistoryCommit,
    HistoryPoint,
    HistorySeries,
    HistoryStep,
    decisive_interval,
    level_field,
)

STEP_RULE = (
    "a step is a pair of neighbouring measured commits whose 95% intervals of the paired ratio "
    "to the reference do not overlap; the first commit is a step after the reference (ratio 1) "
    "where its verdict against it is faster or slower; a commit with too few pairs for an "
    "interval is no one's neighbour"
)


# Change points (ruptures' PELT, the exact segmentation under a penalty): a step is one commit's
# change, which the paired rule above names; a slow drift moves every neighbouring pair less
# than their intervals, so the rule never fires, yet the series' level after it is not the
# level before. The library finds where the level changes; a change point the rule names is a
# step, one it does not is a drift.
CHANGE_POINT_PENALTY = 3.0
CHANGE_POINT_MIN_SIZE = 2
CHANGE_POINT_RULE = (
    "change points: ruptures' PELT with an l2 cost on each context's log paired ratios in "
    "commit order (the reference first, at 0), penalty "
    f"{CHANGE_POINT_PENALTY:g} x sigma^2 x ln(n) (sigma: the median standard error of a "
    f"point, from its 95% interval), levels of at least {CHANGE_POINT_MIN_SIZE} points; a "
    "change point where the step rule names a step (that commit or its neighbour) is a step, "
    "any other a drift: the level moved over several commits without one neighbouring pair "
    "whose intervals part"
)


def change_points(
    context: int,
    points: Sequence[tuple[str, str | None, float, tuple[float, float] | None]],
    steps: Sequence[HistoryStep],
) -> list[HistoryChangePoint]:
    """The change points of one context's series: `points` are (variant, commit, median
    ratio, 95% interval), the reference first (ratio 1, no interval)."""
    import ruptures

    if len(points) < 2 * CHANGE_POINT_MIN_SIZE:
        return []
    signal = np.log(np.array([ratio for _, _, ratio, _ in points], dtype=float))
    errors = [
        (math.log(high) - math.log(low)) / (2 * 1.96)
        for _, _, _, interval in points
        if interval is not None
        for low, high in [interval]
        if low > 0 and high > low
    ]
    if not errors:
        return []
    sigma = float(np.median(errors))
    penalty = CHANGE_POINT_PENALTY * sigma**2 * math.log(len(points))
    cuts = ruptures.Pelt(model="l2", min_size=CHANGE_POINT_MIN_SIZE, jump=1).fit(signal)
    ends = [int(end) for end in cuts.predict(pen=penalty)]
    stepped = {step.to_variant for step in steps if step.context_tokens == context}
    names = [variant for variant, _, _, _ in points]
    found = []
    starts = [0, *ends[:-1]]
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if start == 0:
            continue
        before_start = starts[index - 1]
        near = {names[i] for i in (start - 1, start, start + 1) if 0 < i < len(names)}
        found.append(
            HistoryChangePoint(
                context_tokens=context,
                variant=names[start],
                commit=points[start][1],
                first_variant=names[before_start],
                last_variant=names[end - 1],
                level_before=float(np.exp(signal[before_start:start].mean())),
                level_after=float(np.exp(signal[start:end].mean())),
                kind="step" if near & stepped else "drift",
            )
        )
    return found


def history_spec(spec: JobSpec, reference: str, commits: Sequence[str]) -> JobSpec:
    """A history's spec with its commits as variants: the reference first (`ref-<sha10>`),
    then each commit oldest first (`c01-<sha10>`, ...), all in the configuration (flags and
    recipe) of `spec`'s one variant. What a host makes of a range it resolved."""
    template = spec.variants[0]
    raw = spec.model_dump(mode="json", by_alias=True)
    named = [(f"ref-{reference[:10]}", reference)] + [
        (f"c{position:02d}-{commit[:10]}", commit) for position, commit in enumerate(commits, 1)
    ]
    raw["variants"] = [
        {"name": name, "ref": commit, "recipe": template.recipe, "flags": dict(template.flags)}
        for name, commit in named
    ]
    raw["baseline"] = None
    return JobSpec.model_validate(raw)


def _targets(provenances: Sequence[Provenance]) -> dict[str, TargetInfo]:
    """Each variant's target as first reported (a skipped one keeps its reason)."""
    found: dict[str, TargetInfo] = {}
    for provenance in provenances:
        for target in provenance.targets:
            if target.variant not in found or (
                target.skipped and not found[target.variant].skipped
            ):
                found[target.variant] = target
    return found


def _commit(variant: str, target: TargetInfo | None, fallback_ref: str | None) -> CommitRef:
    return CommitRef(
        variant=variant,
        commit=target.commit if target else None,
        ref=(target.ref if target else None) or fallback_ref,
        subject=target.subject if target else None,
    )


def history_section(
    *,
    spec: JobSpec,
    comparisons: Sequence[Comparison],
    contexts: Sequence[int],
    provenances: Sequence[Provenance],
) -> History:
    """summary.json's `history`: the commits in order, a series per context, and the steps."""
    targets = _targets(provenances)
    reference, *measured = spec.variants
    commits = [
        HistoryCommit(
            **_commit(variant.name, targets.get(variant.name), variant.ref).model_dump(),
            skipped=targets[variant.name].skipped if variant.name in targets else None,
        )
        for variant in measured
    ]
    reference_commit = _commit(reference.name, targets.get(reference.name), reference.ref)
    by_key = {(c.context_tokens, c.variant): c for c in comparisons}
    series = []
    steps = []
    cuts: list[HistoryChangePoint] = []
    for context in contexts:
        points = []
        for commit in commits:
            comparison = by_key.get((context, commit.variant))
            points.append(
                HistoryPoint(
                    variant=commit.variant,
                    commit=commit.commit,
                    skipped=commit.skipped,
                    ratio_median=comparison.ratio_median if comparison else None,
                    ci_low=comparison.ci_low if comparison else None,
                    ci_high=comparison.ci_high if comparison else None,
                    verdict=comparison.verdict if comparison else None,
                    n=comparison.n if comparison else 0,
                    **level_field(comparison.ci_level if comparison else None),
                )
            )
        series.append(HistorySeries(context_tokens=context, points=points))
        # The reference against itself: ratio 1 with no spread, the first neighbour. The first
        # commit steps from it as an A/B verdict would call it (its corrected interval off 1).
        origin = (reference_commit.variant, reference_commit.commit, 1.0, None, None)
        measured_points = [origin] + [
            (p.variant, p.commit, p.ratio_median, interval, p.verdict)
            for p in points
            if not p.skipped and (interval := decisive_interval(p)) is not None
        ]
        subjects = {c.variant: c.subject for c in commits}
        for before, after in zip(measured_points, measured_points[1:], strict=False):
            (from_variant, from_commit, from_ratio, before_ci, _) = before
            (to_variant, to_commit, to_ratio, after_ci, verdict) = after
            if before_ci is None and verdict not in CLAIMS:
                continue
            if before_ci is not None and after_ci and intervals_overlap(before_ci, after_ci):
                continue
            # Both have intervals, so both have a median ratio.
            assert from_ratio is not None and to_ratio is not None
            steps.append(
                HistoryStep(
                    context_tokens=context,
                    from_variant=from_variant,
                    from_commit=from_commit,
                    to_variant=to_variant,
                    to_commit=to_commit,
                    subject=subjects.get(to_variant),
                    from_ratio=from_ratio,
                    to_ratio=to_ratio,
                    direction="slower" if to_ratio < from_ratio else "faster",
                )
            )
        cuts += change_points(
            context,
            [(v, c, r, ci) for v, c, r, ci, _ in measured_points if r is not None],
            steps,
        )
    return History(
        range=spec.history.range if spec.history else None,
        every=spec.history.every if spec.history else None,
        last=spec.history.last if spec.history else None,
        reference=reference_commit,
        commits=commits,
        series=series,
        steps=steps,
        rule=STEP_RULE,
        change_points=cuts,
        change_point_rule=CHANGE_POINT_RULE,
    )


def short(commit: str | None, fallback: str) -> str:
    return commit[:10] if commit else fallback


def history_sentences(history: History, text: Callable[[object], str] = str) -> list[str]:
    """The answer first for a history: each step in words, or that there is none. `text`
    formats what a host wrote (commits, subjects) for where the sentence is shown
    (evidence/rendering/escaping.py's `md_text` for Markdown)."""
    reference = history.reference
    against = f"against {text(short(reference.commit, reference.variant))}"
    skipped = [c for c in history.commits if c.skipped]
    sentences = []
    if not history.steps:
        sentences.append(
            f"No step over {plural(len(history.commits), 'commit')} {against}: every pair of "
            "neighbouring intervals overlaps."
        )
    for step in history.steps:
        change = abs(step.to_ratio / step.from_ratio - 1) * 100
        subject = f' ("{text(step.subject)}")' if step.subject else ""
        sentences.append(
            f"{step.context_tokens} tokens: {change:.1f}% {step.direction} at "
            f"{text(short(step.to_commit, step.to_variant))}{subject}, after "
            f"{text(short(step.from_commit, step.from_variant))} (ratio {against} "
            f"{step.from_ratio:.3f} to {step.to_ratio:.3f}; the intervals do not overlap)."
        )
    for cut in history.change_points or []:
        if cut.kind != "drift":
            continue  # a step is told above
        change = (cut.level_after / cut.level_before - 1) * 100
        sentences.append(
            f"{cut.context_tokens} tokens: a drift, not a step: the level moved {change:+.1f}% "
            f"(ratio {cut.level_before:.3f} to {cut.level_after:.3f}) between the commits from "
            f"{text(cut.first_variant)} and those from {text(cut.variant)} to "
            f"{text(cut.last_variant)}, while no neighbouring pair's intervals part (a change "
            "point of the change-point library, not of the step rule)."
        )
    if skipped:
        sentences.append(
            f"{plural(len(skipped), 'commit')} did not build or load and "
            f"{'were' if len(skipped) != 1 else 'was'} skipped: "
            + ", ".join(text(short(c.commit, c.variant)) for c in skipped)
            + "."
        )
    few = sorted(
        {
            (position, p.variant, p.commit)
            for series in history.series
            for position, p in enumerate(series.points)
            if not p.skipped and p.n > 0 and decisive_interval(p) is None
        }
    )
    if few:
        sentences.append(
            f"{plural(len(few), 'commit')} had too few pairs for an interval and "
            f"{'are' if len(few) != 1 else 'is'} no neighbour in the step rule: "
            + ", ".join(text(short(commit, variant)) for _, variant, commit in few)
            + "."
        )
    return sentences


def plural(count: int, noun: str) -> str:
    """`1 commit`, `2 commits`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
