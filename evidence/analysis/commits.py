"""Commits: which commits of a pull request earn their keep.

A `commits` job runs base, head, and for each commit c of base..head (head's first-parent line)
head without c: c reverted on top of head, in a tree the host makes and records by its digest
(`SynthesizedTree`); with `alone`, also base with only c. Paired inside every round like every
variant, so:

- the PR's total is head / base;
- c's marginal is head / head-without-c: what leaving that one commit out costs with every
  other commit in (above 1: c earns speed), corrected across commits and contexts (Bonferroni);
- the marginals are not additive: their sum is set beside the total, and the difference is
  what no single commit accounts for (commits that build on each other, or overlap);
- a commit whose revert conflicts, or whose tree does not build or load, is not separable: it
  is listed with the reason and the others go on.

One rule in one place: the variants are `CommitsSpec.planned` (evidence/contract/schemas.py), the
spec a host runs `commits_spec`, the section `commits_section`, its words `commits_sentences`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from coldbench.evidence.analysis.stats import CellIndex, StatsOptions, compare_variants, finish
from coldbench.evidence.contract.schemas import CommitTreePlan, JobSpec, Provenance, TargetInfo
from coldbench.evidence.contract.summary_schema import (
    CLAIMS,
    CommitMarginal,
    CommitRef,
    Commits,
    CommitsAdditivity,
    Comparison,
    Parity,
    ParityCounts,
    PrCommit,
    Verdict,
)

COMMITS_NOTE = (
    "Each commit's marginal is head / head-without-it: what leaving that one commit out of the "
    "PR costs with every other commit in (above 1: the commit earns speed). Commits interact, "
    "so marginals are not additive: their sum is set beside the PR's total (head / base), and "
    "the difference is what no single commit accounts for."
)


def commits_spec(spec: JobSpec, line: Sequence[str]) -> JobSpec:
    """The spec a host runs for `line` (base, then each commit of base..head oldest first):
    the variants of `CommitsSpec.planned`, each in the one configuration (flags and recipe) of
    `spec`'s first variant, base first (the baseline)."""
    assert spec.commits is not None
    template = spec.variants[0]
    commits = spec.commits.model_copy(update={"line": list(line)})
    raw = spec.model_dump(mode="json", by_alias=True)
    raw["variants"] = [
        {"name": plan.name, "ref": plan.onto, "recipe": template.recipe, "flags": template.flags}
        for plan in commits.planned()
    ]
    raw["baseline"] = None
    raw["commits"] = commits.model_dump(mode="json")
    return JobSpec.model_validate(raw)


def _targets(provenances: Sequence[Provenance]) -> dict[str, TargetInfo]:
    """Each variant's target as first reported (one that was not measured keeps its reason)."""
    found: dict[str, TargetInfo] = {}
    for provenance in provenances:
        for target in provenance.targets:
            known = found.get(target.variant)
            if known is None or (target.skipped and not known.skipped):
                found[target.variant] = target
    return found


def _ref(plan: CommitTreePlan, target: TargetInfo | None) -> CommitRef:
    return CommitRef(
        variant=plan.name,
        commit=plan.onto,
        ref=target.ref if target else plan.onto,
        subject=target.subject if target else None,
    )


def _parity_of(parity: Parity, variant: str) -> ParityCounts:
    counts = Counter(cell.result for cell in parity.cells if cell.variant == variant)
    return ParityCounts(
        exact=counts["exact"],
        accepted=counts["accepted"],
        diverged=counts["diverged"],
        unknown=counts["unknown"],
    )


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else (ratio - 1) * 100


def _additivity(
    context: int,
    total: Comparison | None,
    marginals: Sequence[CommitMarginal],
    alone: Sequence[CommitMarginal],
    commits: int,
    has_alone: bool,
) -> CommitsAdditivity:
    measured = [m.ratio_median for m in marginals if m.ratio_median is not None]
    total_pct = _pct(total.ratio_median) if total else None
    summed = sum((r - 1) * 100 for r in measured) if measured else None
    fields = {}
    if has_alone:
        picked = [a.ratio_median for a in alone if a.ratio_median is not None]
        fields["sum_alone_pct"] = sum((r - 1) * 100 for r in picked) if picked else None
    return CommitsAdditivity(
        context_tokens=context,
        total_pct=total_pct,
        sum_of_marginals_pct=summed,
        interaction_pct=None if total_pct is None or summed is None else total_pct - summed,
        marginals=len(measured),
        commits=commits,
        **fields,
    )


def commits_section(
    index: CellIndex,
    *,
    spec: JobSpec,
    comparisons: Sequence[Comparison],
    contexts: Sequence[int],
    provenances: Sequence[Provenance],
    parity: Parity,
    options: StatsOptions,
) -> Commits:
    """summary.json's `commits`: every commit with its trees, the PR's total, each commit's
    marginal (Bonferroni across commits and contexts), each alone on base, and the sums."""
    assert spec.commits is not None and spec.commits.line is not None  # JobSpec's rules
    base_plan, head_plan, *changed = spec.commits.planned()
    targets = _targets(provenances)
    reverted = [plan for plan in changed if plan.change == "revert"]
    picked = {plan.position: plan for plan in changed if plan.change == "pick"}
    entries: list[PrCommit] = []
    for plan in reverted:
        assert plan.position is not None and plan.commit is not None
        target = targets.get(plan.name)
        tree = target.synthesized if target else None
        entry = PrCommit(
            position=plan.position,
            commit=plan.commit,
            subject=tree.subject if tree else None,
            without=plan.name,
            not_separable=target.skipped if target else None,
            tree=tree,
            parity=_parity_of(parity, plan.name),
        )
        only = picked.get(plan.position)
        if only is not None:
            # Set only with `alone`: a summary without it writes no such keys (exclude_unset).
            only_target = targets.get(only.name)
            entry = PrCommit.model_validate(
                {
                    **entry.model_dump(exclude_unset=True),
                    "alone": only.name,
                    "alone_not_separable": only_target.skipped if only_target else None,
                    "alone_tree": only_target.synthesized if only_target else None,
                }
            )
        entries.append(entry)
    drafts = []
    for context in contexts:
        for entry in entries:
            if entry.not_separable:
                continue
            draft, _ = compare_variants(
                index,
                variant=head_plan.name,
                baseline=entry.without,
                context_tokens=context,
                options=options,
            )
            drafts.append({"position": entry.position, "commit": entry.commit, **draft})
    marginals = finish(drafts, options, CommitMarginal)
    alone_names = {plan.name: plan for plan in picked.values()}
    alone = [
        CommitMarginal(
            position=alone_names[c.variant].position or 0,
            commit=alone_names[c.variant].commit or "",
            **c.model_dump(exclude_unset=True),
        )
        for c in comparisons
        if c.variant in alone_names
    ]
    total = [c for c in comparisons if c.variant == head_plan.name]
    additivity = [
        _additivity(
            context,
            next((c for c in total if c.context_tokens == context), None),
            [m for m in marginals if m.context_tokens == context],
            [a for a in alone if a.context_tokens == context],
            len(entries),
            spec.commits.alone,
        )
        for context in contexts
    ]
    return Commits(
        base=_ref(base_plan, targets.get(base_plan.name)),
        head=_ref(head_plan, targets.get(head_plan.name)),
        commits=entries,
        total=total,
        marginals=marginals,
        alone=alone,
        additivity=additivity,
        note=COMMITS_NOTE,
        correction="bonferroni",
    )


def _label(entry: PrCommit) -> str:
    return f"c{entry.position} ({entry.commit[:10]})"


def _signed(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def _interval(low: float | None, high: float | None, *, cost: bool = False) -> str:
    if low is None or high is None:
        return ""
    if cost:
        return f" [{(1 - high) * 100:.1f}%, {(1 - low) * 100:.1f}%]"
    return f" [{_signed(low)}, {_signed(high)}]"


def _first_line(text: str, limit: int = 160) -> str:
    """A reason on one short line: its first line, and where that is long its kind (`did not
    load`) and its end, where the error says itself (the middle is paths)."""
    line = text.strip().splitlines()[0] if text.strip() else text
    if len(line) <= limit:
        return line
    kind, sep, _ = line.partition(": ")
    head = f"{kind}: ..." if sep and len(kind) < limit // 3 else "..."
    return head + line[-(limit - len(head)) :]


def _total_clause(total: Comparison | None, commits: Commits, where: str) -> str:
    count = len(commits.commits)
    span = (
        f"the PR ({(commits.base.commit or '')[:10]}..{(commits.head.commit or '')[:10]}, "
        f"{count} commit{'s' if count != 1 else ''})"
    )
    if total is None or total.ratio_median is None:
        return f"{where}{span} has no valid pairs against base"
    interval = _interval(total.ci_low, total.ci_high)
    if total.verdict == Verdict.FASTER:
        return f"{where}{span} is {_signed(total.ratio_median)}{interval} against base"
    if total.verdict == Verdict.SLOWER:
        cost = _interval(total.ci_low, total.ci_high, cost=True)
        return f"{where}{span} is {(1 - total.ratio_median) * 100:.1f}% slower{cost} than base"
    return f"{where}{span}: {total.verdict} against base ({_signed(total.ratio_median)}{interval})"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def commits_sentences(commits: Commits, text: Callable[[object], str] = str) -> list[str]:
    """The answer first: per context, the PR's total, then which commits carry the gain, which
    cost, which changed nothing established and which are not separable; then the sums. `text`
    formats what a host wrote (why a commit is not separable) for where the sentence is shown
    (evidence/rendering/escaping.py's `md_text` for Markdown)."""
    by_position = {entry.position: entry for entry in commits.commits}
    several = len(commits.additivity) > 1
    sentences = []
    for additivity in commits.additivity:
        context = additivity.context_tokens
        where = f"at {context} tokens " if several else ""
        total = next((c for c in commits.total if c.context_tokens == context), None)
        sentences.append(_sentence(_total_clause(total, commits, where)))
        marginals = [m for m in commits.marginals if m.context_tokens == context]
        clauses = _marginal_clauses(marginals, by_position)
        clauses += [
            f"{_label(entry)} is not separable ({text(_first_line(entry.not_separable))})"
            for entry in commits.commits
            if entry.not_separable
        ]
        if clauses:
            # A commit's label starts the sentence as it is written (`c3`), not capitalized.
            joined = "; ".join(clauses)
            sentences.append(_sentence(f"{where}{joined}") if where else f"{joined}.")
        summed, total_pct = additivity.sum_of_marginals_pct, additivity.total_pct
        if summed is not None and total_pct is not None:
            plural = "s" if additivity.marginals != 1 else ""
            sentences.append(
                _sentence(
                    f"{where}the {additivity.marginals} marginal{plural} sum to {summed:+.1f}% "
                    f"against the PR's total of {total_pct:+.1f}% "
                    f"({total_pct - summed:+.1f}% that no single commit accounts for): "
                    "leave-one-out contributions interact and are not additive"
                )
            )
    return sentences


def _marginal_clauses(
    marginals: Sequence[CommitMarginal], by_position: dict[int, PrCommit]
) -> list[str]:
    """Gains largest first (`carries most of the gain`), then costs largest first, then the
    commits with no established contribution."""
    gains = sorted(
        (m for m in marginals if m.verdict == Verdict.FASTER and m.ratio_median is not None),
        key=lambda m: -(m.ratio_median or 0),
    )
    costs = sorted(
        (m for m in marginals if m.verdict == Verdict.SLOWER and m.ratio_median is not None),
        key=lambda m: m.ratio_median or 0,
    )
    clauses = []
    for rank, m in enumerate(gains):
        assert m.ratio_median is not None
        label = _label(by_position[m.position])
        amount = f"{_signed(m.ratio_median)}{_interval(m.ci_low, m.ci_high)}"
        if rank == 0:
            share = "most of the gain" if len(gains) > 1 else "the gain"
            clauses.append(f"{label} carries {share} ({amount})")
        else:
            clauses.append(f"{label} adds {amount}")
    for m in costs:
        assert m.ratio_median is not None
        cost = f"{(1 - m.ratio_median) * 100:.1f}%{_interval(m.ci_low, m.ci_high, cost=True)}"
        clauses.append(f"{_label(by_position[m.position])} costs {cost}")
    for m in marginals:
        if m.verdict in CLAIMS:
            continue
        label = _label(by_position[m.position])
        if m.ratio_median is None:
            clauses.append(f"{label}: no valid pairs")
        else:
            interval = _interval(m.ci_low, m.ci_high)
            clauses.append(f"{label}: {m.verdict} ({_signed(m.ratio_median)}{interval})")
    return clauses
