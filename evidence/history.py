"""History: one configuration over a repository's commits, each against one reference commit.

Every commit is a variant paired with the reference commit inside every round (rotated, cold),
so each point is the paired ratio commit / reference with its 95% interval: the same comparison
an A/B verdict rests on, not a raw tok/s from another hour. A *step* is where two neighbouring
measured commits' intervals do not overlap: the performance changed between them. Commits that
did not build are listed with the reason and skipped; the next measured commit is the neighbour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from evidence.schemas import JobSpec, Provenance, TargetInfo
from evidence.stats import intervals_overlap
from evidence.summary_schema import (
    CommitRef,
    Comparison,
    History,
    HistoryCommit,
    HistoryPoint,
    HistorySeries,
    HistoryStep,
)

STEP_RULE = (
    "a step is a pair of neighbouring measured commits whose 95% intervals of the paired ratio "
    "to the reference do not overlap"
)


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
    by_key = {(c.context_tokens, c.variant): c for c in comparisons}
    series = []
    steps = []
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
                )
            )
        series.append(HistorySeries(context_tokens=context, points=points))
        measured_points = [
            (position, p, (p.ci_low, p.ci_high))
            for position, p in enumerate(points)
            if p.ci_low is not None and p.ci_high is not None and not p.skipped
        ]
        for (_, before, before_ci), (position, after, after_ci) in zip(
            measured_points, measured_points[1:], strict=False
        ):
            if intervals_overlap(before_ci, after_ci):
                continue
            # Both have intervals, so both have a median ratio.
            assert before.ratio_median is not None and after.ratio_median is not None
            steps.append(
                HistoryStep(
                    context_tokens=context,
                    from_variant=before.variant,
                    from_commit=before.commit,
                    to_variant=after.variant,
                    to_commit=after.commit,
                    subject=commits[position].subject,
                    from_ratio=before.ratio_median,
                    to_ratio=after.ratio_median,
                    direction="slower" if after.ratio_median < before.ratio_median else "faster",
                )
            )
    return History(
        range=spec.history.range if spec.history else None,
        every=spec.history.every if spec.history else None,
        last=spec.history.last if spec.history else None,
        reference=_commit(reference.name, targets.get(reference.name), reference.ref),
        commits=commits,
        series=series,
        steps=steps,
        rule=STEP_RULE,
    )


def short(commit: str | None, fallback: str) -> str:
    return commit[:10] if commit else fallback


def history_sentences(history: History, text: Callable[[object], str] = str) -> list[str]:
    """The answer first for a history: each step in words, or that there is none. `text`
    formats what a host wrote (commits, subjects) for where the sentence is shown
    (evidence/escaping.py's `md_text` for Markdown)."""
    reference = history.reference
    against = f"against {text(short(reference.commit, reference.variant))}"
    skipped = [c for c in history.commits if c.skipped]
    sentences = []
    if not history.steps:
        sentences.append(
            f"No step over {len(history.commits)} commits {against}: every pair of "
            "neighbouring intervals overlaps."
        )
    for step in history.steps:
        change = abs(step.to_ratio / step.from_ratio - 1) * 100
        subject = f' ("{text(step.subject)}")' if step.subject else ""
        sentences.append(
            f"{step.context_tokens} tokens: {change:.1f}% {step.direction} at "
            f"{text(short(step.to_commit, step.to_variant))}{subject}, after "
            f"{text(short(step.from_commit, step.from_variant))} (ratio {against} "
            f"{step.from_ratio:.3f} -> {step.to_ratio:.3f}; the intervals do not overlap)."
        )
    if skipped:
        sentences.append(
            f"{len(skipped)} commit{'s' if len(skipped) != 1 else ''} did not build and "
            f"{'were' if len(skipped) != 1 else 'was'} skipped: "
            + ", ".join(text(short(c.commit, c.variant)) for c in skipped)
            + "."
        )
    return sentences
