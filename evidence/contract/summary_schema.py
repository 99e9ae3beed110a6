"""summary.json's contract: one typed model per section, the bottom layer of the statistics.

`coldbench.evidence.analysis.summary.summarize` builds a `Summary` once; nothing changes it
afterwards (every model is frozen), and the renderers (summary.md, report.html, the service's pages,
the CLI) read its attributes. `coldbench verify` validates a bundle's summary.json against `Summary`
(unknown keys included: `extra="forbid"`), and `verify --recompute` compares two `Summary`
values field by field.

Which keys a file holds. A field without a default is always written (its value may be
null); a field with a default is written only where the summary set it: `why` on a comparison
without pairs, the process-block fields (`blocks`, `unit`, `process_sd`, `block`,
`by_context`, `settings.process_blocks`, `noise_floor`) only for records stamped with their
process, a drift line's fit only when it had baseline cells, `timeline` only when the bundle has
a run's timeline.json, `history`, `bisect` and `commits` only in their modes, `first_cells`
only where a run's records carry process instances and a block has cells to test.
`summary_json_bytes` writes exactly those (`exclude_unset`), so a summary read back from its file
writes the same bytes.

May import: pydantic, `coldbench.evidence.contract.schemas` and the standard library (nothing that
computes).
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from coldbench.evidence.contract.schemas import Mode, SynthesizedTree

SummaryFormat = Literal["coldbench.summary/1"]
SUMMARY_FORMAT: Final[SummaryFormat] = "coldbench.summary/1"


class Verdict(StrEnum):
    """What a comparison's interval states (`coldbench.evidence.analysis.stats.decide` is the rule).
    A StrEnum: summary.json, the pages and templates keep the words."""

    FASTER = "faster"
    SLOWER = "slower"
    NO_CHANGE = "no established change"
    INCONCLUSIVE = "inconclusive"
    NO_VALID_PAIRS = "no valid pairs"

    @property
    def is_claim(self) -> bool:
        """A claim of a change (faster or slower), as against no change or no decision."""
        return self in CLAIMS


# The verdicts that claim a change, and those that answer the question (a claim, or no change
# larger than the precision); a plain verdict string tests the same (`v in CLAIMS`).
CLAIMS: Final[frozenset[Verdict]] = frozenset({Verdict.FASTER, Verdict.SLOWER})
DECIDED: Final[frozenset[Verdict]] = CLAIMS | {Verdict.NO_CHANGE}
ParityResult = Literal["exact", "accepted", "diverged", "unknown"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HasInterval(Protocol):
    ci_low: float | None
    ci_high: float | None


def decisive_interval(result: HasInterval | None) -> tuple[float, float] | None:
    """(ci_low, ci_high) when `result` has an interval at the confidence level; None when it
    has none or only a lower one (`ci_level` set): a rule that compares 95% intervals must not
    rest on it."""
    if result is None or result.ci_low is None or result.ci_high is None:
        return None
    if getattr(result, "ci_level", None) is not None:
        return None
    return (result.ci_low, result.ci_high)


def level_field(level: float | None) -> dict[str, float]:
    """`{"ci_level": level}` for a section built from a comparison, or nothing when the
    interval is at the confidence level (summary.json keeps only the keys a section set)."""
    return {} if level is None else {"ci_level": level}


# --- statistics settings -------------------------------------------------------------------


class Bootstrap(_Section):
    statistic: str
    method: str
    interval: str
    n_resamples: int
    seed: int


class ProcessBlocks(_Section):
    unit: str
    interval: str
    test: str


PROCESS_BLOCK_SETTINGS = ProcessBlocks(
    unit="process pair: the pairs measured by one process of the variant and one of the "
    "baseline (records' `process`), counted as the median of its pairs' log ratios",
    interval="Yuen's 20% trimmed mean of the process pairs' log ratios with its t interval",
    test="the interval: it excludes 1 exactly where Yuen's trimmed t test rejects",
)


class Sequential(_Section):
    """The looks of a run measuring until its verdicts are decided
    (coldbench.evidence.analysis.stats `Looks`)."""

    looks: list[int]  # the rounds after which verdicts may be taken; the last is the budget
    taken: int  # how many of them the records reach
    rounds_analysed: int  # the rounds of the last look taken (later rounds are not analysed)
    alpha: float  # the share of alpha the last look taken spends
    stopped: str  # why measuring stopped


class Settings(_Section):
    confidence_level: float
    alpha: float
    precision: float
    min_pairs: int
    test: str
    correction: str
    interval: str | None = None
    bootstrap: Bootstrap | None = None
    process_blocks: ProcessBlocks | None = None
    sequential: Sequential | None = None


# --- comparisons -----------------------------------------------------------------------------


class PairRatio(_Section):
    run_id: str
    round: int
    ratio: float
    block: int | None = None


class Comparison(_Section):
    """One variant against the baseline at one context (coldbench.evidence.analysis.stats' module
    docstring)."""

    context_tokens: int
    variant: str
    baseline: str
    n: int
    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    verdict: Verdict
    # Inconclusive only (coldbench.evidence.analysis.stats): rounds for a +-precision interval, and
    # rounds to detect a change of the size observed; two different costs. `time_needed_s` and
    # `time_to_detect_s`: what runs of those rounds would take at this job's measured cost (set
    # where its runs have timelines; coldbench.evidence.contract.timeline `advice_cost_s`).
    rounds_needed: int | None
    ratios: list[PairRatio]
    rounds_to_detect: int | None = None
    time_needed_s: float | None = None
    time_to_detect_s: float | None = None
    why: str | None = None
    blocks: int | None = None
    unit: str | None = None
    process_sd: float | None = None
    # The interval's real coverage, set only below the confidence level (too few units for it;
    # coldbench.evidence.analysis.stats): such an interval is labelled so and decides nothing.
    ci_level: float | None = None
    # the interval's level for this comparison: 1 - alpha_look / m
    # (coldbench.evidence.analysis.stats)
    interval_level: float | None = None


class AblationEntry(Comparison):
    feature: str


class Ablation(_Section):
    note: str
    correction: str
    entries: list[AblationEntry]


# --- descriptive, runs, invalid cells ---------------------------------------------------------


class Quantiles(_Section):
    median: float
    q1: float
    q3: float
    min: float
    max: float


class MemoryStats(_Section):
    median: int
    max: int


class Descriptive(_Section):
    context_tokens: int
    variant: str
    n: int
    prefill_tps: Quantiles | None
    decode_tps: Quantiles | None
    peak_memory_bytes: MemoryStats | None
    inert: list[str]


class RunCount(_Section):
    run_id: str
    host: str | None
    records: int
    ok: int


class InvalidCell(_Section):
    run_id: str
    variant: str
    round: int
    context_tokens: int
    status: str
    reason: str


class Invalid(_Section):
    total: int
    by_reason: dict[str, int]
    cells: list[InvalidCell]
    pairs_with_different_prompts: int


# --- the warm canary (evidence/analysis/canary.py)
# ---------------------------------------------------


CanaryResult = Literal["caught", "passed", "unwarmed", "unverified", "error", "missing"]


class CanaryCell(_Section):
    run_id: str
    variant: str
    context_tokens: int
    cached_tokens: int | None
    # caught: the cold check refused it, as it must; passed: it was judged cold (the run's
    # evidence is invalid); unwarmed: a server that keeps no prompt cache could not be made
    # warm (a caveat); unverified: a server's count saw nothing and its timing could not tell
    # (a caveat); error: it did not run to a verdict; missing: the run has none
    result: CanaryResult
    reason: str | None


class Canary(_Section):
    runs: list[CanaryCell]
    rule: str


# --- the MLX builds (evidence/analysis/builds.py)
# ----------------------------------------------------


class MlxBuild(_Section):
    run_id: str
    variant: str
    version: str | None
    origin: str
    digest: str


class MlxBuilds(_Section):
    builds: list[MlxBuild]
    runs_with_different_builds: list[str]


# --- achieved FLOP rate against the device's peak (evidence/analysis/peak.py)
# ----------------------


class PrefillRate(_Section):
    run_id: str
    context_tokens: int
    variant: str
    n: int
    flops_per_cell: float
    tflops_median: float
    share_of_peak: float | None


class RunPeak(_Section):
    run_id: str
    device: str | None
    peak_tflops: float | None
    dtype: str | None
    source: str | None
    measured: bool
    # cells left out of the statistics: their rate was above the peak's limit
    over_peak: int


class Peak(_Section):
    runs: list[RunPeak]
    rates: list[PrefillRate]
    flop_rule: str
    rule: str


# --- GPU telemetry (evidence/analysis/telemetry.py)
# --------------------------------------------------


class RunTelemetry(_Section):
    run_id: str
    source: str | None
    # why there is none (the CPU backend, no NVML): every value below is then None or 0
    unavailable: str | None
    cells: int
    sm_clock_mhz_median: float | None
    sm_clock_mhz_min: float | None
    power_w_max: float | None
    temperature_c_max: float | None
    throttled_cells: int
    throttle_reasons: list[str]
    clock_drop_pct: float | None
    flagged: bool
    # macOS (`pmset -g therm`, engine/telemetry.py), set only where a Mac's cells carry it:
    # cells read, the lowest CPU_Speed_Limit (None: never limited) and the highest warning level
    mac_cells: int = 0
    cpu_speed_limit_min_pct: int | None = None
    mac_warning_level_max: int | None = None


class Telemetry(_Section):
    runs: list[RunTelemetry]
    rule: str


# --- the first timed cell of each process block (evidence/analysis/first_cells.py)
# --------------------------------------------------


class FirstCellBlock(_Section):
    """One process block's first timed cell against the block's other cells of its variant and
    context."""

    block: int  # the block's place in its run, in time order (0: the first)
    variant: str
    round: int
    context_tokens: int
    # the first cell's prefill time over the median of the others' (above 1: it was slower)
    slowdown: float
    others: int  # the block's other cells of its variant and context
    faster_others: int  # how many of them were faster than the first cell (its rank, from 0)


class RunFirstCells(_Section):
    run_id: str
    blocks: int  # blocks with at least one other cell of the first cell's variant and context
    slow_blocks: int  # blocks whose first cell was slower than the rest by more than the threshold
    slowdown_slow_median: float | None  # the median slowdown of those (None: there are none)
    slowdown_geomean: float | None  # the geometric mean slowdown over every block tested
    p_value: float | None  # the exact rank test (module docstring); None: no block to test
    established: bool
    left_out: int  # cells left out of every statistic: the first cells and their pairs
    treatment: str
    cells: list[FirstCellBlock]


class FirstCells(_Section):
    threshold: float
    alpha: float
    runs: list[RunFirstCells]
    rule: str


# --- parity ---------------------------------------------------------------------------------


class ParityCell(_Section):
    run_id: str
    round: int
    context_tokens: int
    variant: str
    first_divergence: int | None
    baseline_margin: float | None
    result: ParityResult


class ParityCounts(_Section):
    exact: int
    accepted: int
    diverged: int
    unknown: int


class Parity(_Section):
    margin_threshold: float
    policy: str
    counts: ParityCounts
    cells: list[ParityCell]


# --- drift ----------------------------------------------------------------------------------


class DriftLine(_Section):
    """The baseline's drift line over one run (or one context of it)."""

    n: int
    slope_pct_per_hour: float | None
    flagged: bool
    span_hours: float | None = None
    slope_ci_low: float | None = None
    slope_ci_high: float | None = None
    drift_pct_across_run: float | None = None
    threshold_pct: float | None = None


class ContextDrift(DriftLine):
    context_tokens: int


class RunDrift(DriftLine):
    run_id: str
    by_context: list[ContextDrift] | None = None


class Bracketing(_Section):
    context_tokens: int
    variant: str
    n: int
    ratio_median: float
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None = None


class Drift(_Section):
    threshold_pct: float
    threshold_source: str
    flagged: bool
    runs: list[RunDrift]
    bracketing: list[Bracketing]


# --- reproductions ----------------------------------------------------------------------------


class ReproductionRun(_Section):
    run_id: str
    host: str | None
    n: int
    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    p_adjusted: float | None
    verdict: Verdict
    ci_level: float | None = None
    # the run's interval level and independent units (its comparison's): the agreement test
    # reads the run's standard error from them (coldbench.evidence.analysis.agreement)
    interval_level: float | None = None
    blocks: int | None = None


class HostDifference(_Section):
    """One host's ratio over the reference host's (the first run): the ratio of their ratios
    with its interval (coldbench.evidence.analysis.agreement)."""

    host: str
    reference: str
    ratio: float
    ci_low: float
    ci_high: float


class HostAgreement(_Section):
    """The test of the hosts' difference at one comparison (coldbench.evidence.analysis.agreement):
    Cochran's Q
        of the hosts' log ratios (df = hosts - 1), its p-value Holm-corrected over the section's
        comparisons, I^2, each host's ratio of ratios to the reference, and the test in one line
    (the row's `statement` says what it means)."""

    differences: list[HostDifference]
    q: float
    df: int
    p_value: float
    p_adjusted: float
    i_squared: float
    within_pct: float
    # the ratios of ratios and the test, as one line: "b / a 0.983 [0.955, 1.011]; Q = ..."
    detail: str


class ReproductionRow(_Section):
    context_tokens: int
    variant: str
    baseline: str
    runs: list[ReproductionRun]
    # False where the hosts' difference is established (coldbench.evidence.analysis.agreement); None
    # where it was not tested (a host without a 95% interval). Bundles before the test: intervals
    # overlap.
    agree: bool | None
    test: HostAgreement | None = None
    statement: str | None = None


class Reproductions(_Section):
    rule: str
    comparisons: list[ReproductionRow]
    all_agree: bool


# --- noise floor ------------------------------------------------------------------------------


class NoiseFloor(_Section):
    process_pairs: int
    rounds_per_process_pair: float
    between_process_sd: float | None
    resolvable: float | None
    rule: str


# --- timeline ---------------------------------------------------------------------------------


class PhaseTimes(_Section):
    """Seconds waited at block starts, per phase (coldbench.evidence.contract.timeline)."""

    stop_s: float
    imports_s: float
    load_s: float
    warmups_s: float


class RunTime(_Section):
    """Where one run's time went (coldbench.evidence.contract.timeline's module docstring)."""

    run_id: str
    measuring_wall_s: float | None
    timed_cells_s: float
    duty_cycle: float | None
    cells: int
    time_to_first_cell_s: float | None
    wall_s: float | None
    process_starts: int | None
    blocks: int | None
    rounds_per_process: int | None
    block_rule: str | None
    prespawn: bool | None
    first_block: PhaseTimes | None
    later_blocks: PhaseTimes | None
    stopped: str | None
    # coldbench.engine.memory's plan (coldbench.evidence.contract.timeline): side-by-side or
    # in-turns, and why
    residency: str | None = None
    residency_reason: str | None = None
    # in turns: the starts within blocks (every turn but a block's first), what the turns
    # added over a run side by side, and their number
    turn_starts: PhaseTimes | None = None
    turns_within_blocks: int | None = None
    # the processes that compiled kernels MLX's CUDA kernel cache lacked, and the most modules
    # one compiled; None where no process reported such a cache
    processes_compiling_kernels: int | None = None
    kernels_compiled_max: int | None = None
    # This run's measured cost, set where it has a timeline and a round: its complete rounds,
    # the seconds of a block's start (every turn's start included; the later blocks' mean,
    # else the first's), and of a round besides (cells and the gaps between them); what prices
    # the rounds advice (coldbench.evidence.contract.timeline `advice_cost_s`).
    rounds: int | None = None
    block_start_s: float | None = None
    round_s: float | None = None


class TimelineSummary(_Section):
    runs: list[RunTime]


# --- history ----------------------------------------------------------------------------------


class CommitRef(_Section):
    variant: str
    commit: str | None
    ref: str | None
    subject: str | None


class HistoryCommit(CommitRef):
    skipped: str | None


class HistoryPoint(_Section):
    variant: str
    commit: str | None
    skipped: str | None
    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: Verdict | None
    n: int
    ci_level: float | None = None


class HistorySeries(_Section):
    context_tokens: int
    points: list[HistoryPoint]


class HistoryStep(_Section):
    context_tokens: int
    from_variant: str
    from_commit: str | None
    to_variant: str
    to_commit: str | None
    subject: str | None
    from_ratio: float
    to_ratio: float
    direction: Literal["slower", "faster"]


class HistoryChangePoint(_Section):
    """Where the change-point library cut a context's series (evidence/analysis/history.py): the
    level of the commits before and after, and whether the paired step rule names a step there."""

    context_tokens: int
    variant: str  # the first commit of the new level
    commit: str | None
    first_variant: str  # the first commit of the level before
    last_variant: str  # the last commit of the new level
    level_before: float
    level_after: float
    kind: Literal["step", "drift"]


class History(_Section):
    range: str | None
    every: int | None
    last: int | None
    reference: CommitRef
    commits: list[HistoryCommit]
    series: list[HistorySeries]
    steps: list[HistoryStep]
    rule: str
    # Set by summaries since change points were added (absent in older summary.json).
    change_points: list[HistoryChangePoint] | None = None
    change_point_rule: str | None = None


# --- bisect -----------------------------------------------------------------------------------


class StepResult(_Section):
    """A commit's paired ratio to `lo` in one bisection step."""

    ratio_median: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: Verdict
    n: int
    ci_level: float | None = None


class BisectStepEntry(_Section):
    """An earlier step as the job spec carried it
    (coldbench.evidence.contract.schemas.BisectStep)."""

    lo: str
    mid: str | None
    hi: str
    decision: str
    evidence_id: str
    location: str | None


class Bisect(_Section):
    good: str
    bad: str
    direction: Literal["slower", "faster"]
    context_tokens: int
    step: int
    lo: str | None
    mid: str | None
    hi: str | None
    mid_result: StepResult | None
    hi_result: StepResult | None
    decision: str
    why: str
    final: bool
    first_bad_commit: str | None
    parent: str | None
    ratio: StepResult | None
    reason: str | None
    steps: list[BisectStepEntry]
    # The first bad commit's subject line; this step's commits from lo to hi, less one.
    subject: str | None = None
    commits_apart: int | None = None


# --- commits ----------------------------------------------------------------------------------


class CommitMarginal(Comparison):
    """One commit of base..head at one context: head / head-without-it (its marginal), or base
    with only it / base (`alone`)."""

    position: int
    commit: str


class PrCommit(_Section):
    """One commit of base..head: the variants made for it and what became of them."""

    position: int
    commit: str
    subject: str | None
    without: str  # the variant: head with this commit reverted
    not_separable: str | None  # why head without it was never measured
    tree: SynthesizedTree | None  # head without it, as the host made it
    parity: ParityCounts  # head without it against base
    alone: str | None = None  # the variant: base with only this commit
    alone_not_separable: str | None = None
    alone_tree: SynthesizedTree | None = None


class CommitsAdditivity(_Section):
    """At one context: the PR's total against the sum of its commits' marginals (percent)."""

    context_tokens: int
    total_pct: float | None
    sum_of_marginals_pct: float | None
    interaction_pct: float | None  # total - sum: what no single commit accounts for
    marginals: int  # commits whose marginal entered the sum
    commits: int
    sum_alone_pct: float | None = None


class Commits(_Section):
    base: CommitRef
    head: CommitRef
    commits: list[PrCommit]
    total: list[Comparison]  # head / base per context (rows of `comparisons`)
    marginals: list[CommitMarginal]
    alone: list[CommitMarginal]
    additivity: list[CommitsAdditivity]
    note: str
    correction: str


# --- the whole summary ------------------------------------------------------------------------


class Summary(_Section):
    """summary.json."""

    format: SummaryFormat
    mode: Mode
    baseline: str
    variants: list[str]
    contexts: list[int]
    features: list[str]
    settings: Settings
    runs: list[RunCount]
    warmups: int
    descriptive: list[Descriptive]
    comparisons: list[Comparison]
    decode_comparisons: list[Comparison]
    ablation: Ablation | None
    parity: Parity
    drift: Drift
    reproductions: Reproductions | None
    invalid: Invalid
    noise_floor: NoiseFloor | None = None
    timeline: TimelineSummary | None = None
    history: History | None = None
    bisect: Bisect | None = None
    commits: Commits | None = None
    canary: Canary | None = None
    mlx_builds: MlxBuilds | None = None
    peak: Peak | None = None
    telemetry: Telemetry | None = None
    first_cells: FirstCells | None = None
    # Why this evidence as a whole cannot be trusted (a warm canary judged cold); unset: none.
    evidence_invalid: list[str] | None = None

    def to_json_value(self) -> dict[str, Any]:
        """summary.json's value: the keys this summary set (module docstring), plain Python."""
        return self.model_dump(mode="python", exclude_unset=True)


def summary_json_bytes(summary: Summary) -> bytes:
    """summary.json's bytes: sorted keys, two-space indent; NaN and infinity refused."""
    return (
        json.dumps(summary.to_json_value(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    ).encode("utf-8")


def first_difference(a: Any, b: Any, path: str = "", rel_tol: float = 1e-9) -> str | None:
    """Dotted path of the first place two values differ (numbers within rel_tol), or None.

    Typed summaries are compared as their `to_json_value()`: a key one of them did not set
    (e.g. `why`) is a difference at that key."""
    if isinstance(a, BaseModel) and isinstance(b, BaseModel):
        return first_difference(
            a.model_dump(mode="python", exclude_unset=True),
            b.model_dump(mode="python", exclude_unset=True),
            path,
            rel_tol,
        )
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip(".")
            found = first_difference(a[key], b[key], f"{path}.{key}", rel_tol)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})".lstrip(".")
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{index}]", rel_tol)
            if found:
                return found
        return None
    numbers = (int, float)
    if (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return None if math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12) else path.lstrip(".")
    return None if a == b else path.lstrip(".")
