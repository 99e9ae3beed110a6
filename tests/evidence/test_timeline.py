"""timeline.json: where a run's time went, in the bundle, the summary and summary.md."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from coldbench.evidence.bundles.bundle import build_bundle, recompute_problems, verify_files
from coldbench.evidence.contract.calibration import rounds_cost_s
from coldbench.evidence.contract.timeline import (
    BlockStart,
    ProcessTimes,
    Timeline,
    advice_cost_s,
    timeline_section,
)
from tests.evidence.builders import START, provenance, simulate_run

from .test_bundle import _reseal


def _timeline(run_id: str = "r-1", **overrides: object) -> Timeline:
    values: dict[str, object] = {
        "run_id": run_id,
        "started_at": START - timedelta(seconds=40),
        "ended_s": 500.0,
        "rounds_per_process": 3,
        "block_rule": "3 rounds per process, as asked",
        "prespawn": True,
        "first_cell_s": 70.0,
        "blocks": [
            BlockStart(block=0, began_s=0.0, imports_s=10.0, load_s=20.0, warmups_s=30.0),
            BlockStart(block=1, began_s=250.0, stop_s=1.0, load_s=20.0, warmups_s=30.0),
        ],
        "processes": [ProcessTimes(variant="base", process=1, block=0, spawned_s=0.0)],
    }
    return Timeline.model_validate({**values, **overrides})


def test_the_duty_cycle_is_timed_cells_over_the_measuring_wall() -> None:
    # one warm-up of 30 s, then 12 cells of 30 s back to back: 360 s of cells in 390 s
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    section = timeline_section([_timeline()], records)
    assert section is not None
    (run,) = section.runs
    assert (run.measuring_wall_s, run.timed_cells_s, run.cells) == (390.0, 360.0, 12)
    assert run.duty_cycle == pytest.approx(360 / 390, abs=1e-4)
    assert run.time_to_first_cell_s == 70.0 and run.blocks == 2 and run.process_starts == 1
    assert run.first_block is not None and run.first_block.imports_s == 10.0
    assert run.later_blocks is not None
    assert (run.later_blocks.stop_s, run.later_blocks.warmups_s) == (1.0, 30.0)
    assert timeline_section([], records) is None


def test_a_runs_measured_cost_prices_a_block_start_and_a_round() -> None:
    """Blocks of 3 rounds: a later block's start is 51 s (stop, load, warm-ups). A round costs
    the measuring wall less the starts inside it, never less than its cells: these records'
    cells run back to back (360 s in a wall of 390 s), so 60 s a round."""
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    section = timeline_section([_timeline()], records)
    assert section is not None
    (run,) = section.runs
    assert (run.rounds, run.block_start_s, run.round_s) == (6, 51.0, 60.0)
    # 12 rounds in blocks of 3: 4 starts and 12 rounds
    assert advice_cost_s(section.runs, 12) == pytest.approx(4 * 51.0 + 12 * 60.0)
    assert advice_cost_s(section.runs, None) is None
    assert rounds_cost_s(0, 3, start_s=51.0, round_s=51.5) == 0.0


def test_in_turns_a_blocks_start_pays_every_turn_and_the_advice_says_so() -> None:
    """In turns each variant's turn is a start of its own: a block's start is the sum of its
    turns' starts, which the rounds advice pays again for every block it adds."""
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    turns = [
        BlockStart(block=0, variant="base", began_s=0.0, imports_s=10.0, load_s=20.0),
        BlockStart(block=0, variant="fast", began_s=40.0, load_s=20.0, warmups_s=30.0),
        BlockStart(block=1, variant="base", began_s=250.0, stop_s=1.0, load_s=20.0),
        BlockStart(block=1, variant="fast", began_s=300.0, stop_s=1.0, load_s=20.0),
    ]
    apart = timeline_section(
        [_timeline(blocks=turns, residency="in-turns", residency_reason="too big")], records
    )
    assert apart is not None
    (run,) = apart.runs
    # block 1: two turns of 1 s stop and 20 s load each
    assert run.turns_within_blocks == 2 and run.block_start_s == 42.0 and run.round_s == 60.0
    assert advice_cost_s(apart.runs, 30) == pytest.approx(10 * 42.0 + 30 * 60.0)


def test_an_inconclusive_comparisons_advice_is_priced_by_the_runs_timeline() -> None:
    records = simulate_run(
        effects={"base": 1.0, "fast": 1.01}, contexts=(64,), rounds=6, noise=0.05
    )
    files, summary = build_bundle(
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=200,
        timelines=[_timeline()],
    )
    (comparison,) = summary.comparisons
    assert comparison.verdict == "inconclusive" and comparison.rounds_needed is not None
    assert summary.timeline is not None
    assert comparison.time_needed_s == advice_cost_s(
        summary.timeline.runs, comparison.rounds_needed
    )
    decode = [c for c in summary.decode_comparisons if c.rounds_needed]
    assert decode and all(
        c.time_needed_s == advice_cost_s(summary.timeline.runs, c.rounds_needed) for c in decode
    )
    assert recompute_problems(files) == []
    unpriced = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=200
    )[1]
    assert unpriced.comparisons[0].time_needed_s is None
    assert (
        "time_needed_s"
        not in json.loads(unpriced.model_dump_json(exclude_unset=True))["comparisons"][0]
    )


def test_a_bundle_carries_its_timeline_and_recomputes_its_section() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    stopped = _timeline(stopped="stopped on request after 12 of 24 cells")
    files, summary = build_bundle(
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=200,
        timelines=[stopped],
    )
    assert Timeline.model_validate_json(files["timeline.json"]) == stopped
    assert summary.timeline is not None and summary.timeline.runs[0].duty_cycle is not None
    assert json.loads(files["summary.json"])["timeline"]["runs"][0]["stopped"] == (
        "stopped on request after 12 of 24 cells"
    )
    assert verify_files(files).problems == [] and recompute_problems(files) == []
    md = files["summary.md"].decode()
    line = next(line for line in md.splitlines() if line.startswith("Where the time went"))
    assert "timed cells 360.0 s (duty cycle 92%)" in line
    assert "1 later block start, started ahead: stop 1.0 s" in line
    assert line.endswith("The run was stopped on request after 12 of 24 cells.")
    # a timeline edited after the fact no longer matches its summary
    edited_timeline = stopped.model_copy(update={"first_cell_s": 1.0})
    edited = _reseal({**files, "timeline.json": edited_timeline.to_json_bytes()})
    assert recompute_problems(edited) == [
        "summary.json: differs from the statistics of records.jsonl at "
        "timeline.runs[0].time_to_first_cell_s"
    ]


def test_a_timeline_outside_its_contract_is_named() -> None:
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    files, _ = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=200
    )
    assert "timeline.json" not in files  # no timeline: no file, no section
    bad = json.loads(_timeline().to_json_bytes())
    bad["ended_s"] = -1
    forged = _reseal({**files, "timeline.json": json.dumps(bad).encode()})
    assert verify_files(forged).problems == [
        "timeline.json: invalid (ended_s: Input should be greater than or equal to 0)"
    ]


def test_several_runs_keep_a_timeline_each() -> None:
    one = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6, run_id="r-1")
    two = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6, run_id="r-2")
    files, summary = build_bundle(
        records=[*one, *two],
        provenances=[provenance("r-1"), provenance("r-2", hostname="studio-2")],
        baseline="base",
        n_resamples=200,
        timelines=[_timeline("r-2"), _timeline("r-1")],
    )
    assert {"timeline.r-1.json", "timeline.r-2.json"} <= set(files)
    assert summary.timeline is not None
    assert [run.run_id for run in summary.timeline.runs] == ["r-1", "r-2"]
    assert recompute_problems(files) == []


def test_every_kind_of_comparison_keeps_its_type_when_priced() -> None:
    """Prefill and decode comparisons and ablation entries alike: an inconclusive one gains
    the times of its advice, a decided one is left as it was."""
    from coldbench.evidence.analysis.summary import priced_advice
    from coldbench.evidence.contract.summary_schema import AblationEntry

    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    section = timeline_section([_timeline()], records)
    assert section is not None
    common = {
        "context_tokens": 64,
        "variant": "all-minus-compile",
        "baseline": "all",
        "n": 6,
        "ratio_median": 1.0,
        "ci_low": 0.9,
        "ci_high": 1.1,
        "p_value": None,
        "p_adjusted": None,
        "ratios": [],
        "feature": "compile",
    }
    unsure = AblationEntry(**common, verdict="inconclusive", rounds_needed=12)
    decided = AblationEntry(**common, verdict="faster", rounds_needed=None)
    priced, kept = priced_advice([unsure, decided], section.runs)
    assert type(priced) is AblationEntry and priced.feature == "compile"
    assert priced.time_needed_s == advice_cost_s(section.runs, 12) and kept == decided


def test_a_first_runs_kernel_compiles_are_named_where_the_time_went() -> None:
    """Two processes side by side compiled the same 3 modules at once (the most one compiled,
    not their sum); the next block's found them cached; a process without a CUDA kernel cache
    (None) counts as neither."""
    records = simulate_run(effects={"base": 1.0, "fast": 1.0}, contexts=(64,), rounds=6)
    processes = [
        ProcessTimes(variant=v, process=p, block=b, spawned_s=0.0, kernels_compiled=compiled)
        for v, p, b, compiled in (
            ("base", 1, 0, 3),
            ("fast", 1, 0, 3),
            ("base", 2, 1, 0),
            ("fast", 2, 1, None),
        )
    ]
    files, summary = build_bundle(
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=200,
        timelines=[_timeline(processes=processes)],
    )
    assert summary.timeline is not None
    (run,) = summary.timeline.runs
    assert (run.processes_compiling_kernels, run.kernels_compiled_max) == (2, 3)
    md = files["summary.md"].decode()
    line = next(line for line in md.splitlines() if line.startswith("Where the time went"))
    assert (
        "2 variant processes compiled kernels that MLX's CUDA kernel cache lacked (at most 3 "
        "kernel modules one), inside their load and warm-ups, before any timed cell"
    ) in line
    assert recompute_problems(files) == []
    # a warm cache: counted, nothing compiled, nothing said; no cache at all: no figures
    warm_files, warm = build_bundle(
        records=records,
        provenances=[provenance()],
        baseline="base",
        n_resamples=200,
        timelines=[
            _timeline(processes=[p.model_copy(update={"kernels_compiled": 0}) for p in processes])
        ],
    )
    assert warm.timeline is not None
    assert (
        warm.timeline.runs[0].processes_compiling_kernels,
        warm.timeline.runs[0].kernels_compiled_max,
    ) == (0, 0)
    assert "compiled kernels" not in warm_files["summary.md"].decode()
    bare = timeline_section([_timeline()], records)
    assert bare is not None and bare.runs[0].processes_compiling_kernels is None
