"""How often the verdicts' interval covers its ratio, by number of units (not a test).

Draws `--samples` normal samples of n log ratios centred on 0 for each n and counts how often
`coldbench.evidence.analysis.stats.trimmed_estimate`'s interval at `--level` holds 0, beside the
same trimmed mean with Yuen's own h - 1 degrees of freedom (the interval's degrees of freedom are
one fewer where units are trimmed, docs/EVIDENCE.md "Verdicts"). Seeded: the same numbers every run.

    PYTHONPATH=. python benchmarks/interval_coverage.py
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats as scipy_stats

from coldbench.evidence.analysis.stats import trimmed_estimate


def coverage(units: int, samples: int, level: float, seed: int) -> tuple[float, float]:
    """(this rule's coverage, Yuen's with h - 1 degrees of freedom) over `samples` draws."""
    rng = np.random.default_rng(seed + units)
    ours = yuen = 0
    for _ in range(samples):
        estimate = trimmed_estimate(rng.normal(0.0, 1.0, size=units).tolist())
        assert estimate is not None
        low, high = estimate.interval(level)
        ours += low <= 1 <= high
        kept = units - 2 * estimate.trimmed
        q = float(scipy_stats.t.ppf(1 - (1 - level) / 2, kept - 1))
        yuen += abs(estimate.centre) <= q * estimate.se
    return ours / samples, yuen / samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[3, 6, 10, 12, 16, 24, 48])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print("| units | trimmed per end | coverage | Yuen's h - 1 degrees of freedom |")
    print("| ---: | ---: | ---: | ---: |")
    for units in args.units:
        ours, yuen = coverage(units, args.samples, args.level, args.seed)
        trimmed = trimmed_estimate([0.0] * units)
        per_end = trimmed.trimmed if trimmed is not None else 0
        print(f"| {units} | {per_end} | {100 * ours:.1f}% | {100 * yuen:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
