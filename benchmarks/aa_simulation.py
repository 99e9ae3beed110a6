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
comparison is `faster` or `slower`; a planted job (c's speed times `--effect`) counts as found
when c/a gets the verdict of the planted direction. Each row prints both rates of one design
and noise, each with its exact binomial 95% interval: how far Monte Carlo noise alone could put
the rate from the design's true one. A rate above 5% whose interval still reaches 5% is noise at
this many jobs; one whose interval lies above 5% is a real excess. The planted rate is the
power, so a rule that never claims anything shows as one that never finds anything. The last
line names the highest A/A rate and says which of the two it is.

Default: the final rule (`calibrated`) and the default blocks of a host without a calibration,
process SD 0-2%, 2,000 A/A and 500 planted jobs per row; `--designs` adds the designs before
them. Seeded: the same numbers with any `--workers`.

    PYTHONPATH=. python benchmarks/aa_simulation.py --workers 2
    PYTHONPATH=. python benchmarks/aa_simulation.py --designs calibrated --process-sd 0.01 \\
        --jobs 10000 --planted-jobs 0
    PYTHONPATH=. python benchmarks/aa_simulation.py --designs one-process per-round \\
        default blocks-of-1 calibrated --process-sd 0.01 --jobs 400
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import operator
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
from scipy import stats as scipy_stats

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

    def __add__(self, other: Rates) -> Rates:
        verdicts = Counter(self.verdicts)
        verdicts.update(other.verdicts)
        return Rates(
            self.scenario,
            self.jobs + other.jobs,
            self.claimed + other.claimed,
            self.detected + other.detected,
            dict(verdicts),
            self.block_lengths + other.block_lengths,
        )


def _rates_of_jobs(
    scenario: Scenario, first: int, count: int, seed: int, n_resamples: int
) -> Rates:
    """Jobs first .. first + count - 1 (first a multiple of RECALIBRATE, so a calibrated
    scenario's calibrations are the same however the jobs are split among workers)."""
    claimed = detected = 0
    verdicts: Counter[str] = Counter()
    expected = "faster" if scenario.effect > 1 else "slower"
    noise: HostNoise | None = None
    lengths: list[int] = []
    for job in range(first, first + count):
        job_seed = seed * 1_000_003 + job
        run = scenario
        if scenario.calibrated:
            if noise is None or job % RECALIBRATE == 0:
                noise = simulated_calibration(scenario, seed * 7919 + job - job % RECALIBRATE)
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
    return Rates(scenario, count, claimed, detected, dict(verdicts), lengths)


def rates(
    scenario: Scenario, *, jobs: int, seed: int = 0, n_resamples: int = 1000, workers: int = 1
) -> Rates:
    """The rates of `jobs` seeded jobs (the same numbers with any number of `workers`)."""
    chunks = [
        (scenario, first, min(RECALIBRATE, jobs - first), seed, n_resamples)
        for first in range(0, jobs, RECALIBRATE)
    ]
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_rates_of_jobs, *zip(*chunks, strict=True)))
    else:
        parts = [_rates_of_jobs(*chunk) for chunk in chunks]
    return functools.reduce(operator.add, parts)


def proportion_interval(count: int, total: int) -> tuple[float, float]:
    """Exact (Clopper-Pearson) 95% interval of a rate seen `count` times in `total` jobs: how
    far Monte Carlo noise alone could put the observed rate from the true one."""
    if total == 0:
        return 0.0, 1.0
    found = scipy_stats.binomtest(count, total).proportion_ci(confidence_level=0.95)
    return float(found.low), float(found.high)


DESIGNS = ("calibrated", "default", "blocks-of-1", "per-round", "one-process")


def design_scenario(design: str, rounds: int, **common: float) -> Scenario:
    """One design of the module docstring at these rounds; `default` is what a job on a host
    without a calibration runs (rounds // 12 rounds per process, at least 1)."""
    from evidence.schemas import default_rounds_per_process

    block = default_rounds_per_process(rounds)
    if design == "calibrated":
        return Scenario("calibrated", rounds=rounds, calibrated=True, **common)
    if design == "default":
        return Scenario(f"blocks of {block}", rounds=rounds, rounds_per_process=block, **common)
    if design == "blocks-of-1":
        return Scenario("blocks of 1", rounds=rounds, rounds_per_process=1, **common)
    if design == "per-round":
        return Scenario(
            f"blocks of {block}, per-round statistics",
            rounds=rounds,
            rounds_per_process=block,
            per_round_statistics=True,
            **common,
        )
    if design == "one-process":
        return Scenario("one process", rounds=rounds, **common)
    raise ValueError(f"unknown design {design!r} (one of {', '.join(DESIGNS)})")


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="A/A jobs per row")
    parser.add_argument("--planted-jobs", type=int, default=500, help="planted jobs per row")
    parser.add_argument("--effect", type=float, default=0.98, help="the planted speed ratio")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument(
        "--process-sd", type=float, nargs="+", default=[0.0, 0.0025, 0.005, 0.01, 0.015, 0.02]
    )
    parser.add_argument("--pair-sd", type=float, nargs="+", default=[0.0075])
    parser.add_argument("--designs", nargs="+", choices=DESIGNS, default=["calibrated", "default"])
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes (same numbers)")
    args = parser.parse_args(argv)
    print(
        "| design | process SD | pair SD | A/A jobs | A/A jobs with faster/slower [95%] | "
        "planted jobs | planted effect found [95%] |"
    )
    print("| --- | --- | --- | ---: | --- | ---: | --- |")
    worst: tuple[float, float, str] | None = None  # (rate, interval's low end, row)
    for process_sd in args.process_sd:
        for pair_sd in args.pair_sd:
            for design in args.designs:
                common = {"process_sd": process_sd, "pair_sd": pair_sd}
                aa_scenario = design_scenario(design, args.rounds, **common)
                planted_scenario = design_scenario(
                    design, args.rounds, effect=args.effect, **common
                )
                run = functools.partial(
                    rates, seed=args.seed, n_resamples=args.resamples, workers=args.workers
                )
                aa = run(aa_scenario, jobs=args.jobs)
                planted = (
                    run(planted_scenario, jobs=args.planted_jobs) if args.planted_jobs else None
                )
                name = aa_scenario.name
                if aa.block_lengths:
                    lengths = set(aa.block_lengths + (planted.block_lengths if planted else []))
                    name += f" (blocks of {', '.join(map(str, sorted(lengths)))})"
                rate = aa.claimed / aa.jobs
                low, high = proportion_interval(aa.claimed, aa.jobs)
                found = "-"
                if planted is not None:
                    found_low, found_high = proportion_interval(planted.detected, planted.jobs)
                    found = (
                        f"{_pct(planted.detected / planted.jobs)} "
                        f"[{_pct(found_low)}, {_pct(found_high)}]"
                    )
                row = f"{name}, process SD {100 * process_sd:g}%, pair SD {100 * pair_sd:g}%"
                if worst is None or rate > worst[0]:
                    worst = (rate, low, row)
                print(
                    f"| {name} | {100 * process_sd:g}% | {100 * pair_sd:g}% | {aa.jobs} | "
                    f"{_pct(rate)} [{_pct(low)}, {_pct(high)}] | "
                    f"{planted.jobs if planted else 0} | {found} |",
                    flush=True,
                )
    if worst is not None:
        rate, low, row = worst
        side = "at or below" if rate <= 0.05 else "above"
        excess = "a real excess" if low > 0.05 else "within Monte Carlo noise of 5% or less"
        print(
            f"\nhighest A/A rate: {_pct(rate)} ({row}), {side} 5%; its interval starts at "
            f"{_pct(low)}: {excess}"
        )


if __name__ == "__main__":
    main()
