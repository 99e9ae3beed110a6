"""Versioned schemas of the data contract (DESIGN.md: record, manifest, provenance, job spec).

Unknown values are `None`, never 0. Every model forbids unknown fields so a malformed record or
spec is refused with a message naming the field, instead of being stored half-understood; the
fingerprint and provenance parts that let a newer agent report more keep at most a few more.
Every value is one the database, JSON and the pages can hold (`evidence/contract/boundary.py`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from coldbench.evidence.contract.boundary import (
    INT32_MAX,
    INT64_MAX,
    MULTILINE,
    Checked,
    Int32,
    Int64,
    Paragraph,
)
from coldbench.evidence.contract.spec_text import (
    FLAG_NAME_PATTERN,
    FlagValue,
    flag_text,
    parse_feature,
)

RECORD_SCHEMA: Final = "coldbench.record/1"
EVIDENCE_FORMAT: Final = "coldbench.evidence/1"
PROVENANCE_SCHEMA: Final = "coldbench.provenance/1"
JOB_SCHEMA: Final = "coldbench.job/1"
MIN_PROCESS_BLOCKS: Final = 12
# The round of a run's warm canary (engine/canary.py): warm on purpose, never in statistics.
CANARY_ROUND: Final = -2

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# Names that end up in file names, URLs and command lines: short, no separators, no dots first.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# A git ref as a submitter may name it: no option-like leading dash, no `..`, no control chars.
# A host label (worker.toml `labels`, an admin's `--set`, the system labels, a job's
# `host_labels`): the one type every side checks them with.
LABEL_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,63}$"
Label = Annotated[str, Field(pattern=LABEL_PATTERN)]
_LABEL = re.compile(LABEL_PATTERN)


def is_label(text: str) -> bool:
    """Whether `text` is a valid host label (`Label`)."""
    return _LABEL.fullmatch(text) is not None


REF_PATTERN = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9_./+@-]{1,200}$")

CellStatus = Literal["ok", "invalid", "error", "warmup"]
Mode = Literal["ab", "ablation", "sweep", "history", "bisect", "commits"]
AdapterName = Literal["embedded", "mlx-lm", "openai-server"]
# The adapters that measure a server they start: their variants' flags are the options the
# host declares (engine/adapter_traits.py is the engine's side of this table).
SERVER_ADAPTERS: Final[frozenset[AdapterName]] = frozenset({"openai-server"})


# The adapter of coldbench's own engine (engine/): the one a job without a repository runs, and
# for a repository that declares it, the checkout's own engine/ (whose flags are that ref's).
ENGINE_ADAPTER: Final[AdapterName] = "embedded"
# The adapter a repository is driven with unless it declares another.
REPOSITORY_ADAPTER: Final[AdapterName] = "mlx-lm"


def default_adapter(repository: str | None) -> AdapterName:
    """The adapter a job or a run without one names: mlx-lm for a repository, else embedded."""
    return REPOSITORY_ADAPTER if repository else ENGINE_ADAPTER


Until = Literal["rounds", "decided"]
# Whether a run's variant processes are resident side by side or in turns (one at a time);
# auto: the memory plan made before any timing decides (engine/memory.py).
Residency = Literal["auto", "side-by-side", "in-turns"]
# The repository name of `coldbench run --adapter openai-server` without `--repo`: the server the
# orchestrating interpreter already has installed, one build for every variant, so no refs. A
# host's agent still refuses a ref-less variant of any repository it builds (worker/run.py).
INSTALLED_SERVER = "installed-server"
# A bisection's good..bad holds at most this many commits (12 steps of halving).
MAX_BISECT_LINE = 4096
# A history measures at most this many commits besides its reference: each is a variant of
# every round.
MAX_HISTORY_COMMITS = 64
# A commits job measures head without each commit of base..head: at most this many commits (each
# is a variant of every round; two with `alone`).
MAX_PR_COMMITS = 32
# How a commits job's tree is made from two commits: one reverted from head, or picked onto base.
CommitChange = Literal["revert", "pick"]
CommitId = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
# The variants an ablation runs (evidence/contract/variant.py expands them; JobSpec checks the
# names).
ABLATION_BASELINE: Final = "none"
ABLATION_ALL: Final = "all"
ABLATION_MINUS_PREFIX: Final = "all-minus-"


@dataclass(frozen=True)
class SpecLimits:
    """A service's bounds on a job's size (api/settings.py). Given as the validation context
    (`JobSpec.model_validate(raw, context={"limits": limits})`), JobSpec checks them with its
    other field rules, so a submission hears of every problem at once."""

    max_contexts: int
    max_context_tokens: int
    max_rounds: int
    max_decode_tokens: int
    max_hosts: int


def _limits(info: ValidationInfo) -> SpecLimits | None:
    limits = (info.context or {}).get("limits")
    return limits if isinstance(limits, SpecLimits) else None


class SpecError(ValueError):
    """A rule across fields, broken: raised in a model validator with the field it is about
    (a dotted path such as `baseline` or `variants.1.ref`), which pydantic cannot locate.

    `problems` holds every rule the spec broke (JobSpec checks them all in one pass); the
    error's own field and message are the first's, its text all of theirs."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.problems: list[SpecError] = [self]

    @classmethod
    def of(cls, problems: list[SpecError]) -> SpecError:
        """One error carrying every problem (one of them: that problem itself)."""
        if len(problems) == 1:
            return problems[0]
        combined = cls(problems[0].field, "; ".join(str(problem) for problem in problems))
        combined.problems = list(problems)
        return combined


def error_field(error: ValidationError) -> str | None:
    """The dotted path of the field the first problem of `error` is about (None: the whole)."""
    return _problem_field(error.errors()[0])


def _problem_field(item: Any) -> str | None:
    if item["loc"]:
        return ".".join(str(part) for part in item["loc"])
    cause = (item.get("ctx") or {}).get("error")
    return cause.field if isinstance(cause, SpecError) else None


def error_line(error: ValidationError, *, whole: str | None = None, every: bool = False) -> str:
    """A pydantic error as one line a user can act on: `field.path: what is wrong` of its first
    problem (`every`: all of them, joined by `; `). A problem about no one field is named
    `whole` when given; pydantic's `Value error, ` prefix is dropped, line breaks folded."""
    parts = []
    for item in error.errors(include_url=False)[: None if every else 1]:
        message = " ".join(str(item["msg"]).removeprefix("Value error, ").split())
        where = _problem_field(item) or whole
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


class _Strict(Checked):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Record(_Strict):
    """One cell: one timed cold prefill of exactly N tokens by one variant, then decode."""

    schema_: Literal["coldbench.record/1"] = Field(RECORD_SCHEMA, alias="schema")
    run_id: str
    variant: Name
    # -1 is the discarded warm-up, -2 the warm canary (CANARY_ROUND)
    round: int = Field(ge=CANARY_ROUND, le=INT32_MAX)
    order: int = Field(ge=-1, le=INT32_MAX)
    context_tokens: int = Field(ge=1, le=INT32_MAX)
    prompt_tokens: int | None = Field(ge=0, le=INT32_MAX)
    prompt_sha256: Sha256Hex | None
    cached_tokens: int | None = Field(ge=0, le=INT32_MAX)
    prefill_s: float | None = Field(ge=0)
    prefill_tps: float | None = Field(ge=0)
    decode_tokens: int | None = Field(ge=0, le=INT32_MAX)
    decode_s: float | None = Field(ge=0)
    decode_tps: float | None = Field(ge=0)
    output_sha256: Sha256Hex | None
    output_head: list[int] | None
    peak_memory_bytes: int | None = Field(ge=0, le=INT64_MAX)
    counters: dict[str, int | float | str | bool | None]
    started_at: datetime
    ended_at: datetime
    status: CellStatus
    reason: Paragraph | None
    # Optional, beyond DESIGN.md's required fields.
    adapter: AdapterName | None = None
    flags: dict[str, FlagValue] | None = None
    # Top-2 logit margin (top1 - top2) of the distribution each output id was chosen from, in
    # order; the parity tolerance policy reads it at the first divergence.
    output_margins: list[float] | None = None
    prompt_corpus_sha256: Sha256Hex | None = None
    # Which process instance of the variant measured the cell (1, 2, ... over the run; a new
    # instance at every process block and after a crash). The statistics cluster pairs by the
    # (variant process, baseline process) they came from. Absent in records written before
    # process rotation: one process per variant served the whole run.
    process: int | None = Field(None, ge=0, le=INT32_MAX)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _ok_means_cold_and_complete(self) -> Record:
        if self.status == "ok":
            missing = [
                name
                for name in ("prompt_tokens", "cached_tokens", "prefill_s", "prefill_tps")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"status ok but {', '.join(missing)} unknown")
            if self.cached_tokens != 0:
                raise ValueError(f"status ok but cached_tokens={self.cached_tokens} (must be 0)")
            if self.prompt_tokens != self.context_tokens:
                raise ValueError(
                    f"status ok but prompt_tokens={self.prompt_tokens} "
                    f"!= context_tokens={self.context_tokens}"
                )
        elif not self.reason:
            raise ValueError(f"status {self.status} needs a reason")
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class FileEntry(_Strict):
    sha256: Sha256Hex
    bytes: int = Field(ge=0, le=INT64_MAX)


class Manifest(_Strict):
    """manifest.json of an evidence bundle: the digest of every other file in it."""

    format: Literal["coldbench.evidence/1"] = EVIDENCE_FORMAT
    files: dict[str, FileEntry] = Field(max_length=10_000)
    provenance: Annotated[dict[str, Any], MULTILINE] = Field(default_factory=dict)

    @field_validator("files")
    @classmethod
    def _relative_safe_names(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            parts = name.split("/")
            if (
                name.startswith("/")
                or "\\" in name
                or any(part in ("", ".", "..") for part in parts)
                or name == "manifest.json"
            ):
                raise ValueError(f"unsafe or reserved file name in manifest: {name!r}")
        return files


class HostInfo(_Strict):
    model_config = ConfigDict(extra="allow")
    hostname: str | None = None
    # The host's name in the service's registry (worker.toml `name`), filled in by the server
    # from its own records: machines cloned from one image often report the same hostname.
    registered_name: str | None = None
    machine_model: str | None = None
    chip: str | None = None
    cpu: str | None = None
    gpu: str | None = None
    cores: Int32 | None = None
    memory_bytes: Int64 | None = None
    os: str | None = None
    kernel: str | None = None
    backend: Literal["metal", "cuda", "cpu"] | None = None
    power_source: str | None = None
    low_power_mode: bool | None = None
    thermal_state: str | None = None


class SoftwareInfo(_Strict):
    model_config = ConfigDict(extra="allow")
    python: str | None = None
    mlx: str | None = None
    mlx_lm: str | None = None
    coldbench: str | None = None
    pip_freeze_sha256: Sha256Hex | None = None


class SynthesizedTree(Checked):
    """A tree a host made for a `commits` job: `onto` with `commit` reverted (`revert`: head
    without it) or picked (`pick`: base with only it), as `git revert`/`git cherry-pick -m 1`
    do. `tree` is the resulting git tree id (None when it could not be made), `conflicts` the
    files whose change did not apply; `failure_tail` the last lines of the build log or of the
    variant process when the tree did not build or load."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    change: CommitChange
    onto: CommitId
    commit: CommitId
    subject: str | None = Field(None, max_length=200)
    tree: str | None = Field(None, pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")
    conflicts: list[str] = Field(default_factory=list, max_length=200)
    failure_tail: Paragraph | None = Field(None, max_length=4000)


class TargetInfo(_Strict):
    """Which code one variant really ran."""

    model_config = ConfigDict(extra="allow")
    variant: Name
    adapter: AdapterName = ENGINE_ADAPTER
    repository: str | None = None
    ref: str | None = None
    commit: str | None = None
    dirty: bool | None = None
    diff_sha256: Sha256Hex | None = None
    recipe: str | None = None
    build_command: list[str] | None = None
    build_log_sha256: Sha256Hex | None = None
    native_modules: dict[str, Sha256Hex] = Field(default_factory=dict)
    engine_module_file: str | None = None  # the install-path check: the file really imported
    subject: str | None = None  # the commit's subject line (history: steps name their commit)
    # Why this variant was never measured (history mode: a commit that did not build).
    skipped: Paragraph | None = None
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    # What the variant's own process imported (engine/adapters `process_software`): versions
    # (`python`, `mlx`, `mlx_lm`, `coldbench`) and `files` (module name -> file).
    software: dict[str, Any] | None = None
    # Mode commits: how this variant's tree was made from the range's commits (`commit` above
    # is then the commit the host wrote for that tree).
    synthesized: SynthesizedTree | None = None


class ModelShape(_Strict):
    """What a prefill's FLOPs follow from (evidence/analysis/peak.py): the dense transformer's sizes
    from config.json. `experts` is set for a mixture of experts (whose FLOPs are not counted)."""

    model_type: str | None = None
    layers: int = Field(ge=1, le=100_000)
    hidden: int = Field(ge=1, le=1_000_000)
    heads: int = Field(ge=1, le=100_000)
    kv_heads: int = Field(ge=1, le=100_000)
    head_dim: int = Field(ge=1, le=100_000)
    intermediate: int = Field(ge=1, le=10_000_000)
    vocab: int = Field(ge=1, le=100_000_000)
    experts: int | None = Field(None, ge=1, le=100_000)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape | None:
        """The shape of a Hugging Face config.json (None: a field is missing)."""
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            experts = config.get("num_local_experts") or config.get("num_experts")
            return cls(
                model_type=config.get("model_type"),
                layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]),
                vocab=int(config["vocab_size"]),
                experts=int(experts) if experts else None,
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None


class DevicePeak(_Strict):
    """The device's peak FLOP rate a run's prefills are held against (evidence/analysis/peaks.py's
    table, or on the CPU a short matmul measured on the host)."""

    device: str = Field(max_length=200)
    tflops: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    dtype: str = Field(max_length=100)
    source: str = Field(max_length=1000)
    measured: bool = False


class ModelInfo(_Strict):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    path: str | None = None
    architecture: str | None = None
    parameters: int | None = None
    quantization: dict[str, Any] | None = None
    config_sha256: Sha256Hex | None = None
    weights_sha256: Sha256Hex | None = None
    tokenizer_sha256: Sha256Hex | None = None
    # The sizes a prefill's FLOPs follow from (None: bundles from before, or not a transformer
    # config this project reads).
    shape: ModelShape | None = None


# Prompt corpora a job may name: `builtin` or a host's `[corpora]` entry, never a path. The same
# pattern as engine/corpus.py's CORPUS_NAME_PATTERN (engine cannot import evidence; a test
# holds the two equal).
CORPUS_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$"
BUILTIN_CORPUS: Final = "builtin"
CorpusName = Annotated[str, Field(pattern=CORPUS_NAME_PATTERN)]


class CorpusInfo(_Strict):
    """The corpus a run's prompts were assembled from (engine/prompts.py)."""

    name: CorpusName = BUILTIN_CORPUS
    sha256: Sha256Hex
    source: Literal["builtin", "host"] = "builtin"
    prompt_version: str | None = None


class HostNoise(_Strict):
    """A host's calibrated noise (`coldbench calibrate`, evidence.analysis.stats.host_noise): what
    the statistics of its runs and the length of their process blocks follow. Standard deviations
    of a paired log ratio: the part a process pair adds (an estimate and its one-sided 95%
    upper bound) and the spread of pairs within one process pair; what a block's loading and a
    cell per token cost on this host."""

    process_pair_sd: float = Field(ge=0, le=1, allow_inf_nan=False)
    process_pair_sd_upper: float = Field(ge=0, le=1, allow_inf_nan=False)
    pair_sd: float = Field(gt=0, le=1, allow_inf_nan=False)
    process_pairs: int = Field(ge=2, le=10_000_000)
    pairs: int = Field(ge=2, le=100_000_000)
    load_s: float | None = Field(None, ge=0, le=1e6, allow_inf_nan=False)
    cell_s_per_token: float | None = Field(None, ge=0, le=1e3, allow_inf_nan=False)
    contexts: list[Annotated[int, Field(ge=1, le=100_000_000)]] = Field(
        default_factory=list, max_length=64
    )
    model: str | None = Field(None, max_length=200)
    calibrated_at: datetime | None = None


class Provenance(_Strict):
    """provenance.json of a run, canonical JSON, hashed into the manifest."""

    schema_: Literal["coldbench.provenance/1"] = Field(PROVENANCE_SCHEMA, alias="schema")
    run_id: str
    created_at: datetime
    host: HostInfo
    software: SoftwareInfo
    targets: list[TargetInfo]
    model: ModelInfo
    job_spec_sha256: Sha256Hex | None = None
    command: str | None = None  # the exact command that reproduces this run
    corpus: CorpusInfo | None = None  # None in bundles from before corpora were recorded
    # The host's calibrated noise the run followed (block length, design effect); None for a
    # host without a calibration (the statistics then take each process pair as a unit).
    noise: HostNoise | None = None
    # The peak FLOP rate of the device that ran the cells (None: unknown, or a bundle from
    # before it was recorded).
    device_peak: DevicePeak | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class VariantSpec(_Strict):
    """A named (target ref, engine flags, recipe) combination. Never a command."""

    name: Name
    ref: str | None = None
    recipe: Name | None = None
    flags: dict[Annotated[str, Field(pattern=FLAG_NAME_PATTERN)], FlagValue] = Field(
        default_factory=dict
    )

    @field_validator("ref")
    @classmethod
    def _safe_ref(cls, ref: str | None) -> str | None:
        if ref is not None and not REF_PATTERN.fullmatch(ref):
            raise ValueError(
                f"ref {ref!r} is not a plain branch, tag or commit name "
                "(letters, digits, _ . / + @ -; not starting with -; no ..)"
            )
        return ref


class HistorySpec(_Strict):
    """Mode `history`: how the commits (the variants after the reference) were chosen, kept
    so the evidence says what was asked. The variants themselves name every commit."""

    range: str = Field(max_length=401)
    every: int | None = Field(None, ge=1, le=INT32_MAX)
    last: int | None = Field(None, ge=1, le=INT32_MAX)
    # The most commits the host may resolve the range to (after every/last): the service sets
    # it from its variant limit, so a host refuses a long range before measuring anything.
    max_commits: int | None = Field(None, ge=1, le=MAX_HISTORY_COMMITS)

    @field_validator("range")
    @classmethod
    def _two_refs(cls, value: str) -> str:
        start, sep, end = value.partition("..")
        if not sep or not REF_PATTERN.fullmatch(start) or not REF_PATTERN.fullmatch(end):
            raise ValueError(f"range {value!r} is not A..B with two plain refs")
        return value


class BisectStep(_Strict):
    """One finished step of a bisection: the commits it compared and what it decided."""

    lo: str = Field(pattern=r"^[0-9a-f]{40}$")
    mid: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    hi: str = Field(pattern=r"^[0-9a-f]{40}$")
    decision: str = Field(max_length=40)
    evidence_id: str = Field(pattern=r"^[0-9a-f]{16,64}$")
    # Where its report is: the service's `/e/<id>`, or a sibling bundle folder's report.html.
    location: str | None = Field(
        None, pattern=r"^(/e/[0-9a-f]{16,64}|\.\./[A-Za-z0-9_-]{1,64}/report\.html)$"
    )


class BisectSpec(_Strict):
    """Mode `bisect`: find the first commit between `good` and `bad` that is `direction`.
    Each step is a run of [lo, mid, hi] (or [lo, hi] when they are neighbours); `steps` are
    the steps before this one, so the last step's evidence links to all of them."""

    good: str = Field(max_length=200)
    bad: str = Field(max_length=200)
    direction: Literal["slower", "faster"]
    steps: list[BisectStep] = Field(default_factory=list, max_length=64)
    # This step's stretch of good..bad: first-parent commits from lo to hi inclusive, oldest
    # first, as a host resolved them in its own mirror. None until then: a bisection submitted
    # to the service names good and bad only, and the host of its first step resolves them.
    line: list[Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]] | None = Field(
        None, min_length=2, max_length=MAX_BISECT_LINE
    )

    @field_validator("good", "bad")
    @classmethod
    def _plain_ref(cls, value: str) -> str:
        if not REF_PATTERN.fullmatch(value):
            raise ValueError(f"ref {value!r} is not a plain branch, tag or commit name")
        return value

    def step_commits(self) -> tuple[str, str | None, str]:
        """(lo, mid, hi) this step compares: the ends of `line` and its middle commit (None when
        lo and hi are neighbours). The one place the midpoint is chosen (evidence/analysis/bisect.py
        halves `line` around it)."""
        assert self.line is not None
        mid = self.line[self.mid_index] if len(self.line) > 2 else None
        return self.line[0], mid, self.line[-1]

    @property
    def mid_index(self) -> int:
        assert self.line is not None
        return (len(self.line) - 1) // 2


class CommitTreePlan(Checked):
    """One variant of a `commits` job: the commit its tree starts from (`onto`) and, for a
    synthesized tree, the commit reverted from it or picked onto it (`position` in base..head,
    1 = the oldest)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    onto: str
    change: CommitChange | None = None
    commit: str | None = None
    position: int | None = None


class CommitsSpec(_Strict):
    """Mode `commits`: which commits of base..head earn their keep.

    The variants are base, head, and for each commit c on head's first-parent line after base,
    head without c (c reverted on top of head); with `alone`, also base with only c (c picked
    onto base). A merge on that line is one change, reverted or picked against its first parent
    (`git revert -m 1`). `line` is base, then each commit oldest first (the last is head), as a
    host resolved them in its own mirror; None until then (a job submitted to the service names
    base and head only). `planned` is the one place the variants are named."""

    base: str = Field(max_length=200)
    head: str = Field(max_length=200)
    alone: bool = False
    # The most commits the host may resolve base..head to: the service sets it from its variant
    # limit, so a host refuses a long range before building anything.
    max_commits: int | None = Field(None, ge=1, le=MAX_PR_COMMITS)
    line: list[CommitId] | None = Field(None, min_length=2, max_length=MAX_PR_COMMITS + 1)

    @field_validator("base", "head")
    @classmethod
    def _plain_ref(cls, value: str) -> str:
        if not REF_PATTERN.fullmatch(value):
            raise ValueError(f"ref {value!r} is not a plain branch, tag or commit name")
        return value

    @model_validator(mode="after")
    def _line_within_bounds(self) -> CommitsSpec:
        if self.line is not None:
            if len(set(self.line)) != len(self.line):
                raise ValueError("commits line: a commit appears twice")
            if self.max_commits is not None and len(self.line) - 1 > self.max_commits:
                raise ValueError(
                    f"base..head holds {len(self.line) - 1} commits; at most {self.max_commits}"
                )
        return self

    def planned(self) -> list[CommitTreePlan]:
        """The variants of a resolved line: `base-<sha10>`, `head-<sha10>`, then
        `minus-cNN-<sha10>` for each commit (head without it) and, with `alone`,
        `only-cNN-<sha10>` (base with only it)."""
        assert self.line is not None
        base, *commits = self.line
        head = commits[-1]
        plans = [
            CommitTreePlan(name=f"base-{base[:10]}", onto=base),
            CommitTreePlan(name=f"head-{head[:10]}", onto=head),
        ]
        for position, commit in enumerate(commits, 1):
            plans.append(
                CommitTreePlan(
                    name=f"minus-c{position:02d}-{commit[:10]}",
                    onto=head,
                    change="revert",
                    commit=commit,
                    position=position,
                )
            )
        if self.alone:
            for position, commit in enumerate(commits, 1):
                plans.append(
                    CommitTreePlan(
                        name=f"only-c{position:02d}-{commit[:10]}",
                        onto=base,
                        change="pick",
                        commit=commit,
                        position=position,
                    )
                )
        return plans


class JobRequest(_Strict):
    """What a maintainer submits: a job whose rounds may be left to the job's default. Bounds
    on sizes are enforced by the API's settings.

    Every rule across fields lives in `_cross_field_rules`, each error naming its field
    (`SpecError`), so the CLI, submit, the API and the form refuse the same specs alike. A
    request becomes the `JobSpec` that runs in one place (evidence/spec/job_options.py,
    `resolve_job`): the service's checked_spec for a service job, `coldbench run`'s setup for
    a local one.
    """

    schema_: Literal["coldbench.job/1"] = Field(JOB_SCHEMA, alias="schema")
    mode: Mode = "ab"
    adapter: AdapterName = ENGINE_ADAPTER
    repository: str | None = Field(None, max_length=300)
    variants: list[VariantSpec] = Field(min_length=1)
    baseline: Name | None = None  # defaults to the first variant
    # Ablation features: `flag` (meaning flag=true) or `flag=value`, the value that turns the
    # optimization on (e.g. `compile`, `clear_cache=false`, `prefill_step_size=4096`).
    features: list[
        Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}(=[A-Za-z0-9_.+-]{1,32})?$")]
    ] = Field(default_factory=list)
    contexts: list[Int32] = Field(min_length=1)
    # Measuring until decided the budget, else exactly the rounds measured. None: the job's
    # default (evidence/spec/job_options.py `default_rounds`), which depends on the valid job,
    # set when the request is resolved to a `JobSpec`.
    rounds: int | None = Field(None, ge=1, le=INT32_MAX)
    decode_tokens: int = Field(8, ge=0, le=INT32_MAX)
    model: str = Field("preset:tiny", pattern=r"^(preset:)?[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")
    seed: Int64 = 0
    # The prompt corpus: the built-in one, or a corpus a host names in its worker.toml (a host
    # without it does not take the job).
    corpus: CorpusName = BUILTIN_CORPUS
    host_labels: list[Label] = Field(default_factory=list)
    hosts: int = Field(1, ge=1, le=INT32_MAX)
    fresh_process: bool = False
    # Rounds measured by one process per variant before every variant's process is replaced
    # (worker/schedule.py's process blocks); None: `default_rounds_per_process(rounds)`.
    rounds_per_process: int | None = Field(None, ge=1, le=10_000)
    # Requested precision of verdicts: "no established change" needs the interval inside
    # [1 - precision, 1 + precision] (evidence/analysis/stats.py).
    precision: float = Field(0.02, gt=0, le=0.5)
    # `rounds`: measure exactly `rounds`; `decided`: take a look after the first look's rounds
    # and at each doubling, stop once every prefill comparison is decided, `rounds` being the
    # budget (evidence/analysis/stats.py `Looks`). Measuring until decided is the default:
    # at fixed rounds a 2% change at a process-pair SD of 1% is found in about two comparisons
    # in three, measuring until decided in every one (docs/EVIDENCE.md, "Operating
    # characteristics").
    until: Until = "decided"
    # The first look's rounds with `until: decided` (None: `units_for_verdict` process blocks).
    first_look: int | None = Field(None, ge=1, le=INT32_MAX)
    # With `until: decided`, a time budget too: the run stops at the first look after it.
    budget_minutes: float | None = Field(None, gt=0, le=10_080, allow_inf_nan=False)
    # The variant processes side by side, in turns, or as the memory plan finds they fit.
    residency: Residency = "auto"
    # Mode history: the first variant is the reference commit, the others the commits measured
    # against it, oldest first (evidence/analysis/history.py).
    history: HistorySpec | None = None
    # Mode bisect: the variants are this step's lo, (mid,) hi commits (evidence/analysis/bisect.py).
    bisect: BisectSpec | None = None
    # Mode commits: base..head, each commit left out of head in turn (evidence/analysis/commits.py).
    commits: CommitsSpec | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @property
    def needs_host_resolution(self) -> bool:
        """Submitted with refs that the host running it resolves in its own mirror (a
        history's range, a bisection's good..bad, a commits job's base..head): one variant
        without a ref, the configuration every commit is measured in. The host runs the
        resolved spec (evidence/spec/resolution.py)."""
        template = len(self.variants) == 1 and self.variants[0].ref is None
        if self.mode == "history":
            return template and self.history is not None
        if self.mode == "bisect":
            return template and self.bisect is not None and self.bisect.line is None
        if self.mode == "commits":
            return template and self.commits is not None and self.commits.line is None
        return False

    @field_validator("contexts")
    @classmethod
    def _positive_unique_contexts(cls, contexts: list[int], info: ValidationInfo) -> list[int]:
        if any(c < 1 for c in contexts):
            raise ValueError("context lengths must be positive token counts")
        if len(set(contexts)) != len(contexts):
            raise ValueError("context lengths must be unique")
        limits = _limits(info)
        if limits is not None:
            too_long = [c for c in contexts if c > limits.max_context_tokens]
            if len(contexts) > limits.max_contexts:
                raise ValueError(f"{len(contexts)} contexts; at most {limits.max_contexts} allowed")
            if too_long:
                raise ValueError(
                    f"contexts {too_long} exceed the limit of {limits.max_context_tokens} tokens"
                )
        return sorted(contexts)

    @field_validator("rounds", "decode_tokens", "hosts")
    @classmethod
    def _within_limits(cls, value: int | None, info: ValidationInfo) -> int | None:
        limits = _limits(info)
        if limits is not None and value is not None:
            bound = {
                "rounds": limits.max_rounds,
                "decode_tokens": limits.max_decode_tokens,
                "hosts": limits.max_hosts,
            }[str(info.field_name)]
            if value > bound:
                raise ValueError(f"{info.field_name}={value}; at most {bound} allowed")
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        """Every rule across fields, each group reporting its first problem, all in one
        error (`SpecError.problems`)."""
        names = [v.name for v in self.variants]
        problems: list[SpecError] = []
        for rule in (
            self._process_rules,
            self._until_rules,
            self._name_rules,
            self._target_rules,
            self._history_rules,
            self._bisect_rules,
            self._commits_rules,
            self._ref_rules,
            self._ablation_rules,
        ):
            try:
                rule(names)
            except SpecError as problem:
                problems.append(problem)
        if problems:
            raise SpecError.of(problems)
        return self

    def _process_rules(self, names: list[str]) -> None:
        if self.fresh_process and self.rounds_per_process is not None:
            raise SpecError(
                "rounds_per_process",
                "fresh_process (a process per cell) and rounds_per_process exclude each other",
            )
        if self.fresh_process and self.residency != "auto":
            raise SpecError(
                "residency",
                "fresh_process (a process per cell) keeps no process resident: leave residency "
                "auto",
            )

    def _until_rules(self, names: list[str]) -> None:
        if self.until != "decided":
            for field in ("first_look", "budget_minutes"):
                if getattr(self, field) is not None:
                    raise SpecError(field, f"{field} needs until=decided (measure until decided)")

    def _name_rules(self, names: list[str]) -> None:
        if self.baseline is None:
            self.baseline = names[0]
        elif self.baseline not in names:
            raise SpecError(
                "baseline", f"baseline {self.baseline!r} is not one of the variants {names}"
            )
        duplicates = sorted(n for n, times in Counter(names).items() if times > 1)
        if duplicates:
            first = {n: i for i, n in reversed(list(enumerate(names)))}
            again = next(i for i, n in enumerate(names) if first[n] != i)
            raise SpecError(
                f"variants.{again}.name",
                f"variant names must be unique; repeated: {', '.join(duplicates)}",
            )

    def _target_rules(self, names: list[str]) -> None:
        if self.adapter != ENGINE_ADAPTER and not self.repository:
            raise SpecError("repository", f"adapter {self.adapter} needs a repository")

    def _ref_rules(self, names: list[str]) -> None:
        for index, variant in enumerate(self.variants):
            if self.repository is None and (variant.ref or variant.recipe):
                raise SpecError(
                    f"variants.{index}.{'ref' if variant.ref else 'recipe'}",
                    "variants name a ref or recipe but the job names no repository",
                )
            if (
                self.repository not in (None, INSTALLED_SERVER)
                and variant.ref is None
                and not self.needs_host_resolution
            ):
                raise SpecError(
                    f"variants.{index}.ref",
                    f"variant {variant.name} names no ref of {self.repository}",
                )

    def _history_rules(self, names: list[str]) -> None:
        if self.mode != "history":
            if self.history is not None:
                raise SpecError("history", f"history settings given for mode {self.mode}")
            return
        if not self.repository:
            raise SpecError(
                "repository", "history mode needs a repository (its commits are the variants)"
            )
        if self.needs_host_resolution:
            if self.features:
                raise SpecError("features", "history mode takes no ablation features")
            return  # the host expands the range into the reference and its commits
        if len(self.variants) < 2:
            raise SpecError(
                "variants",
                "history mode needs the reference commit and at least one other (or a range "
                "and one variant without a ref)",
            )
        unnamed = [v.name for v in self.variants if not v.ref]
        if unnamed:
            index = next(i for i, v in enumerate(self.variants) if not v.ref)
            raise SpecError(
                f"variants.{index}.ref",
                f"history mode: every variant is a commit; no ref: {unnamed}",
            )
        if self.baseline != names[0]:
            raise SpecError(
                "baseline", "history mode: the baseline is the first variant (the reference)"
            )
        if self.features:
            raise SpecError("features", "history mode takes no ablation features")

    def _bisect_rules(self, names: list[str]) -> None:
        if self.mode != "bisect":
            if self.bisect is not None:
                raise SpecError("bisect", f"bisect settings given for mode {self.mode}")
            return
        if self.bisect is None:
            raise SpecError("bisect", "bisect mode needs bisect settings (good, bad, direction)")
        if not self.repository:
            raise SpecError("repository", "bisect mode needs a repository")
        if len(self.contexts) != 1:
            raise SpecError("contexts", "bisect mode takes exactly one context")
        if self.features:
            raise SpecError("features", "bisect mode takes no ablation features")
        if self.bisect.line is None:
            if not self.needs_host_resolution:
                raise SpecError(
                    "variants",
                    "bisect mode: give one variant without a ref (the configuration); the "
                    "commits come from good..bad",
                )
            return
        lo, mid, hi = self.bisect.step_commits()
        wanted = [lo, *([mid] if mid else []), hi]
        if [v.ref for v in self.variants] != wanted:
            raise SpecError(
                "variants",
                f"bisect mode: a step over {len(self.bisect.line)} commits compares "
                f"{', '.join(c[:10] for c in wanted)} (lo, mid, hi of its line)",
            )
        if self.baseline != names[0]:
            raise SpecError("baseline", "bisect mode: the baseline is the first variant (lo)")

    def _commits_rules(self, names: list[str]) -> None:
        if self.mode != "commits":
            if self.commits is not None:
                raise SpecError("commits", f"commits settings given for mode {self.mode}")
            return
        if self.commits is None:
            raise SpecError("commits", "commits mode needs base and head")
        if not self.repository:
            raise SpecError("repository", "commits mode needs a repository (base..head of it)")
        if self.features:
            raise SpecError("features", "commits mode takes no ablation features")
        if self.commits.line is None:
            if not self.needs_host_resolution:
                raise SpecError(
                    "variants",
                    "commits mode: give one variant without a ref (the configuration); the "
                    "commits come from base..head",
                )
            return
        wanted = [(plan.name, plan.onto) for plan in self.commits.planned()]
        if [(v.name, v.ref) for v in self.variants] != wanted:
            raise SpecError(
                "variants",
                f"commits mode: a line of {len(self.commits.line) - 1} commits runs "
                + ", ".join(name for name, _ in wanted),
            )
        if self.baseline != names[0]:
            raise SpecError("baseline", "commits mode: the baseline is the first variant (base)")

    def _ablation_rules(self, names: list[str]) -> None:
        """What evidence/contract/variant.py's expansion needs: distinct features, each changing the
        first variant (the template), and names that fit and do not clash."""
        if self.mode != "ablation":
            return
        if not self.features:
            raise SpecError("features", "ablation mode needs at least one feature")
        features = [parse_feature(feature) for feature in self.features]
        flags = [flag for flag, _ in features]
        repeated = sorted(flag for flag, times in Counter(flags).items() if times > 1)
        if repeated:
            raise SpecError(
                "features", f"ablation features name the same flag twice: {', '.join(repeated)}"
            )
        template = self.variants[0].flags
        unchanged = [
            (flag, on) for flag, on in features if flag in template and template[flag] == on
        ]
        if unchanged:
            raise SpecError(
                "features",
                "ablation features already on in the first variant (nothing to leave out): "
                + ", ".join(flag_text(flag, on) for flag, on in unchanged),
            )
        expanded = [ABLATION_BASELINE, ABLATION_ALL, *(ABLATION_MINUS_PREFIX + f for f in flags)]
        for name in expanded:
            if not is_valid_name(name):
                raise SpecError(
                    "features", f"variant name {name!r} is too long or not a plain name"
                )
        for index, kept in enumerate(self.variants[1:], start=1):
            if kept.name in expanded:
                raise SpecError(
                    f"variants.{index}.name",
                    f"variant {kept.name!r} clashes with a name the ablation expansion uses; "
                    "rename it",
                )


class JobSpec(JobRequest):
    """A job as it runs: a request with its rounds resolved (`resolve_job`). What the service
    stores and leases, what a bundle's job.json holds and every reader of `rounds` takes.

    `until` absent reads as `rounds`: every writer writes it, and a job.json from before
    `until` existed measured exactly its rounds."""

    rounds: int = Field(ge=1, le=INT32_MAX)
    until: Until = "rounds"


def default_rounds_per_process(rounds: int) -> int:
    """Rounds per process block when a job does not say: at least 12 blocks (independent process
    pairs), a fresh process every round below 24 rounds. Restarts are untimed but cost a model
    load each; fewer, longer blocks lose power: simulated at 24 rounds with process offsets of
    1% and paired noise of 0.75%, a 2% effect was found in 79% of jobs with 8 blocks of 3
    rounds and 95% with 12 blocks of 2 (docs/EVIDENCE.md, "Process offsets")."""
    return max(1, rounds // MIN_PROCESS_BLOCKS)


def effective_rounds_per_process(spec: JobSpec) -> int | None:
    """What the runner uses: None with `fresh_process` (every cell its own process). Measuring
    until decided, a process block per round unless the job says: each look is a whole
    number of blocks, and the first look has as many process pairs as rounds."""
    if spec.fresh_process:
        return None
    if spec.rounds_per_process is not None:
        return spec.rounds_per_process
    if spec.until == "decided":
        return 1
    return default_rounds_per_process(spec.rounds)


def is_valid_name(value: str) -> bool:
    return re.fullmatch(NAME_PATTERN, value) is not None
