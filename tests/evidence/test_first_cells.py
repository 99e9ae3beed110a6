"""The first-cell check (coldbench.evidence.analysis.first_cells): a process block's first timed
cell planted slow is named, sized and left out for both variants alike; without an effect
nothing is, and an A/A over many seeds flags at most the test's level."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from benchmarks.first_cells import SIMULATION_START, simulated_run
from benchmarks.first_cells import main as first_cells_main
from coldbench.evidence.analysis.first_cells import (
    LEFT_OUT_REASON,
    first_cells_applied,
    process_blocks,
    rank_sum_p,
    run_check,
)
from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.bundles.bundle import build_bundle, recompute_problems, zip_bytes
from coldbench.evidence.contract.summary_schema import FirstCellBlock, Summary
from coldbench.evidence.rendering.headline import caveats
from coldbench.evidence.rendering.markdown import render_summary_md
from tests.evidence.builders import provenance


def test_blocks_are_read_from_the_records_alone() -> None:
    records = simulated_run(rounds=12, per_block=4)
    blocks = process_blocks(records)["r-1"]
    assert len(blocks) == 3
    assert [len(b.cells) for b in blocks] == [16, 16, 16]
    assert [b.cells[0].round for b in blocks] == [0, 4, 8]
    # in turns a start is one variant's: each turn opens a block of its own
    turns = sorted(records, key=lambda r: (r.process, r.variant != "base", r.round))
    moment = SIMULATION_START
    restamped = []
    for r in turns:
        restamped.append(r.model_copy(update={"started_at": moment}))
        moment += timedelta(seconds=1)
    assert len(process_blocks(restamped)["r-1"]) == 6


def test_a_first_cell_planted_slow_is_flagged_sized_and_left_out_for_both_variants() -> None:
    records = simulated_run(slow_first=1.4)
    summary = summarize(records, baseline="base", n_resamples=200)
    section = summary.first_cells
    assert section is not None and len(section.runs) == 1
    run = section.runs[0]
    assert run.established and run.blocks == 6 and run.slow_blocks == 6
    assert run.slowdown_slow_median == pytest.approx(1.4, rel=0.05)
    assert run.p_value is not None and run.p_value < 1e-3
    # every block's first cell and its pair: 2 variants x 6 blocks, both alike
    assert run.left_out == 12
    left = [c for c in summary.invalid.cells if c.reason == LEFT_OUT_REASON]
    assert len(left) == 12
    assert sorted({c.variant for c in left}) == ["base", "other"]
    assert {(c.round, c.context_tokens) for c in left} == {
        (b.round, b.context_tokens) for b in run.cells
    }
    # the process medians are computed without them: every block keeps 3 rounds at that
    # context, and the A/A ratio is back near 1
    for row in summary.descriptive:
        lost = sum(
            1 for c in left if (c.variant, c.context_tokens) == (row.variant, row.context_tokens)
        )
        assert row.n == 24 - lost
    for comparison in summary.comparisons:
        assert comparison.ratio_median == pytest.approx(1.0, abs=0.02)
    sentence = next(line for line in caveats(summary) if "first timed cell" in line)
    size = re.search(r"was (\d\.\d\d)x the rest in 6 of 6 blocks of run r-1", sentence)
    assert size is not None and float(size.group(1)) == pytest.approx(1.4, rel=0.05)
    assert "left out of every statistic" in sentence and "both variants alike" in sentence
    assert not any("cells were invalid" in line for line in caveats(summary))
    assert "first timed cell of each process block" in render_summary_md(summary, [provenance()])


def test_slow_in_some_blocks_only_still_counts_them() -> None:
    records = simulated_run(rounds=32, slow_first=1.4, slow_blocks={0, 1, 2, 3, 4, 5})
    summary = summarize(records, baseline="base", n_resamples=200)
    assert summary.first_cells is not None
    run = summary.first_cells.runs[0]
    assert run.established and (run.slow_blocks, run.blocks) == (6, 8)
    sentence = next(line for line in caveats(summary) if "first timed cell" in line)
    assert "in 6 of 8 blocks" in sentence


def test_without_a_planted_effect_nothing_is_flagged_or_left_out() -> None:
    records = simulated_run(seed=3)
    summary = summarize(records, baseline="base", n_resamples=200)
    assert summary.first_cells is not None
    run = summary.first_cells.runs[0]
    assert not run.established and run.left_out == 0
    assert run.treatment == "no established effect: every cell counts"
    assert summary.invalid.total == 0
    assert not any("first timed cell" in line for line in caveats(summary))


def test_where_leaving_them_out_would_empty_a_block_the_effect_is_flagged_only() -> None:
    records = simulated_run(slow_first=1.5, per_block=2, rounds=16, contexts=(64,))
    # block 3's second round lost its `other` cell: without its first round it has none
    blocks = process_blocks(records)["r-1"]
    head = blocks[3].cells[0]
    broken = [
        r.model_copy(update={"status": "error", "reason": "process gone"})
        if r.round == head.round + 1 and r.variant == head.variant
        else r
        for r in records
    ]
    kept, section = first_cells_applied(broken, threshold=0.02)
    assert section is not None
    run = section.runs[0]
    assert run.established and run.left_out == 0
    assert run.treatment.startswith("flagged only, every cell counts: leaving them out would")
    assert f"block 3 without a cell of {head.variant} at 64 tokens" in run.treatment
    assert kept == broken


def test_a_block_without_another_cell_of_its_first_cells_kind_is_not_tested() -> None:
    records = simulated_run(rounds=6, per_block=1)  # one round a block: nothing to compare
    kept, section = first_cells_applied(records, threshold=0.02)
    assert section is None and kept == records


def test_the_rank_sum_p_is_exact() -> None:
    def row(faster: int, others: int) -> FirstCellBlock:
        return FirstCellBlock(
            block=0,
            variant="a",
            round=0,
            context_tokens=64,
            slowdown=1.0,
            others=others,
            faster_others=faster,
        )

    assert rank_sum_p([row(3, 3)]) == pytest.approx(1 / 4)
    assert rank_sum_p([row(3, 3), row(3, 3)]) == pytest.approx(1 / 16)
    assert rank_sum_p([row(0, 3)]) == pytest.approx(1.0)
    # two blocks of 1 other: sums 0, 1, 1, 2 -> P(sum >= 1) = 3/4
    assert rank_sum_p([row(1, 1), row(0, 1)]) == pytest.approx(3 / 4)
    assert rank_sum_p([]) is None


def test_an_aa_over_many_seeds_flags_at_most_the_tests_level() -> None:
    """400 simulated A/A runs of 8 blocks (noise with heavy tails, process offsets, a drift):
    the rank test alone rejects at about its level, the check (rank test and size) less."""
    rng = np.random.default_rng(11)
    rejected = flagged = 0
    seeds = 400
    for seed in range(seeds):
        records = simulated_run(seed=seed, rounds=32, noise=0.02, process_sd=0.02)
        if seed % 4 == 0:  # one cell in a hundred 5x slow, anywhere
            records = [
                r.model_copy(update={"prefill_tps": (r.prefill_tps or 1.0) / 5})
                if rng.random() < 0.01
                else r
                for r in records
            ]
        blocks = process_blocks(records)["r-1"]
        checked = run_check("r-1", blocks, threshold=0.02)
        assert checked is not None
        run, _ = checked
        rejected += run.p_value is not None and run.p_value <= 0.05
        flagged += run.established
    assert rejected / seeds <= 0.075
    assert flagged / seeds <= 0.05


def test_the_bundle_recomputes_the_same_first_cells_and_left_out_cells() -> None:
    records = simulated_run(slow_first=1.4)
    files, summary = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=200
    )
    assert recompute_problems(files) == []
    written = json.loads(files["summary.json"])
    assert written["first_cells"]["runs"][0]["left_out"] == 12
    assert Summary.model_validate(written).first_cells == summary.first_cells
    # a forger who puts the first cells back in is caught
    edited = {**written, "first_cells": {**written["first_cells"], "runs": []}}
    assert Summary.model_validate(edited).first_cells != summary.first_cells


def test_the_benchmark_reads_a_bundle_zip_and_prints_each_blocks_first_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = simulated_run(slow_first=1.4)
    files, _ = build_bundle(
        records=records, provenances=[provenance()], baseline="base", n_resamples=50
    )
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(zip_bytes(files))
    out = tmp_path / "rows.json"
    assert first_cells_main([str(archive), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "run r-1" in printed and "established" in printed and "not established" not in printed
    rows = json.loads(out.read_text())[0]["blocks"]
    assert [row["block"] for row in rows] == list(range(6))
    assert all(row["slowdown"] == pytest.approx(1.4, rel=0.1) for row in rows)
    assert all(row["importing_beside"] is None for row in rows)  # no timeline.json
    with pytest.raises(SystemExit, match="neither a bundle folder nor a zip"):
        first_cells_main([str(out)])
