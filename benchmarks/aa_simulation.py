"""How often the verdicts call identical code faster or slower, and how often they find a real
effect, under the noise a benchmark host really has (not a test; the tests import it).

One simulated job: variants `a` (the baseline), `b`, `c` and `d` at two contexts, so six
comparisons corrected as one family, as in a job with three candidates. `d` carries the planted
effect (a factor on its tok/s; 1.0 for an A/A job), `b` and `c` are always identical to `a`.
Each variant gets a fresh process every block of rounds (the job's block by the tool's own rule,
`effective_rounds_per_process`: one per round measuring until decided). A cell's log tok/s is
the sum of:

- its process's offset, N(0, process SD) (`bimodal`: +-process SD with a random sign);
- the round's shared speed, N(0, 2%) (it cancels in a pair);
- the cell's own noise, N(0, pair SD / sqrt 2) (`t3`: Student t with 3 degrees of freedom,
  scaled to the same SD);
- `drift`: a linear trend of the whole host over the run, -5% to +5% by the job's seed, going
  on between the cells of a round too;
- `step`: the whole host 5% faster from the middle round on;
- `outliers`: 1% of cells 5x slow (a stalled cell), on any variant;
- `order`: the first cell of each round 1% slow (the order rotates every round).

Every job is analysed by the real statistics:
`coldbench.evidence.analysis.summary.prefill_verdicts_at_look`, the check a run measuring until
decided makes after each look, and the summary's own rule. A fixed job is analysed once at its
rounds; a job at the default settings (the job as every front end builds it with neither rounds
nor until given: measuring until decided, first look 10 rounds, doubling, the default budget of
40) is analysed at each look and stops at the first where every comparison is decided. Per row,
with exact binomial 95% intervals (how far Monte Carlo noise alone could put the rate from the
design's true one):

- A/A jobs with any `faster`/`slower` claim (the target: 5% or less per job);
- planted comparisons found (the verdict of the planted direction) and of the wrong sign;
- coverage: the share of all comparisons whose interval holds its true ratio (each interval is
  at level 1 - 0.05 / 6 or higher, so 99.2% or more is the stated level);
- the mean rounds measured (until decided: where the jobs stopped).

    PYTHONPATH=. python benchmarks/aa_simulation.py --workers 2
    PYTHONPATH=. python benchmarks/aa_simulation.py --models gauss outliers --rounds 6 12 24 \\
        --jobs 2000 --planted-jobs 500
    PYTHONPATH=. python benchmarks/aa_simulation.py --models gauss outliers --rounds \\
        --process-sd 0.013 --workers 2          # the default settings' rows alone
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import operator
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
from scipy import stats as scipy_stats

from coldbench.evidence.analysis.stats import job_looks
from coldbench.evidence.analysis.summary import all_decided, prefill_verdicts_at_look
from coldbench.evidence.contract.schemas import JobSpec, Record, effective_rounds_per_process
from coldbench.evidence.contract.summary_schema import CLAIMS, Verdict
from coldbench.evidence.spec.job_options import build_job_spec, resolve_job

VARIANTS = ("a", "b", "c", "d")
PLANTED = "d"
CONTEXTS = (4096, 16384)
_MOMENT = datetime(2026, 12, 1, tzinfo=UTC)
NOISE_MODELS = ("gauss", "t3", "outliers", "drift", "step", "bimodal", "order")


@dataclass(frozen=True)
class Scenario:
    model: str = "gauss"
    # Exactly this many rounds; None: the default settings (measuring until decided within the
    # default budget, as the builder and its resolution make a job that gives neither).
    rounds: int | None = 24
    process_sd: float = 0.01
    pair_sd: float = 0.0075
    effect: float = 1.0  # d's true speed relative to a, b and c

    @property
    def name(self) -> str:
        return f"{self.model}, {self.how}"

    @property
    def how(self) -> str:
        if self.rounds is not None:
            return f"{self.rounds}"
        looks = ", ".join(map(str, job_looks(self.spec()).rounds))
        return f"default: until decided ({looks})"

    def spec(self) -> JobSpec:
        given = {"variants": list(VARIANTS), "contexts": list(CONTEXTS)}
        if self.rounds is not None:
            given.update(rounds=self.rounds, until="rounds")
        return resolve_job(build_job_spec(given))


def _sha(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def simulate_job(scenario: Scenario, seed: int) -> list[Record]:
    """The `ok` records of one simulated job (a seeded pure function of its arguments)."""
    rng = np.random.default_rng(seed)
    spec = scenario.spec()
    block = effective_rounds_per_process(spec) or 1
    model = scenario.model
    cell_sd = scenario.pair_sd / math.sqrt(2)
    drift = float(rng.uniform(-0.05, 0.05)) if model == "drift" else 0.0
    offsets: dict[tuple[str, int], float] = {}
    records = []
    for round_index in range(spec.rounds):
        process_block = round_index // block
        round_speed = float(rng.normal(0, 0.02))
        step = math.log(1.05) if model == "step" and round_index >= spec.rounds // 2 else 0.0
        for position in range(len(VARIANTS)):
            variant = VARIANTS[(position + round_index) % len(VARIANTS)]
            # the host's drift goes on between a round's cells too (their order rotates)
            elapsed = (round_index + position / len(VARIANTS)) / max(spec.rounds - 1, 1)
            host = drift * elapsed + step
            if (variant, process_block) not in offsets:
                if model == "bimodal":
                    offsets[(variant, process_block)] = float(
                        scenario.process_sd * rng.choice((-1.0, 1.0))
                    )
                else:
                    offsets[(variant, process_block)] = float(rng.normal(0, scenario.process_sd))
            for context in CONTEXTS:
                if model == "t3":
                    own = float(rng.standard_t(3)) * cell_sd / math.sqrt(3)
                else:
                    own = float(rng.normal(0, cell_sd))
                log_speed = offsets[(variant, process_block)] + round_speed + host + own
                if variant == PLANTED:
                    log_speed += math.log(scenario.effect)
                if model == "order" and position == 0:
                    log_speed += math.log(0.99)
                if model == "outliers" and rng.random() < 0.01:
                    log_speed -= math.log(5)
                tps = 27_000.0 * math.exp(log_speed)
                records.append(
                    Record.model_construct(
                        run_id="sim",
                        variant=variant,
                        round=round_index,
                        order=position,
                        context_tokens=context,
                        prompt_tokens=context,
                        prompt_sha256=_sha(seed, round_index, context),
                        cached_tokens=0,
                        prefill_s=context / tps,
                        prefill_tps=tps,
                        decode_tps=None,
                        status="ok",
                        reason=None,
                        started_at=_MOMENT,
                        process=process_block + 1,
                    )
                )
    return records


@dataclass(frozen=True)
class JobResult:
    verdicts: dict[tuple[str, int], str]
    covered: int  # comparisons whose interval holds the true ratio
    compared: int
    rounds: int  # rounds analysed (until decided: where the job stopped)


def run_job(scenario: Scenario, seed: int) -> JobResult:
    """One job through the real statistics: at its rounds, or look by look until decided."""
    spec = scenario.spec()
    records = simulate_job(scenario, seed)
    looks = list(job_looks(spec).rounds)
    for look in looks:
        seen = [r for r in records if r.round < look]
        _, comparisons = prefill_verdicts_at_look(seen, spec=spec)
        if all_decided(comparisons) or look == looks[-1]:
            break
    covered = 0
    for c in comparisons:
        truth = scenario.effect if c.variant == PLANTED else 1.0
        covered += c.ci_low is not None and c.ci_low <= truth <= c.ci_high
    return JobResult(
        verdicts={(c.variant, c.context_tokens): c.verdict for c in comparisons},
        covered=covered,
        compared=len(comparisons),
        rounds=look,
    )


@dataclass(frozen=True)
class Rates:
    scenario: Scenario
    jobs: int
    claimed: int  # jobs with a `faster`/`slower` among the identical variants (b, c)
    found: int  # planted comparisons with the planted direction's verdict
    wrong_sign: int  # planted comparisons with the other direction's verdict
    planted: int  # planted comparisons (0 for A/A)
    covered: int
    compared: int
    rounds: int  # summed over jobs
    verdicts: dict[str, int] = field(default_factory=dict)  # planted comparisons' verdicts

    def __add__(self, other: Rates) -> Rates:
        verdicts = Counter(self.verdicts)
        verdicts.update(other.verdicts)
        return Rates(
            self.scenario,
            self.jobs + other.jobs,
            self.claimed + other.claimed,
            self.found + other.found,
            self.wrong_sign + other.wrong_sign,
            self.planted + other.planted,
            self.covered + other.covered,
            self.compared + other.compared,
            self.rounds + other.rounds,
            dict(verdicts),
        )


def _rates_of_jobs(scenario: Scenario, first: int, count: int, seed: int) -> Rates:
    expected = Verdict.FASTER if scenario.effect > 1 else Verdict.SLOWER
    (other,) = CLAIMS - {expected}
    planted_effect = scenario.effect != 1.0
    claimed = found = wrong = planted = covered = compared = rounds = 0
    verdicts: Counter[str] = Counter()
    for job in range(first, first + count):
        result = run_job(scenario, seed * 1_000_003 + job)
        identical = [
            v for (name, _), v in result.verdicts.items() if name != PLANTED or not planted_effect
        ]
        claimed += any(v in CLAIMS for v in identical)
        if planted_effect:
            for (name, _), verdict in result.verdicts.items():
                if name == PLANTED:
                    planted += 1
                    found += verdict == expected
                    wrong += verdict == other
                    verdicts[verdict] += 1
        covered += result.covered
        compared += result.compared
        rounds += result.rounds
    return Rates(
        scenario, count, claimed, found, wrong, planted, covered, compared, rounds, dict(verdicts)
    )


CHUNK = 25


def rates(scenario: Scenario, *, jobs: int, seed: int = 0, workers: int = 1) -> Rates:
    """The rates of `jobs` seeded jobs (the same numbers with any number of `workers`)."""
    chunks = [(scenario, first, min(CHUNK, jobs - first), seed) for first in range(0, jobs, CHUNK)]
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_rates_of_jobs, *zip(*chunks, strict=True)))
    else:
        parts = [_rates_of_jobs(*chunk) for chunk in chunks]
    return functools.reduce(operator.add, parts)


def proportion_interval(count: int, total: int) -> tuple[float, float]:
    """Exact (Clopper-Pearson) 95% interval of a rate seen `count` times in `total` trials."""
    if total == 0:
        return 0.0, 1.0
    found = scipy_stats.binomtest(count, total).proportion_ci(confidence_level=0.95)
    return float(found.low), float(found.high)


def _rate(count: int, total: int) -> str:
    if total == 0:
        return "-"
    low, high = proportion_interval(count, total)
    return f"{100 * count / total:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="A/A jobs per row")
    parser.add_argument("--planted-jobs", type=int, default=250, help="planted jobs per row")
    parser.add_argument("--effect", type=float, default=0.98, help="the planted speed ratio")
    parser.add_argument("--models", nargs="+", choices=NOISE_MODELS, default=list(NOISE_MODELS))
    parser.add_argument(
        "--rounds", type=int, nargs="*", default=[6, 12, 24], help="fixed rounds, a row each"
    )
    parser.add_argument(
        "--default",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add a row at the default settings (until decided, its default budget) per model",
    )
    parser.add_argument("--process-sd", type=float, default=0.01)
    parser.add_argument("--pair-sd", type=float, default=0.0075)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes (same numbers)")
    args = parser.parse_args(argv)
    print(
        f"process SD {100 * args.process_sd:g}%, pair SD {100 * args.pair_sd:g}%, planted "
        f"effect {args.effect:g} on one of three candidates, 6 comparisons per job\n"
    )
    print(
        "| noise | rounds | A/A jobs | A/A jobs with a claim [95%] | planted comparisons | "
        "found [95%] | wrong sign | coverage | mean rounds |"
    )
    print("| --- | --- | ---: | --- | ---: | --- | ---: | --- | ---: |")
    worst: tuple[float, str] | None = None
    for model in args.models:
        designs = [Scenario(model, rounds=r) for r in args.rounds]
        if args.default:
            designs.append(Scenario(model, rounds=None))
        for design in designs:
            design = replace(design, process_sd=args.process_sd, pair_sd=args.pair_sd)
            run = functools.partial(rates, seed=args.seed, workers=args.workers)
            aa = run(design, jobs=args.jobs)
            planted = run(replace(design, effect=args.effect), jobs=args.planted_jobs)
            both = aa + planted
            how = design.how
            print(
                f"| {model} | {how} | {aa.jobs} | {_rate(aa.claimed, aa.jobs)} | "
                f"{planted.planted} | {_rate(planted.found, planted.planted)} | "
                f"{planted.wrong_sign} | {_rate(both.covered, both.compared)} | "
                f"{both.rounds / both.jobs:.1f} |",
                flush=True,
            )
            rate = aa.claimed / aa.jobs
            if worst is None or rate > worst[0]:
                worst = (rate, f"{model}, {how}")
    if worst is not None:
        low, _ = proportion_interval(round(worst[0] * args.jobs), args.jobs)
        side = "at or below" if worst[0] <= 0.05 else "above"
        excess = "a real excess" if low > 0.05 else "within Monte Carlo noise of 5% or less"
        print(f"\nhighest A/A rate: {100 * worst[0]:.1f}% ({worst[1]}), {side} 5%: {excess}")


if __name__ == "__main__":
    main()
