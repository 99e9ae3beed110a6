"""How often the verdicts call identical code faster or slower, and how often they find a real
effect, when every process carries a speed offset of its own (not a test; the tests import it).

Model of one simulated job: variants `a` (the baseline), `b` and `c` at one context, `rounds`
rounds. Each process of a variant has a log-speed offset drawn from N(0, process_sd); each cell
adds N(0, pair_sd / sqrt(2)) (so a paired ratio has noise pair_sd); a planted effect multiplies
`c`'s speed by `effect`. Designs:

- `one process`: one process per variant for the whole run (coldbench before process
  rotation); records carry no `process`, so the per-round statistics apply.
- `blocks of R`: every variant gets a fresh process every R rounds; records carry `process`.
- `blocks of R, per-round statistics`: the same records with `process` removed, analysed as if
  rounds were independent (to show that rotation alone is not enough).
- `calibrated`: the host is calibrated first, as `coldbench calibrate` does (`CAL_RUNS` runs of
  a, b, c and a planted p, one block of `CAL_ROUNDS` rounds each, at the same process and pair
  SD), its noise gives the block length (`evidence.calibration.block_length`, with a block
  start of `START_S` seconds against a cell of `CELL_S`) and the statistics count pairs with
  the design effect of the calibrated bound (`StatsOptions.process_pair_sd`). A new
  calibration every `RECALIBRATE` jobs, so the rates include the calibrations' own spread.

Each job is analysed by the real `evidence.stats.compare_matrix` (two comparisons, b/a and c/a,
Holm-corrected as one family). An A/A job (effect 1.0) counts as a false claim when either
comparison is `faster` or `slower`; a planted job counts as detected when c/a gets the verdict
of the planted direction.

    PYTHONPATH=. python benchmarks/aa_simulation.py --jobs 200
    PYTHONPATH=. python benchmarks/aa_simulation.py --jobs 200 --rounds 12 --process-sd 0.02
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from evidence.calibration import block_length, noise_of
from evidence.schemas import HostNoise, Record
from evidence.stats import CellIndex, StatsOptions, calibration_sums, compare_matrix

VARIANTS = ("a", "b", "c")
CONTEXT = 16384
_MOMENT = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Scenario:
    name: str
    rounds: int = 24
    rounds_per_process: int | None = None  # None: one process per variant for the whole run
    per_round_statistics: bool = False  # drop `process` before the analysis
    process_sd: float = 0.01
    pair_sd: float = 0.0075
    effect: float = 1.0  # c's true speed relative to a and b
    calibrated: bool = False  # the host's calibration sets the blocks and the statistics


# The calibrated design (module docstring): an H200-like cost of a block start and of a cell.
CAL_RUNS = 10
CAL_ROUNDS = 12
START_S = 8.0
CELL_S = 0.75
RECALIBRATE = 20


def _sha(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def simulate_job(
    scenario: Scenario, seed: int, *, variants: tuple[str, ...] = VARIANTS, planted: str = "c"
) -> list[Record]:
    """The `ok` records of one simulated job (a seeded pure function of its arguments)."""
    rng = np.random.default_rng(seed)
    per_process = scenario.rounds_per_process or scenario.rounds
    offsets: dict[tuple[str, int], float] = {}
    cell_sd = scenario.pair_sd / math.sqrt(2)
    records = []
    for round_index in range(scenario.rounds):
        block = round_index // per_process
        round_speed = float(rng.normal(0, 0.02))  # shared by the round's cells: cancels in pairs
        for variant in variants:
            if (variant, block) not in offsets:
                offsets[(variant, block)] = float(rng.normal(0, scenario.process_sd))
            log_speed = offsets[(variant, block)] + round_speed + float(rng.normal(0, cell_sd))
            if variant == planted:
                log_speed += math.log(scenario.effect)
            tps = 27_000.0 * math.exp(log_speed)
            process = None
            if scenario.rounds_per_process is not None and not scenario.per_round_statistics:
                process = block + 1
            records.append(
                Record.model_construct(
                    run_id="sim",
                    variant=variant,
                    round=round_index,
                    order=0,
                    context_tokens=CONTEXT,
                    prompt_tokens=CONTEXT,
                    prompt_sha256=_sha(seed, round_index),
                    cached_tokens=0,
                    prefill_s=CONTEXT / tps,
                    prefill_tps=tps,
                    decode_tps=None,
                    status="ok",
                    reason=None,
                    started_at=_MOMENT,
                    process=process,
                )
            )
    return records


def job_verdicts(
    records: Sequence[Record],
    *,
    seed: int,
    n_resamples: int,
    process_pair_sd: float | None = None,
) -> dict[str, str]:
    """Verdict of b/a and c/a, corrected as one family, through the real statistics."""
    comparisons, _ = compare_matrix(
        CellIndex.of(records),
        variants=list(VARIANTS),
        baseline="a",
        contexts=[CONTEXT],
        metric="prefill_tps",
        options=StatsOptions(seed=seed, n_resamples=n_resamples, process_pair_sd=process_pair_sd),
    )
    return {c.variant: c.verdict for c in comparisons}


def simulated_calibration(scenario: Scenario, seed: int) -> HostNoise:
    """The noise a calibration of this host finds (module docstring, `calibrated`)."""
    calibration = Scenario(
        "calibration",
        rounds=CAL_ROUNDS,
        rounds_per_process=CAL_ROUNDS,
        process_sd=scenario.process_sd,
        pair_sd=scenario.pair_sd,
        effect=0.98,
    )
    runs = [
        simulate_job(
            calibration, seed * 1_000_003 + run, variants=("a", "b", "c", "p"), planted="p"
        )
        for run in range(CAL_RUNS)
    ]
    noise = noise_of(
        calibration_sums(runs, baseline="a"),
        load_s=START_S - len(VARIANTS) * CELL_S,
        cell_s_per_token=CELL_S / CONTEXT,
        contexts=[CONTEXT],
    )
    assert noise is not None
    return noise


@dataclass(frozen=True)
class Rates:
    scenario: Scenario
    jobs: int
    claimed: int  # jobs with any `faster` / `slower`
    detected: int  # jobs where c/a has the planted direction's verdict
    verdicts: dict[str, int]  # c/a's verdicts
    block_lengths: list[int] = field(default_factory=list)  # calibrated: each job's blocks

    @property
    def claimed_pct(self) -> float:
        return 100 * self.claimed / self.jobs

    @property
    def detected_pct(self) -> float:
        return 100 * self.detected / self.jobs


def rates(scenario: Scenario, *, jobs: int, seed: int = 0, n_resamples: int = 1000) -> Rates:
    claimed = detected = 0
    verdicts: Counter[str] = Counter()
    expected = "faster" if scenario.effect > 1 else "slower"
    noise: HostNoise | None = None
    lengths: list[int] = []
    for job in range(jobs):
        job_seed = seed * 1_000_003 + job
        run = scenario
        if scenario.calibrated:
            if job % RECALIBRATE == 0:
                noise = simulated_calibration(scenario, seed * 7919 + job)
            assert noise is not None
            length, _ = block_length(
                scenario.rounds, contexts=[CONTEXT], variants=len(VARIANTS), noise=noise
            )
            lengths.append(length)
            run = Scenario(**{**scenario.__dict__, "rounds_per_process": length})
        found = job_verdicts(
            simulate_job(run, job_seed),
            seed=job_seed,
            n_resamples=n_resamples,
            process_pair_sd=noise.process_pair_sd_upper if noise is not None else None,
        )
        claimed += any(v in ("faster", "slower") for v in found.values())
        detected += scenario.effect != 1.0 and found["c"] == expected
        verdicts[found["c"]] += 1
    return Rates(scenario, jobs, claimed, detected, dict(verdicts), lengths)


def default_scenarios(rounds: int, process_sd: float, pair_sd: float) -> list[Scenario]:
    from evidence.schemas import default_rounds_per_process

    block = default_rounds_per_process(rounds)
    out = []
    for effect in (1.0, 0.98):
        common = {"rounds": rounds, "process_sd": process_sd, "pair_sd": pair_sd, "effect": effect}
        out += [
            Scenario("one process", **common),
            Scenario(
                f"blocks of {block}, per-round statistics",
                rounds_per_process=block,
                per_round_statistics=True,
                **common,
            ),
            Scenario(f"blocks of {block}", rounds_per_process=block, **common),
            Scenario("blocks of 1", rounds_per_process=1, **common),
            Scenario("calibrated", calibrated=True, **common),
        ]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--process-sd", type=float, nargs="+", default=[0.0, 0.01, 0.02])
    parser.add_argument("--pair-sd", type=float, nargs="+", default=[0.005, 0.01])
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        "| design | process SD | pair SD | effect | jobs | A/A jobs with faster/slower | "
        "planted effect detected |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for process_sd in args.process_sd:
        for pair_sd in args.pair_sd:
            for scenario in default_scenarios(args.rounds, process_sd, pair_sd):
                result = rates(scenario, jobs=args.jobs, seed=args.seed, n_resamples=args.resamples)
                aa = scenario.effect == 1.0
                name = scenario.name
                if result.block_lengths:
                    lengths = sorted(set(result.block_lengths))
                    name += f" (blocks of {', '.join(map(str, lengths))})"
                print(
                    f"| {name} | {100 * process_sd:g}% | {100 * pair_sd:g}% | "
                    f"{scenario.effect:g} | {result.jobs} | "
                    f"{f'{result.claimed_pct:.1f}%' if aa else '-'} | "
                    f"{'-' if aa else f'{result.detected_pct:.1f}%'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
