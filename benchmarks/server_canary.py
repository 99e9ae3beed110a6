"""The openai-server adapter's warm canary against a real mlx_lm.server: its resend/twin ratios.

Not a test. For each setting, `--runs` times in alternating order, it runs one variant process
as coldbench does (`python -m coldbench.engine.runner` in batch mode with `COLDBENCH_CANARY=1`),
whose adapter starts `python -m mlx_lm server` as a process on a loopback port, warms
`--context` tokens, then runs the canary (engine/adapters/openai_server.py `canary_cell`: a
prompt of at least `CANARY_MIN_TOKENS` sent again, timed against cold twins; `--min-tokens`
lowers that minimum, to measure smaller canaries) and one timed cell. Settings: `on` (the
server's prompt cache on, its count read), `off` (`--prompt-cache-size 0`) and, with
`--settings on,off,blind`, `blind` (cache on, the count read as 0: only the timing can tell).

It prints one JSON line per run (the canary's outcome as evidence/analysis/canary.py names it, its
size, its prefill ratio, the fastest twin's and repeat's prefill, whether the twin was slow
enough for the timing to tell: `CANARY_MIN_TWIN_PREFILL_S`) and one per setting (the ratios' range
and median, and how far the nearest run came to the adapter's threshold,
`WARM_BY_TIMING_RATIO`). A ratio under the threshold is warm by timing: a cache-on run must be
under it, a cache-off run over it.

    python benchmarks/server_canary.py --model preset:micro --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from coldbench.engine.adapters.openai_server import (
    CANARY_MIN_TOKENS,
    CANARY_MIN_TWIN_PREFILL_S,
    WARM_BY_TIMING_RATIO,
)
from coldbench.engine.canary import CANARY_ENV
from coldbench.engine.plan import CellRequest, Plan
from coldbench.evidence.analysis.canary import canary_section
from coldbench.evidence.contract.schemas import CANARY_ROUND, Record

MLX_LM_SERVER = ["{python}", "-m", "mlx_lm", "server", "--model", "{model}", "--port", "{port}"]
SETTINGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "on": (MLX_LM_SERVER, {}),
    "off": ([*MLX_LM_SERVER, "--prompt-cache-size", "0"], {}),
    "blind": (MLX_LM_SERVER, {"COLDBENCH_BLIND_COLD_CHECK": "1"}),
}
# What each setting's canary must come to for the threshold to be doing its job; where the
# cold twin was under the floor, a count that saw nothing must say `unverified`.
EXPECTED = {"on": "caught", "off": "unwarmed", "blind": "passed"}
RUN_TIMEOUT_S = 300


def run_canary(
    model: str, setting: str, context: int, seed: int, work: Path, min_tokens: int
) -> dict[str, Any]:
    """One variant process with the canary; its canary record as evidence/analysis/canary.py reads
    it."""
    command, env = SETTINGS[setting]
    records_path = work / f"{setting}-{seed}.jsonl"
    run_id = f"canary-{setting}-{seed}"
    plan = Plan(
        run_id=run_id,
        variant="server",
        adapter="openai-server",
        model=model,
        decode_tokens=2,
        seed=seed,
        records_path=str(records_path),
        server_command=command,
        cells=[CellRequest(0, 0, context)],
        warmup_contexts=[context],
    )
    plan_path = work / f"{setting}-{seed}.plan.json"
    plan_path.write_text(json.dumps(plan.to_json()))
    done = subprocess.run(
        [sys.executable, "-m", "coldbench.engine.runner", "--plan", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={
            **os.environ,
            CANARY_ENV: "1",
            "COLDBENCH_SERVER_CANARY_MIN_TOKENS": str(min_tokens),
            **env,
        },
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{setting} run {seed} failed: {done.stderr[-2000:]}")
    records = [
        Record.model_validate(json.loads(line)) for line in records_path.read_text().splitlines()
    ]
    (record,) = [r for r in records if r.round == CANARY_ROUND]
    section = canary_section(records, [run_id])
    assert section is not None
    counters = record.counters
    return {
        "setting": setting,
        "seed": seed,
        "context_tokens": context,
        "canary_tokens": record.context_tokens,
        "outcome": section.runs[0].result,
        "expected": (
            "unverified"
            if setting != "on" and counters.get("canary.timing_could_tell") is False
            else EXPECTED[setting]
        ),
        "cached_tokens": record.cached_tokens,
        "prefill_ratio": counters.get("canary.prefill_ratio"),
        "cold_twin_prefill_s": counters.get("canary.cold_twin_prefill_s"),
        "repeat_prefill_s": counters.get("canary.repeat_prefill_s"),
        "timing_could_tell": counters.get("canary.timing_could_tell"),
        "warm_by_timing": counters.get("canary.warm_by_timing"),
    }


def summary(setting: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["prefill_ratio"] for r in runs if r["prefill_ratio"] is not None]
    # The margin is the nearest run's distance to the threshold on the side it must stay on.
    if not ratios:
        margin = None
    elif setting == "off":
        margin = round(min(ratios) - WARM_BY_TIMING_RATIO, 4)
    else:
        margin = round(WARM_BY_TIMING_RATIO - max(ratios), 4)
    return {
        "setting": setting,
        "summary": True,
        "runs": len(runs),
        "outcomes": sorted({r["outcome"] for r in runs}),
        "as_expected": all(r["outcome"] == r["expected"] for r in runs),
        "ratio_min": min(ratios, default=None),
        "ratio_median": round(statistics.median(ratios), 4) if ratios else None,
        "ratio_max": max(ratios, default=None),
        "threshold": WARM_BY_TIMING_RATIO,
        "twin_floor_s": CANARY_MIN_TWIN_PREFILL_S,
        "twin_min_s": min(
            (r["cold_twin_prefill_s"] for r in runs if r["cold_twin_prefill_s"]), default=None
        ),
        "margin": margin,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:micro", help="checkpoint folder or preset:NAME")
    parser.add_argument("--context", type=int, default=512, help="the warmed context's tokens")
    parser.add_argument(
        "--min-tokens",
        type=int,
        default=CANARY_MIN_TOKENS,
        help="the adapter's minimum canary size (its own by default)",
    )
    parser.add_argument("--runs", type=int, default=3, help="variant processes per setting")
    parser.add_argument("--settings", default="on,off", help=f"of {','.join(SETTINGS)}")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown or not settings:
        parser.error(f"--settings takes {', '.join(SETTINGS)}; not {', '.join(unknown) or '-'}")
    if args.runs < 1 or args.context < 2 or args.min_tokens < 1:
        parser.error("--runs and --min-tokens must be at least 1 and --context at least 2")
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(args.runs):
            # alternating order: a load that comes and goes falls on every setting alike
            for setting in settings if rep % 2 == 0 else settings[::-1]:
                result = run_canary(
                    args.model, setting, args.context, rep, Path(scratch), args.min_tokens
                )
                results[setting].append(result)
                print(json.dumps(result), flush=True)
    for setting in settings:
        print(json.dumps(summary(setting, results[setting])), flush=True)


if __name__ == "__main__":
    main()
