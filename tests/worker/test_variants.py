"""The orchestrator's fault paths, driven by a runner that misbehaves on request.

The real engine runner is exercised end to end in test_cli.py and test_agent.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from coldbench.engine.plan import Plan
from coldbench.evidence.contract.records import parse_records
from coldbench.worker.schedule import plan_rounds
from coldbench.worker.variants import Progress, VariantError, VariantLaunch, child_env, run_schedule

RUNNER = "tests.worker.misbehaving_runner"


def _launch(name: str, **flags: object) -> VariantLaunch:
    plan = Plan(run_id="r-test", variant=name, adapter="embedded", model="none", flags=flags)
    return VariantLaunch(name=name, python=sys.executable, plan=plan, module=RUNNER)


def test_cells_run_in_schedule_order_and_are_spooled(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64, 128], seed=1, rounds=3)
    seen: list[Progress] = []
    outcome = run_schedule(
        [_launch("a"), _launch("b")],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        on_progress=seen.append,
    )
    expected = [(c.variant, c.round, c.order) for r in rounds for c in r]
    measured = [r for r in outcome.records if r["round"] >= 0]
    assert [(r["variant"], r["round"], r["order"]) for r in measured] == expected
    assert outcome.cells_done == outcome.cells_total == 12 and not outcome.stopped
    # One process per variant for the whole run (the model loads once).
    assert len({r["counters"]["pid"] for r in measured if r["variant"] == "a"}) == 1
    # records.jsonl on disk: warm-ups plus every cell, valid records.
    records, problems = parse_records((tmp_path / "records.jsonl").read_bytes())
    assert not problems
    assert sum(r.status == "warmup" for r in records) == 2 and len(records) == 14
    assert seen[-1].cells_done == 12 and seen[-1].eta_s == 0
    assert any(p.variant == "b" and p.context_tokens in (64, 128) for p in seen)
    assert outcome.targets["a"]["engine_module_file"].endswith("misbehaving_runner.py")


def test_a_runners_kernel_compiles_reach_the_timeline_within_its_bounds(tmp_path: Path) -> None:
    """A count the contract can hold is kept per process; anything else (a negative, a flag, a
    text, more than the timeline allows, none at all) is left unknown, and the run goes on."""
    said: dict[str, object] = {"a": 3, "b": -1, "c": True, "d": "3", "e": 10**7}
    launches = [_launch(name, kernels_compiled=value) for name, value in said.items()]
    names = [*said, "f"]
    outcome = run_schedule(
        [*launches, _launch("f")],
        plan_rounds(names, [64], seed=0, rounds=1),
        workdir=tmp_path,
        cell_timeout_s=30,
    )
    assert outcome.cells_done == outcome.cells_total == 6 and outcome.timeline is not None
    compiled = {p.variant: p.kernels_compiled for p in outcome.timeline.processes}
    assert compiled == {"a": 3, "b": None, "c": None, "d": None, "e": None, "f": None}


def test_hung_cell_times_out_and_the_variant_restarts(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=3)
    outcome = run_schedule(
        [_launch("a"), _launch("b", hang_round=1)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=2,
    )
    by_key = {(r["variant"], r["round"]): r for r in outcome.records if r["round"] >= 0}
    hung = by_key[("b", 1)]
    assert hung["status"] == "error" and hung["reason"] == "cell timeout: no record after 2 s"
    assert by_key[("b", 2)]["status"] == "ok"
    assert by_key[("b", 0)]["counters"]["pid"] != by_key[("b", 2)]["counters"]["pid"]
    records, problems = parse_records((tmp_path / "records.jsonl").read_bytes())
    assert not problems and len([r for r in records if r.round >= 0]) == 6


def test_crash_mid_cell_is_an_error_record(tmp_path: Path) -> None:
    rounds = plan_rounds(["a"], [64], seed=0, rounds=2)
    outcome = run_schedule(
        [_launch("a", crash_round=0)], rounds, workdir=tmp_path, cell_timeout_s=30
    )
    first = [r for r in outcome.records if r["round"] == 0][0]
    assert first["status"] == "error" and "exited with code 3" in first["reason"]
    assert [r["status"] for r in outcome.records if r["round"] == 1] == ["ok"]


def test_load_failure_stops_before_any_timing(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=2)
    with pytest.raises(VariantError, match="variant b: cannot load model: corrupt weights"):
        run_schedule(
            [_launch("a"), _launch("b", fail_load=True)],
            rounds,
            workdir=tmp_path,
            cell_timeout_s=30,
        )
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert all(json.loads(line)["status"] == "warmup" for line in lines)


def test_a_droppable_variant_that_cannot_load_is_dropped_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """A history's commit that cannot load is a result, like one that cannot build: the
    others are measured, its cells are neither run nor counted, and the reason is kept."""
    rounds = plan_rounds(["a", "b", "c"], [64], seed=0, rounds=4)
    outcome = run_schedule(
        [_launch("a"), _launch("b", fail_load=True), _launch("c")],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        droppable=["b", "c"],
    )
    assert outcome.dropped == {"b": "variant b: cannot load model: corrupt weights"}
    measured = [r for r in outcome.records if r["round"] >= 0]
    assert {r["variant"] for r in measured} == {"a", "c"} and len(measured) == 8
    assert outcome.cells_done == outcome.cells_total == 8 and not outcome.stopped
    assert "b" not in outcome.targets
    # the variant that must run still fails the run
    with pytest.raises(VariantError, match="variant b: cannot load model"):
        run_schedule(
            [_launch("a"), _launch("b", fail_load=True)],
            plan_rounds(["a", "b"], [64], seed=0, rounds=1),
            workdir=tmp_path / "strict",
            cell_timeout_s=30,
            droppable=["a"],
        )


def test_stop_request_finishes_the_cell_in_flight_then_stops(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=5)
    done: list[int] = []

    def progress(p: Progress) -> None:
        done.append(p.cells_done)

    outcome = run_schedule(
        [_launch("a"), _launch("b")],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        on_progress=progress,
        should_stop=lambda: bool(done) and done[-1] >= 3,
    )
    assert outcome.stopped and outcome.cells_done == 3
    assert len([r for r in outcome.records if r["round"] >= 0]) == 3


def test_fresh_process_runs_every_cell_in_a_new_process(tmp_path: Path) -> None:
    rounds = plan_rounds(["a"], [64, 128], seed=0, rounds=2)
    outcome = run_schedule(
        [_launch("a")], rounds, workdir=tmp_path, cell_timeout_s=30, fresh_process=True
    )
    measured = [r for r in outcome.records if r["round"] >= 0]
    assert len({r["counters"]["pid"] for r in measured}) == 4
    assert sum(r["status"] == "warmup" for r in outcome.records) == 4


def test_with_a_process_per_cell_a_crashed_cell_is_an_error_and_the_next_cell_runs(
    tmp_path: Path,
) -> None:
    rounds = plan_rounds(["a"], [64], seed=0, rounds=2)
    outcome = run_schedule(
        [_launch("a", crash_round=0)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        fresh_process=True,
    )
    by_round = {r["round"]: r for r in outcome.records if r["round"] >= 0}
    assert by_round[0]["status"] == "error" and "exited with code 3" in by_round[0]["reason"]
    assert by_round[1]["status"] == "ok" and outcome.cells_done == outcome.cells_total == 2


def test_bracketing_controls_go_to_their_own_file(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b", "c", "d"], [64, 128], seed=0, rounds=1, baseline="a")
    outcome = run_schedule(
        [_launch(n) for n in "abcd"], rounds, workdir=tmp_path, cell_timeout_s=30
    )
    assert len(outcome.controls) == 2 and all(r["variant"] == "a" for r in outcome.controls)
    assert len([r for r in outcome.records if r["round"] >= 0]) == 8
    assert len((tmp_path / "controls.jsonl").read_text().splitlines()) == 2


def test_process_blocks_replace_every_variant_process_and_stamp_records(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64, 128], seed=3, rounds=5)
    outcome = run_schedule(
        [_launch("a"), _launch("b")],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=3,
    )
    measured = [r for r in outcome.records if r["round"] >= 0]
    assert len(measured) == 20
    # Rounds 0-1, 2-3 and 4 are three blocks: one process instance per variant per block.
    for record in measured:
        assert record["process"] == record["round"] // 2 + 1
    for variant in "ab":
        pids = {r["process"]: set() for r in measured if r["variant"] == variant}
        for r in measured:
            if r["variant"] == variant:
                pids[r["process"]].add(r["counters"]["pid"])
        assert all(len(p) == 1 for p in pids.values())
        assert len(set().union(*pids.values())) == 3
    # Every fresh process warmed up before its block's first timed cell, and says which it was.
    warmups = [r for r in outcome.records if r["status"] == "warmup"]
    assert sorted((w["variant"], w["process"]) for w in warmups) == [
        (v, i) for v in "ab" for i in (1, 2, 3)
    ]
    records, problems = parse_records((tmp_path / "records.jsonl").read_bytes())
    assert not problems and {r.process for r in records} == {1, 2, 3}
    position = {id(r): i for i, r in enumerate(outcome.records)}
    for block in (2, 3):
        first_cell = min(position[id(r)] for r in measured if r["process"] == block)
        assert all(position[id(w)] < first_cell for w in warmups if w["process"] == block), (
            "a block's warm-ups come before its first timed cell"
        )


def test_a_block_warms_its_processes_one_after_another_and_counts_peers(tmp_path: Path) -> None:
    # Warm-ups at every context at once would need every process's largest peak on the device
    # together (two 8B processes on the H200 ran out of memory at 64K): they must not overlap.
    rounds = plan_rounds(["a", "b", "c"], [64], seed=1, rounds=2)
    outcome = run_schedule(
        [_launch(name, warmup_s=0.3) for name in "abc"],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=1,
        seed=1,
    )
    warmups = [r for r in outcome.records if r["status"] == "warmup"]
    assert len(warmups) == 6
    assert {w["counters"]["peers"] for w in warmups} == {"2"}
    for block in (1, 2):
        spans = sorted((w["started_at"], w["ended_at"]) for w in warmups if w["process"] == block)
        for (_, ended), (started, _) in zip(spans, spans[1:], strict=False):
            assert ended <= started, f"block {block}: warm-ups overlap: {spans}"


def test_a_blocks_processes_load_together_then_warm_up_in_turn(tmp_path: Path) -> None:
    # Loading (imports, weights) needs no more memory at once than the weights the processes
    # hold anyway, so it overlaps; the warm-ups still take turns. One runner predates the gate
    # (an older engine commit) and is accepted as it is.
    rounds = plan_rounds(["a", "b", "c"], [64], seed=2, rounds=1)
    launches = [_launch(name, load_s=1.0, warmup_s=0.2) for name in "ab"]
    outcome = run_schedule(
        [*launches, _launch("c", load_s=1.0, warmup_s=0.2, no_gate=True)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=1,
        seed=2,
    )
    warmups = [r for r in outcome.records if r["status"] == "warmup"]
    assert sorted(w["variant"] for w in warmups) == ["a", "b", "c"]
    loads = [(w["counters"]["load_started"], w["counters"]["load_ended"]) for w in warmups]
    assert max(started for started, _ in loads) < min(ended for _, ended in loads), loads
    gated = sorted((w["started_at"], w["ended_at"]) for w in warmups if w["variant"] != "c")
    assert gated[0][1] <= gated[1][0], f"warm-ups overlap: {gated}"
    assert all(r["status"] == "ok" for r in outcome.records if r["round"] >= 0)


def test_a_restart_after_a_crash_is_a_new_process_instance(tmp_path: Path) -> None:
    rounds = plan_rounds(["a"], [64], seed=0, rounds=3)
    outcome = run_schedule(
        [_launch("a", crash_round=1)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=3,
    )
    by_round = {r["round"]: r for r in outcome.records if r["round"] >= 0}
    assert [by_round[i]["process"] for i in range(3)] == [1, 1, 2]
    assert by_round[1]["status"] == "error"


def test_rounds_per_process_must_be_positive(tmp_path: Path) -> None:
    rounds = plan_rounds(["a"], [64], seed=0, rounds=1)
    with pytest.raises(ValueError, match="rounds_per_process must be >= 1"):
        run_schedule(
            [_launch("a")], rounds, workdir=tmp_path, cell_timeout_s=30, rounds_per_process=0
        )


def test_a_child_imports_the_worktree_put_first_not_the_working_directorys_engine(
    tmp_path: Path,
) -> None:
    """An orchestrator started inside a coldbench checkout must not run that checkout's engine/
    in a variant of an embedded repository (seen on the H200 dry run: `-m` puts the working
    directory first on sys.path)."""
    for where, mark in (("cwd", "the working directory"), ("worktree", "the worktree")):
        package = tmp_path / where / "engine"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"MARK = {mark!r}\n")
    done = subprocess.run(
        [sys.executable, "-c", "import engine; print(engine.MARK)"],
        cwd=tmp_path / "cwd",
        env=child_env(first=str(tmp_path / "worktree")),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.strip() == "the worktree"


def _runners_alive(workdir: Path) -> list[int]:
    """Live (not zombie) processes whose command line names a plan under `workdir`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(workdir) in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def test_a_warm_up_is_bounded_by_the_cell_timeout_not_the_ready_timeout(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=2)
    started = time.monotonic()
    with pytest.raises(
        VariantError, match=r"variant b: a warm-up did not finish within the cell timeout \(2 s\)"
    ) as raised:
        run_schedule(
            [_launch("a"), _launch("b", warmup_hang=True)],
            rounds,
            workdir=tmp_path,
            cell_timeout_s=2,
            ready_timeout_s=600,
        )
    assert time.monotonic() - started < 60
    # what happened before the failure travels with it (the run's partial bundle)
    outcome = raised.value.outcome
    assert outcome is not None and outcome.timeline is not None
    assert {p.ended for p in outcome.timeline.processes} <= {"killed", "exited"}
    assert _runners_alive(tmp_path) == []


def test_a_stop_during_the_warm_ups_kills_every_process_and_keeps_what_was_measured(
    tmp_path: Path,
) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=4)
    stop_at = time.monotonic() + 1e9

    def progress(p: Progress) -> None:
        nonlocal stop_at
        if p.cells_done == 4 and stop_at > time.monotonic() + 1e8:
            stop_at = time.monotonic() + 1.5  # the next block is warming up by then

    launches = [_launch("a", warmup_s=0.3), _launch("b", warmup_s=5)]
    started = time.monotonic()
    outcome = run_schedule(
        launches,
        rounds,
        workdir=tmp_path,
        cell_timeout_s=60,
        rounds_per_process=2,
        on_progress=progress,
        should_stop=lambda: time.monotonic() > stop_at,
    )
    # b's warm-ups take 5 s: the stop came while the second block was warming up
    assert outcome.stopped
    assert time.monotonic() - started < 30
    assert outcome.timeline is not None and outcome.timeline.stopped
    processes = outcome.timeline.processes
    assert all(p.exited_s is not None for p in processes)
    measured = [r for r in outcome.records if r["round"] >= 0]
    assert len(measured) == outcome.cells_done == 4
    assert _runners_alive(tmp_path) == []


def test_prespawned_processes_import_while_the_block_measures_and_load_after_it(
    tmp_path: Path,
) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=4, rounds=6)
    launches = [_launch(name, import_s=0.5, cell_s=0.3) for name in "ab"]
    outcome = run_schedule(
        launches,
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=4,
        prespawn=True,
    )
    assert outcome.cells_done == 12 and not outcome.stopped
    timeline = outcome.timeline
    assert timeline is not None and timeline.prespawn and len(timeline.blocks) == 3
    measured = [r for r in outcome.records if r["round"] >= 0]
    by_block: dict[int | None, list] = {}
    for process in timeline.processes:
        by_block.setdefault(process.block, []).append(process)
    assert sorted(by_block) == [0, 1, 2] and all(len(v) == 2 for v in by_block.values())
    for block in (1, 2):
        previous, current = by_block[block - 1], by_block[block]
        boundary = timeline.blocks[block]
        assert all(p.prespawned for p in current)
        # imported before the block began (while the previous block measured) ...
        assert all(p.imported_s is not None and p.imported_s < boundary.began_s for p in current)
        # ... and loaded only once the previous block's processes were gone
        gone = max(p.exited_s for p in previous if p.exited_s is not None)
        assert all(p.load_s is not None and p.load_s >= gone for p in current)
        assert boundary.imports_s < 0.4  # nothing left to wait for at the boundary
        # Never beside a timed cell (on the H200 a block's first timed cell ran 1.7-1.8x slow
        # beside three importing interpreters): spawned once the previous block's processes had
        # imported, they import while it loads and warms up, and its first timed cell waits.
        waited_in = timeline.blocks[block - 1]
        assert waited_in.first_cell_s is not None
        assert all(p.spawned_s < waited_in.first_cell_s for p in current)
        assert max(p.imported_s or 0.0 for p in current) <= waited_in.first_cell_s
        first = min(r["started_at"] for r in measured if r["process"] == block)
        began = timeline.started_at.timestamp() + max(p.imported_s or 0.0 for p in current)
        assert datetime.fromisoformat(first.replace("Z", "+00:00")).timestamp() >= began - 0.05
        # the imports (0.5 s) outlast the loads and warm-ups: the block waited for the rest
        assert waited_in.ahead_imports_s > 0.05
    assert not any(p.prespawned for p in by_block[0])
    # the last block starts nothing ahead and waits for nothing
    assert timeline.blocks[2].ahead_imports_s < 0.05
    # every process started measured a block
    assert {r["process"] for r in measured} == {1, 2, 3}


def test_a_runner_without_the_load_gate_is_never_started_ahead(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=0, rounds=4)
    launches = [_launch("a"), _launch("b", no_load_gate=True)]
    outcome = run_schedule(
        launches, rounds, workdir=tmp_path, cell_timeout_s=30, rounds_per_process=2, prespawn=True
    )
    assert outcome.timeline is not None
    ahead = {(p.variant, p.block) for p in outcome.timeline.processes if p.prespawned}
    assert ahead == {("a", 1)}
    assert all(r["status"] == "ok" for r in outcome.records if r["round"] >= 0)


def test_in_turns_one_process_is_resident_at_a_time_and_every_cell_pairs(
    tmp_path: Path,
) -> None:
    rounds = plan_rounds(["a", "b"], [64, 128], seed=5, rounds=4, bracket_min_cells=2)
    assert any(cell.is_control for round_ in rounds for cell in round_)
    outcome = run_schedule(
        [_launch("a", cell_s=0.02), _launch("b", cell_s=0.02)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=5,
        residency="in-turns",
        residency_reason="in turns, one variant resident at a time: test",
        baseline="a",
    )
    measured = [r for r in outcome.records if r["round"] >= 0]
    # every round's matrix cells of both variants, once each; no bracketing controls
    assert sorted((r["variant"], r["round"], r["context_tokens"]) for r in measured) == sorted(
        (v, r, c) for v in "ab" for r in range(4) for c in (64, 128)
    )
    assert outcome.controls == [] and outcome.cells_done == outcome.cells_total == 16
    # ABBA at block level, the baseline first in the even block and last in the odd one
    turns = [(r["variant"], r["process"]) for r in measured]
    runs = [turn for i, turn in enumerate(turns) if i == 0 or turns[i - 1] != turn]
    assert runs == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    # one process at a time: each alone (no peers) and gone before the next one loaded
    timeline = outcome.timeline
    assert timeline is not None and timeline.residency == "in-turns"
    assert [(s.block, s.variant) for s in timeline.blocks] == [
        (0, "a"),
        (0, "b"),
        (1, "b"),
        (1, "a"),
    ]
    processes = sorted(timeline.processes, key=lambda p: p.spawned_s)
    for previous, current in zip(processes, processes[1:], strict=False):
        assert previous.exited_s is not None and current.load_s is not None
        assert current.load_s >= previous.exited_s
    warmups = [r for r in outcome.records if r["status"] == "warmup"]
    assert len(warmups) == 4 and {w["counters"]["peers"] for w in warmups} == {"0"}


def test_in_turns_the_progress_estimate_prices_the_turn_starts_still_to_come(
    tmp_path: Path,
) -> None:
    """Each turn's start loads for 0.3 s, a cell takes 0.02 s: the estimate after the first
    turn's cells counts the three turn starts to come, not only the cells left."""
    rounds = plan_rounds(["a", "b"], [64], seed=5, rounds=4)
    seen: list[Progress] = []
    run_schedule(
        [_launch("a", cell_s=0.02, load_s=0.3), _launch("b", cell_s=0.02, load_s=0.3)],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=5,
        on_progress=seen.append,
        residency="in-turns",
        baseline="a",
    )
    after_first_turn = next(p for p in seen if p.cells_done == 2)
    assert after_first_turn.eta_s is not None
    # 6 cells left (about 0.15 s) and 3 starts of at least 0.3 s each
    assert after_first_turn.eta_s >= 3 * 0.3
    assert seen[-1].eta_s == 0


def test_in_turns_the_next_turns_process_imports_while_this_one_measures(tmp_path: Path) -> None:
    rounds = plan_rounds(["a", "b"], [64], seed=6, rounds=4)
    # a turn measures 2 cells (1.4 s): time for the next interpreter to start and import
    launches = [_launch(name, import_s=0.3, cell_s=0.7) for name in "ab"]
    outcome = run_schedule(
        launches,
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=6,
        prespawn=True,
        residency="in-turns",
        baseline="a",
    )
    assert outcome.cells_done == 8
    timeline = outcome.timeline
    assert timeline is not None and len(timeline.blocks) == 4
    starts = timeline.blocks
    # every turn's process but the first was started ahead (a runner of the same interpreter
    # and module as one that waited at the load gate waits too), and imported before its turn
    ahead = [p for p in timeline.processes if p.prespawned]
    assert sorted((p.block, p.variant) for p in ahead) == [(0, "b"), (1, "a"), (1, "b")]
    for process in ahead:
        start = next(s for s in starts if (s.block, s.variant) == (process.block, process.variant))
        assert process.imported_s is not None and process.imported_s < start.began_s
        assert start.imports_s < 0.4


def test_a_run_whose_memory_cannot_be_planned_runs_side_by_side_saying_why(
    tmp_path: Path,
) -> None:
    from coldbench.worker.run import RunRefused, memory_plan

    plan = memory_plan(
        [_launch("a"), _launch("b")], model=tmp_path / "nothing", contexts=[64], asked="auto"
    )
    assert plan.residency == "side-by-side" and plan.refused == {}
    assert plan.reason.startswith("no memory plan (checkpoint ") and "does not exist" in plan.reason
    forced = memory_plan(
        [_launch("a")], model=tmp_path / "nothing", contexts=[64], asked="in-turns"
    )
    assert forced.residency == "in-turns"
    with pytest.raises(RunRefused, match="residency 'both'"):
        memory_plan([_launch("a")], model=tmp_path, contexts=[64], asked="both")


def test_a_residency_asked_for_is_in_the_reproduce_line() -> None:
    from coldbench.evidence.contract.schemas import JobSpec
    from coldbench.worker.provenance import reproduce_command

    spec = JobSpec.model_validate(
        {"variants": [{"name": "a"}, {"name": "b"}], "contexts": [64], "rounds": 2}
    )
    assert "--residency" not in reproduce_command(spec)
    in_turns = spec.model_copy(update={"residency": "in-turns"})
    assert reproduce_command(in_turns).endswith("--residency in-turns")


def test_in_turns_a_run_measuring_until_decided_looks_once_a_blocks_rounds_are_complete(
    tmp_path: Path,
) -> None:
    asked: list[tuple[int, int]] = []

    def end_after_round(rounds_done: int, records: object) -> str | None:
        measured = [r for r in records if r["round"] >= 0]  # type: ignore[attr-defined]
        asked.append((rounds_done, len(measured)))
        return "decided" if rounds_done == 4 else None

    rounds = plan_rounds(["a", "b"], [64], seed=7, rounds=6)
    outcome = run_schedule(
        [_launch("a"), _launch("b")],
        rounds,
        workdir=tmp_path,
        cell_timeout_s=30,
        rounds_per_process=2,
        seed=7,
        residency="in-turns",
        baseline="a",
        end_after_round=end_after_round,
    )
    # asked before the second and the third block, each time with every cell of both
    # variants' turns in the rounds done; the third block never started
    assert asked == [(2, 4), (4, 8)]
    assert outcome.ended == "decided" and outcome.cells_done == 8
    timeline = outcome.timeline
    assert timeline is not None and {s.block for s in timeline.blocks} == {0, 1}
