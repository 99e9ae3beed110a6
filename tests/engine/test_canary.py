"""The warm canary (engine/canary.py): a real variant process runs one cell whose cache already
holds half its prompt; the cold check catches it, and a cold check broken on purpose lets it
pass, which marks the run's evidence invalid (summary, summary.md, report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from coldbench.evidence.analysis.summary import summarize
from coldbench.evidence.contract.schemas import CANARY_ROUND, Record
from coldbench.evidence.rendering.markdown import render_summary_md
from coldbench.evidence.rendering.report import render_report_html

REPO = Path(__file__).resolve().parents[2]


def _run_batch(tmp_path: Path, model: Path, **env: str) -> list[Record]:
    plan = {
        "run_id": "r-canary",
        "variant": "base",
        "adapter": "embedded",
        "model": str(model),
        "flags": {"prefill_step_size": 32},
        "decode_tokens": 2,
        "records_path": str(tmp_path / "records.jsonl"),
        "cells": [{"round": r, "order": 0, "context_tokens": 64} for r in range(2)],
        "warmup_contexts": [64],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLDBENCH_CANARY": "1", **env},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ready: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    assert ready["event"] == "ready" and ready["canary"]["round"] == CANARY_ROUND
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    return [Record.model_validate(json.loads(line)) for line in lines]


def test_the_warm_canary_is_caught_and_kept_out_of_the_statistics(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    records = _run_batch(tmp_path, micro_model_dir)
    (canary,) = [r for r in records if r.round == CANARY_ROUND]
    assert canary.status == "invalid" and canary.cached_tokens == 32
    assert canary.reason is not None and "cached_tokens=32" in canary.reason
    assert canary.reason.startswith("warm canary")
    summary = summarize(records, baseline="base")
    assert summary.canary is not None and summary.canary.runs[0].result == "caught"
    assert summary.evidence_invalid is None
    # never counted as an invalid cell of the matrix, never in the descriptive statistics
    assert summary.invalid.total == 0 and summary.descriptive[0].n == 2
    assert "caught, as it must be" in render_summary_md(summary, [])
    # every cell of the CPU runner says why it has no GPU telemetry (engine/telemetry.py)
    assert all(r.counters["gpu.sm_clock_mhz"] is None for r in records)
    assert {r.counters["gpu.telemetry_unavailable"] for r in records} == {
        "the cpu backend has no NVML device"
    }
    assert summary.telemetry is not None and summary.telemetry.runs[0].source is None


def test_a_blind_cold_check_lets_the_canary_pass_and_the_run_is_marked_invalid(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    records = _run_batch(tmp_path, micro_model_dir, COLDBENCH_BLIND_COLD_CHECK="1")
    (canary,) = [r for r in records if r.round == CANARY_ROUND]
    # The cache held 32 tokens; the blind check read 0 and the judge passed the cell.
    assert canary.status == "ok" and canary.cached_tokens == 0
    summary = summarize(records, baseline="base")
    assert summary.canary is not None and summary.canary.runs[0].result == "passed"
    assert summary.evidence_invalid and "judged cold" in summary.evidence_invalid[0]
    assert "evidence_invalid" in summary.to_json_value()
    markdown = render_summary_md(summary, [], evidence_id="ab" * 8, page_url="/e/abab")
    assert "**Evidence invalid:** Run r-canary's warm canary" in markdown
    assert "PASSED AS COLD" in markdown
    html = render_report_html(summary, records, [], None, plotly_js_src="plotly.js")
    assert 'id="evidence-invalid"' in html and "judged cold" in html
