"""The one builder from options to a JobRequest, and the one resolver of a request to the JobSpec
that runs: what `coldbench run`, `coldbench submit`, `coldbench calibrate` and the form accept,
refuse and default to."""

from __future__ import annotations

from typing import Any

import pytest

from coldbench.evidence.analysis.stats import (
    Pair,
    StatsOptions,
    compare_pairs,
    finish,
    units_for_verdict,
)
from coldbench.evidence.contract.schemas import JobRequest, JobSpec, SpecLimits
from coldbench.evidence.contract.summary_schema import Comparison
from coldbench.evidence.spec.job_options import (
    JOB_OPTIONS,
    MODES,
    DefaultRoundsError,
    JobOptionsError,
    build_job_spec,
    default_rounds,
    option_of_field,
    problem_lines,
    resolve_job,
    service_payload,
)


def _problems(given: dict[str, Any]) -> list[str]:
    return problem_lines(_refused(given))


def _refused(given: dict[str, Any], limits: SpecLimits | None = None) -> JobOptionsError:
    with pytest.raises(JobOptionsError) as raised:
        build_job_spec(given, limits=limits)
    return raised.value


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ({"variants": ["x:prefill_step_size"]}, "--variant: 'x:prefill_step_size': expected key="),
        ({"contexts": "12x"}, "--contexts: '12x' is not a token count"),
        ({"mode": "bogus"}, "--mode: 'bogus': choose one of ab, ablation, sweep, history, bisect"),
        ({"variants": ["-x"]}, "--variant: '-x': not a name"),
        ({"variants": ["a:ref=main"]}, "--variant: variants name a ref or recipe but the job"),
        ({"mode": "ablation"}, "--features: ablation mode needs at least one feature"),
        ({"adapter": "mlx-lm"}, "--repo: adapter mlx-lm needs a repository"),
        ({"adapter": "vllm"}, "--adapter: 'vllm': choose 'embedded', 'mlx-lm' or 'openai-server'"),
        ({"repository": "r", "variants": ["a"]}, "--variant: variant a names no ref of r"),
        ({"rounds": "0"}, "--rounds: 0: give at least 1"),
        ({"rounds": "many"}, "--rounds: 'many' is not a whole number"),
        ({"precision": "0.7"}, "--precision: 0.7: give at most 0.5"),
        ({"precision": "nan"}, "--precision: 'nan' is not a finite number"),
        ({"model": "a model"}, "--model: 'a model': not a model name"),
        ({"labels": "ok, b@d"}, "--labels: 'b@d': not a host label"),
        ({"features": "compile"}, "--features: belongs to mode ablation, not ab"),
        ({"range": "a..b"}, "--range: belongs to mode history, not ab"),
        ({"good": "v1", "mode": "sweep"}, "--good: belongs to mode bisect, not sweep"),
        (
            {"mode": "bisect", "repository": "r", "good": "v1"},
            "--bad: bisect needs bad: a ref that is changed",
        ),
        (
            {"mode": "history", "repository": "r", "last": "2", "variants": ["a"]},
            "--last: every and last thin a range A..B",
        ),
        (
            {"mode": "history", "repository": "r", "range": "--upload-pack=x..b"},
            "--range: range '--upload-pack=x..b' is not A..B with two plain refs",
        ),
        (
            {
                "mode": "bisect",
                "repository": "r",
                "good": "a",
                "bad": "b",
                "direction": "slower",
                "variants": ["x:ref=main"],
                "contexts": "64",
            },
            "--variant: the commits come from good..bad: the variant takes flags only",
        ),
        (
            {"mode": "bisect", "repository": "r", "good": "a", "bad": "b", "direction": "up"},
            "--direction: 'up': choose 'slower' or 'faster'",
        ),
        (
            {"mode": "history", "repository": "r", "commits": "a,b", "range": "a..b"},
            "--range: give --range A..B or a list of commits, not both",
        ),
        (
            {"fresh_process": True, "rounds_per_process": "2"},
            "--rounds-per-process: fresh_process (a process per cell) and rounds_per_process",
        ),
        ({"base": "main"}, "--base: belongs to mode commits, not ab"),
        ({"mode": "history", "alone": True}, "--alone: belongs to mode commits, not history"),
        (
            {"mode": "commits", "repository": "r", "base": "main"},
            "--head: commits needs head: the PR's head",
        ),
        (
            {"mode": "commits", "repository": "r", "base": "-x", "head": "pr"},
            "--base: ref '-x' is not a plain branch, tag or commit name",
        ),
        (
            {"mode": "commits", "base": "main", "head": "pr"},
            "--repo: commits mode needs a repository",
        ),
        (
            {
                "mode": "commits",
                "repository": "r",
                "base": "a",
                "head": "b",
                "variants": ["x", "y"],
            },
            "--variant: the commits come from base..head: give at most one variant",
        ),
    ],
)
def test_each_bad_option_is_one_line_naming_it(given: dict[str, Any], line: str) -> None:
    lines = _problems(given)
    assert any(found.startswith(line) for found in lines), lines


def test_every_problem_is_reported_in_one_pass() -> None:
    lines = _problems(
        {
            "mode": "ab",
            "contexts": "64, 12x",
            "rounds": "0",
            "precision": "2",
            "model": "a model",
            "labels": "b@d",
            "range": "a..b",
            "variants": ["base", "base"],
        }
    )
    flags = sorted(line.split(":")[0] for line in lines)
    assert flags == ["--contexts", "--labels", "--model", "--precision", "--range", "--rounds"]
    # The rules across fields run too once the fields are valid: all of them at once.
    lines = _problems(
        {
            "mode": "ablation",
            "repository": "r",
            "variants": ["a:ref=x", "a:ref=y"],
            "fresh_process": "true",
            "rounds_per_process": "2",
        }
    )
    assert len(lines) == 3, lines
    assert any("names the same" in line or "must be unique" in line for line in lines)
    assert any("needs at least one feature" in line for line in lines)
    assert any("exclude each other" in line for line in lines)


def test_problems_carry_the_spec_field_for_the_form() -> None:
    with pytest.raises(JobOptionsError) as raised:
        build_job_spec({"variants": [{"name": "a"}, {"name": "b", "flags": "x"}]})
    (problem,) = raised.value.problems
    assert (problem.option, problem.field) == ("variants", "variants.1.flags")
    assert "write flags as name=value" in problem.message
    assert option_of_field("history.every") == "every"
    assert option_of_field("bisect.good") == "good"
    assert option_of_field("commits.head") == "head" and option_of_field("commits") == "base"
    assert option_of_field("variants.0.recipe") == "recipe"
    assert option_of_field("host_labels") == "labels"
    assert option_of_field(None) == "job"


def test_text_and_values_build_the_same_spec() -> None:
    typed = build_job_spec(
        {
            "variants": [
                "base:prefill_step_size=32",
                "wide:prefill_step_size=64,clear_cache=false",
            ],
            "contexts": "4K, 128",
            "rounds": "7",
            "precision": "0.02",
            "labels": "lab:a, backend:cpu",
            "hosts": "2",
            "fresh_process": "false",
        }
    )
    valued = build_job_spec(
        {
            "variants": [
                {"name": "base", "flags": {"prefill_step_size": 32}},
                {"name": "wide", "flags": "prefill_step_size=64, clear_cache=false"},
            ],
            "contexts": [4096, "128"],
            "rounds": 7,
            "precision": 0.02,
            "labels": ["lab:a", "backend:cpu"],
            "hosts": 2,
            "fresh_process": False,
        }
    )
    assert typed == valued
    assert typed.contexts == [128, 4096] and typed.host_labels == ["lab:a", "backend:cpu"]


def test_defaults_per_mode() -> None:
    plain = build_job_spec({})
    assert plain.mode == "ab" and [v.name for v in plain.variants] == ["base"]
    assert plain.contexts == [128, 256] and plain.model == "preset:tiny"
    bisect = build_job_spec(
        {"mode": "bisect", "repository": "r", "good": "v1", "bad": "main", "direction": "slower"}
    )
    assert bisect.contexts == [256] and bisect.needs_host_resolution
    # every mode measures until decided unless told (a fixed count cannot know the host's
    # noise); the rounds stay left out until the request is resolved
    assert plain.until == bisect.until == "decided" and plain.rounds is bisect.rounds is None
    assert resolve_job(bisect).rounds == 4 * units_for_verdict()
    fixed = build_job_spec(
        {
            "mode": "bisect",
            "repository": "r",
            "good": "v1",
            "bad": "main",
            "direction": "slower",
            "until": "rounds",
        }
    )
    assert fixed.until == "rounds" and resolve_job(fixed).rounds == units_for_verdict()
    commits = build_job_spec(
        {
            "mode": "history",
            "repository": "r",
            "commits": "v1, main",
            "variants": ["cfg:prefill_step_size=64"],
        }
    )
    assert [(v.name, v.ref) for v in commits.variants] == [("ref-v1", "v1"), ("c01-main", "main")]
    assert all(v.flags == {"prefill_step_size": 64} for v in commits.variants)
    pr = build_job_spec(
        {"mode": "commits", "repository": "r", "base": "main", "head": "pr", "alone": "true"}
    )
    assert pr.needs_host_resolution and pr.commits is not None and pr.commits.alone
    assert [v.name for v in pr.variants] == ["base"] and pr.variants[0].ref is None


_EVERY_MODE: list[dict[str, Any]] = [
    {},
    {"variants": ["a", "b:prefill_step_size=64", "c:prefill_step_size=32"]},
    {"mode": "ablation", "features": "compile, clear_cache=false, prefill_step_size=64"},
    {"mode": "sweep", "variants": ["a", "b:prefill_step_size=64"], "contexts": "1K,2K,4K"},
    {"mode": "bisect", "repository": "r", "good": "a", "bad": "b", "direction": "faster"},
    {"mode": "history", "repository": "r", "range": "a..b", "last": "5"},
    {"mode": "history", "repository": "r", "range": "a..b"},
    {"mode": "commits", "repository": "r", "base": "a", "head": "b"},
]


@pytest.mark.parametrize("given", _EVERY_MODE)
def test_every_mode_measures_until_decided_within_four_first_looks_by_default(
    given: dict[str, Any],
) -> None:
    """Left out, rounds stay out of the request (no stand-in value) and are set once, by
    `resolve_job`: measuring until decided (every mode's default), four first looks of the
    rule's ten process pairs, whatever the family (a t interval gets wider with more
    comparisons, never unreachable); with until=rounds, one first look."""
    request = build_job_spec(given)
    assert type(request) is JobRequest and request.rounds is None and request.until == "decided"
    spec = resolve_job(request)
    assert type(spec) is JobSpec and spec.until == "decided"
    assert spec.rounds == default_rounds(request) == 4 * units_for_verdict() == 40, given
    fixed = resolve_job(build_job_spec({**given, "until": "rounds"}))
    assert fixed.until == "rounds" and fixed.rounds == units_for_verdict() == 10
    # the resolved job is the request with its rounds: nothing else changes
    assert spec.model_dump(exclude={"rounds"}) == request.model_dump(exclude={"rounds"})


def test_rounds_given_are_kept_and_blocks_multiply_the_default() -> None:
    given = build_job_spec({"rounds": "12"})
    assert given.rounds == 12 and resolve_job(given).rounds == 12
    assert resolve_job(build_job_spec({"rounds": "12", "until": "rounds"})).rounds == 12
    blocks = resolve_job(build_job_spec({"rounds_per_process": "2"}))
    assert blocks.rounds == 4 * 2 * units_for_verdict()
    budget = build_job_spec({"budget_minutes": "12.5", "rounds": "60"})
    assert (budget.until, budget.rounds, budget.budget_minutes) == ("decided", 60, 12.5)
    assert _problems({"until": "rounds", "budget_minutes": "5"}) == [
        "--budget-minutes: budget_minutes needs until=decided (measure until decided)"
    ]


def test_a_service_default_time_budget_applies_only_where_the_job_gives_none() -> None:
    """`resolve_job(budget_minutes=)` (a service's default) fills a job measuring until decided
    that gives no time budget; one given, or a job at fixed rounds, keeps its own."""
    assert resolve_job(build_job_spec({})).budget_minutes is None  # coldbench run: none
    assert resolve_job(build_job_spec({}), budget_minutes=60).budget_minutes == 60
    own = build_job_spec({"budget_minutes": "5"})
    assert resolve_job(own, budget_minutes=60).budget_minutes == 5
    fixed = build_job_spec({"until": "rounds"})
    assert resolve_job(fixed, budget_minutes=60).budget_minutes is None


def test_rounds_left_out_stay_out_of_what_a_front_end_sends() -> None:
    """What `coldbench submit`, the form and a pull request send: no `rounds` key where the
    person gave none, for the service to resolve; given rounds go as given."""
    payload = service_payload(build_job_spec({}))
    assert "rounds" not in payload and payload["until"] == "decided"
    assert JobRequest.model_validate(payload) == build_job_spec({})
    assert service_payload(build_job_spec({"rounds": "7"}))["rounds"] == 7
    with pytest.raises(ValueError, match="rounds"):
        JobSpec.model_validate(payload)  # a job that runs has its rounds


def test_default_rounds_above_a_services_limit_ask_the_submitter_to_choose() -> None:
    """The form builds with the service's limits (problems said in one pass); the default,
    set where the request is resolved, is refused at rounds when the limit is below it; given
    rounds are checked as before."""
    limits = SpecLimits(
        max_contexts=8, max_context_tokens=4096, max_rounds=9, max_decode_tokens=64, max_hosts=2
    )
    with pytest.raises(JobOptionsError) as raised:
        build_job_spec({"contexts": "64,8K"}, limits=limits)
    assert [(p.option, p.field) for p in raised.value.problems] == [
        ("contexts", "contexts"),
    ]
    assert problem_lines(raised.value) == [
        "--contexts: contexts [8192] exceed the limit of 4096 tokens"
    ]
    request = build_job_spec({}, limits=limits)
    with pytest.raises(DefaultRoundsError) as refused:
        resolve_job(request, limits=limits)
    assert str(refused.value) == (
        "this job's default is 40 rounds, more than this service's limit of 9: give rounds "
        "(at most 9), or fewer rounds per process"
    )
    assert resolve_job(build_job_spec({"rounds": "9"}, limits=limits), limits=limits).rounds == 9
    assert problem_lines(_refused({"rounds": "10"}, limits)) == [
        "--rounds: rounds=10; at most 9 allowed"
    ]


@pytest.mark.parametrize("family", [1, 2, 10, 40, 128])
def test_units_for_verdict_outvote_two_stalled_units_at_each_end(family: int) -> None:
    """At the rule's ten units, two stalled process pairs at each end (ratios far off on both
    sides) leave a 20% slowdown `slower` in any family size; with one unit fewer nothing is set
    aside and they widen the interval past 1."""

    def verdict(n: int) -> str:
        from tests.evidence.builders import record

        ratios = [5.0, 4.0, 0.2, 0.25] + [0.8 + 0.002 * i for i in range(n - 4)]
        pairs = []
        for i, ratio in enumerate(ratios):
            base = record(variant="base", round=i, prefill_tps=1000.0)
            cand = record(variant="cand", round=i, prefill_tps=1000.0 * ratio)
            pairs.append(Pair(base.run_id, i, base.context_tokens, ratio, cand, base))
        draft = compare_pairs(
            pairs, context_tokens=256, variant="cand", baseline="base", options=options
        )
        others = [dict(draft) for _ in range(family - 1)]
        return finish([draft, *others], options, Comparison)[0].verdict

    options = StatsOptions()
    n = units_for_verdict()
    assert verdict(n) == "slower"
    assert verdict(n - 1) == "inconclusive"


def test_every_mode_and_option_is_declared_once_with_help() -> None:
    assert set(MODES) == {"ab", "ablation", "sweep", "history", "bisect", "commits"}
    mode_help = JOB_OPTIONS["mode"].help_text()
    assert all(mode in mode_help for mode in MODES)
    for option in JOB_OPTIONS.values():
        assert option.flag.startswith("--") and option.help
    assert "mode history only" in JOB_OPTIONS["range"].help_text()


def test_a_spec_from_the_builder_round_trips() -> None:
    request = build_job_spec({"mode": "ablation", "features": "compile", "rounds": "12"})
    assert JobRequest.model_validate(request.model_dump(mode="json", by_alias=True)) == request
    spec = resolve_job(request)
    assert JobSpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            {"variants": ["base", "cand:bogus_flag=3"]},
            "--variant: the embedded adapter has no flag bogus_flag (prefill_step_size, "
            "clear_cache, compile, fused_swiglu, fused_add_rms_norm)",
        ),
        ({"variants": ["a:prefill_step_size=0"]}, "--variant: prefill_step_size=0: give a chunk"),
        ({"variants": ["a:clear_cache=2"]}, "--variant: clear_cache=2: give true or false"),
        (
            {"variants": ["a:compile=true,fused_swiglu=true"]},
            "--variant: compile cannot be combined with fused_swiglu",
        ),
        (
            {"mode": "ablation", "features": "compile, fused_add_rms_norm"},
            "--variant: compile cannot be combined with fused_add_rms_norm",
        ),
        ({"mode": "ablation", "features": "turbo"}, "--features: the embedded adapter has no"),
        (
            {"repository": "r", "variants": ["a:ref=main,clear_cache=false"]},
            "--variant: the mlx-lm adapter has no flag clear_cache (prefill_step_size)",
        ),
    ],
)
def test_flags_the_adapter_does_not_take_are_refused_at_once(
    given: dict[str, Any], line: str
) -> None:
    lines = _problems(given)
    assert any(found.startswith(line) for found in lines), lines


def test_flags_of_a_checkout_or_a_server_are_left_to_their_host() -> None:
    """A coldbench ref's engine may take other flags; a server's are its host's options."""
    embedded_ref = build_job_spec(
        {"adapter": "embedded", "repository": "r", "variants": ["a:ref=v2,new_flag=1"]}
    )
    assert embedded_ref.variants[0].flags == {"new_flag": 1}
    server = build_job_spec(
        {"adapter": "openai-server", "repository": "srv", "variants": ["a:ref=m,fast=1"]}
    )
    assert server.variants[0].flags == {"fast": 1}
