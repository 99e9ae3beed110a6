"""engine/plan.py's `Plan` as PLAN.json: what the worker writes is what the runner reads, and a
plan that uses no later field carries none (an older embedded ref's runner refuses them)."""

from __future__ import annotations

import json

import pytest

from coldbench.engine.plan import CellRequest, Plan

# The fields of a plan that every runner reads (an embedded ref's, from before corpora and
# servers, included): a job that uses nothing later writes these and no other.
EVERY_RUNNER_READS = {
    "run_id",
    "variant",
    "adapter",
    "model",
    "records_path",
    "flags",
    "decode_tokens",
    "seed",
    "checkout",
    "server_command",
    "cells",
    "warmup_contexts",
}


def test_a_full_plan_survives_json_both_ways() -> None:
    plan = Plan(
        run_id="r-1",
        variant="base",
        adapter="openai-server",
        model="/abs/model",
        records_path="/abs/records.jsonl",
        flags={"prefill_step_size": 256},
        decode_tokens=4,
        seed=3,
        checkout="/abs/checkout",
        server_command=["{python}", "-m", "server", "{port}"],
        cells=[CellRequest(0, 1, 64)],
        warmup_tokens=32,
        warmup_contexts=[64, 128],
        server_options={
            "step": {"value": 256, "argv": ["--step", "256"], "env": {}, "proof": None}
        },
        wipe=["/abs/cache"],
        first_token_timeout_s=2.5,
        corpus="mine",
        corpus_path="/abs/mine.txt",
    )
    written = json.loads(json.dumps(plan.to_json()))
    assert written["cells"] == [{"round": 0, "order": 1, "context_tokens": 64}]
    assert Plan.from_json(written) == plan


def test_a_plan_without_later_fields_writes_only_what_every_runner_reads() -> None:
    plan = Plan(
        run_id="r-1",
        variant="base",
        adapter="embedded",
        model="/abs/model",
        records_path="/abs/records.jsonl",
        warmup_contexts=[64],
    )
    written = plan.to_json()
    assert set(written) == EVERY_RUNNER_READS
    assert written["checkout"] is None and written["cells"] is None and written["flags"] == {}
    assert Plan.from_json(written) == plan


def test_the_written_plan_is_a_copy() -> None:
    plan = Plan(run_id="r", variant="a", adapter="embedded", model="m", flags={"compile": True})
    plan.to_json()["flags"]["compile"] = False
    assert plan.flags == {"compile": True}


def test_a_plan_without_records_path_is_refused_by_the_runner() -> None:
    # The orchestrator fills records_path per process; a plan that reaches the runner without
    # it is refused by name.
    written = Plan(run_id="r", variant="a", adapter="embedded", model="m").to_json()
    with pytest.raises(ValueError, match="records_path"):
        Plan.from_json(written)
