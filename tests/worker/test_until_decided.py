"""What a run measuring until decided stops on (worker/run.py `until_decided`): the prefill
verdicts of an A/B job, the step's decision of a bisection step."""

from __future__ import annotations

from coldbench.evidence.analysis.summary import prefill_verdicts_at_look, summarize
from coldbench.evidence.contract.schemas import JobSpec
from coldbench.worker.run import until_decided
from tests.evidence.builders import provenance, simulate_run

LINE = [c * 40 for c in "abcdef"]


def _step(names: list[str], *, mode: str = "bisect") -> JobSpec:
    """A step of a bisection over LINE (lo a, mid c, hi f) measuring until decided, 40 rounds."""
    raw: dict[str, object] = {
        "mode": mode,
        "adapter": "mlx-lm",
        "repository": "mlx-lm",
        "variants": [{"name": n, "ref": n[-1] * 40} for n in names],
        "contexts": [64],
        "rounds": 40,
        "until": "decided",
    }
    if mode == "bisect":
        raw["bisect"] = {"good": "v1", "bad": "main", "direction": "slower", "line": LINE}
    return JobSpec.model_validate(raw)


def test_a_bisection_step_stops_once_it_can_halve_the_line() -> None:
    """mid the same code as lo, hi 40% slower, cells spread 5%: at the first look (10 rounds)
    mid's interval includes 1 and is far from hi's, so the step halves upwards, while mid is
    nowhere near `no established change` at +-2%. Stopping only when every comparison is
    decided would run the step to its budget for a decision the first look already made."""
    spec = _step(["lo-a", "mid-c", "hi-f"])
    effects = {"lo-a": 1.0, "mid-c": 1.0, "hi-f": 0.6}
    records = simulate_run(effects=effects, contexts=(64,), rounds=40, noise=0.05, seed=5)
    first_look = [r for r in records if r.round < 10]
    _, comparisons = prefill_verdicts_at_look(first_look, spec=spec)
    verdicts = {c.variant: c.verdict for c in comparisons}
    assert verdicts == {"mid-c": "inconclusive", "hi-f": "slower"}, comparisons
    check = until_decided(spec)
    raw = [r.model_dump(mode="json", by_alias=True) for r in first_look]
    assert check(9, raw) is None  # not a look
    assert check(10, raw) == "the step decided 'upper' at look 1 (10 rounds)"
    # and the step's summary says why measuring stopped there
    summary = summarize(first_look, spec=spec, provenances=[provenance()], n_resamples=300)
    assert summary.bisect is not None and summary.bisect.decision == "upper"
    assert summary.settings.sequential is not None
    assert summary.settings.sequential.stopped == "the step decided 'upper' at look 1"


def test_a_bisection_step_that_cannot_tell_yet_keeps_measuring() -> None:
    """mid halfway between lo and hi at the first look: its interval overlaps both, the step
    has not decided, and the run goes on to the next look."""
    spec = _step(["lo-a", "mid-c", "hi-f"])
    effects = {"lo-a": 1.0, "mid-c": 0.8, "hi-f": 0.6}
    records = simulate_run(effects=effects, contexts=(64,), rounds=10, noise=0.08, seed=5)
    raw = [r.model_dump(mode="json", by_alias=True) for r in records]
    assert until_decided(spec)(10, raw) is None


def test_an_ab_job_still_stops_only_when_every_comparison_is_decided() -> None:
    spec = _step(["a", "b", "c"], mode="ab")
    effects = {"a": 1.0, "b": 1.0, "c": 0.6}
    records = simulate_run(effects=effects, contexts=(64,), rounds=10, noise=0.05, seed=5)
    raw = [r.model_dump(mode="json", by_alias=True) for r in records]
    assert until_decided(spec)(10, raw) is None  # b against a: inconclusive at +-2%
