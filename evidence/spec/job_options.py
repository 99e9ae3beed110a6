"""The options of a job spec, declared once, the one builder from them to a `JobRequest`, and
the one resolver from a request to the `JobSpec` that runs.

`coldbench run`, `coldbench submit`, `coldbench calibrate` and the web form take the same
options (`JOB_OPTIONS`: name, command-line flag, help, the modes it belongs to, its default) and
hand what a person gave, as typed text or as values, to `build_job_spec`. The builder parses
every option (evidence/contract/spec_text.py), refuses options given for another mode, fills the
defaults of the chosen mode, and validates the result with `JobRequest`, whose validator owns every
rule across fields. It reports every problem it finds in one pass (`JobOptionsError`), each with the
option it belongs to and, where there is one, the JobSpec field path, so each front end can say
it in its own terms (`--contexts` on the command line, the contexts input on the form).

A default that depends on the valid job is set once, where a request becomes the job that runs
(`resolve_job`: the service's checked_spec for a service job, `coldbench run`'s setup for a
local one): rounds left out (`default_rounds`) are, measuring until decided (the default),
`BUDGET_FIRST_LOOKS` first looks, each enough for the job's comparisons to reach a verdict even
when two process pairs at each end disagree with the rest (evidence/analysis/stats.py's rule,
`units_for_verdict`); with `--until rounds`, one first look. Every front end sends a request with
its rounds left out as it is, so each job gets the same default.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeVar, get_args

from pydantic import ValidationError

from coldbench.evidence.contract.schemas import (
    REF_PATTERN,
    JobRequest,
    JobSpec,
    Mode,
    Residency,
    SpecError,
    SpecLimits,
    Until,
    default_adapter,
)
from coldbench.evidence.contract.spec_text import (
    TARGET_KEYS,
    flag_text,
    parse_context,
    parse_flags,
    parse_variant,
    split_list,
)
from coldbench.evidence.spec.engine_flags import flag_problems

MODES: Final[tuple[str, ...]] = get_args(Mode)
MODE_HELP: Final = {
    "ab": "candidates against the baseline (the first variant)",
    "ablation": "leave one feature out of the first variant with every feature on",
    "sweep": "the same code over several flag settings",
    "history": "each commit against a reference commit (--range A..B or a list of commits)",
    "bisect": "the first commit between good and bad that is slower (or faster)",
    "commits": "which commits of base..head earn their keep: head without each one",
}
# Modes whose commits the host resolves from refs: one variant, the configuration, no ref.
_ONE_CONFIGURATION_MODES: Final = ("history", "bisect", "commits")
DEFAULT_VARIANT: Final = "base"
HISTORY_MODES: Final = ("history",)
BISECT_MODES: Final = ("bisect",)
COMMITS_MODES: Final = ("commits",)


@dataclass(frozen=True)
class JobOption:
    """One option of a job spec, as every front end offers it."""

    name: str  # the builder's key and the form's input name
    flag: str  # the command line's option
    help: str
    metavar: str = "TEXT"
    modes: tuple[str, ...] = MODES
    # What the help says the default is (None: no default worth saying).
    default_text: str | None = None
    # Offered where a service runs the job (`coldbench submit`, the form, a pull request) and
    # where this machine runs it (`coldbench run`).
    service: bool = True
    local: bool = True

    @property
    def switch(self) -> bool:
        """An on/off flag: given by its presence, no value."""
        return self.name in ("fresh_process", "alone")

    @property
    def repeated(self) -> bool:
        """Given once per item (`--variant a --variant b`)."""
        return self.name == "variants"

    @property
    def choices(self) -> tuple[str, ...]:
        """The values it takes where they are few (a metavar `a|b|c`); () where any text."""
        parts = tuple(self.metavar.split("|"))
        return parts if len(parts) > 1 else ()

    def belongs_to(self, mode: str) -> bool:
        return mode in self.modes

    def help_text(self, default_text: str | None = None, *, say_modes: bool = True) -> str:
        """The help with its default; `say_modes`: name the modes it belongs to (a front end
        that shows the option in its modes only, the form, need not)."""
        default = default_text if default_text is not None else self.default_text
        only = (
            ""
            if self.modes == MODES or not say_modes
            else f" (mode {' or '.join(self.modes)} only)"
        )
        return f"{self.help}{only}" + (f" Default: {default}." if default else "")


def _options(*options: JobOption) -> dict[str, JobOption]:
    return {option.name: option for option in options}


JOB_OPTIONS: Final = _options(
    JobOption(
        "mode",
        "--mode",
        "What the job compares: "
        + "; ".join(f"{mode}: {text}" for mode, text in MODE_HELP.items())
        + ".",
        metavar="|".join(MODES),
        default_text="ab",
    ),
    JobOption(
        "variants",
        "--variant",
        "NAME[:key=value,...]; repeat. The first is the baseline. Keys ref and recipe pick a "
        "commit and a build recipe of the repository; the rest are engine flags. History over "
        "a range, bisect and commits take one variant without ref= (the configuration).",
        metavar="NAME[:k=v,...]",
        default_text=DEFAULT_VARIANT,
    ),
    JobOption(
        "repository",
        "--repo",
        "The repository of the engine under test (none: this coldbench's embedded engine).",
    ),
    JobOption(
        "adapter",
        "--adapter",
        "How the target is driven: embedded, mlx-lm or openai-server.",
        metavar="embedded|mlx-lm|openai-server",
        default_text="mlx-lm with a repository, else embedded",
    ),
    JobOption(
        "recipe",
        "--recipe",
        "The host's build recipe for the variants that name none (e.g. editable).",
    ),
    JobOption(
        "features",
        "--features",
        "Ablation features: flag or flag=value (the value that turns it on), comma-separated.",
        metavar="FLAG[=VALUE],...",
        modes=("ablation",),
    ),
    JobOption(
        "contexts",
        "--contexts",
        "Prompt lengths in tokens: 128,256 or 4K,16K (K = 1024, M = 1024K).",
        metavar="N,N,...",
        default_text="128,256 (bisect: 256)",
    ),
    JobOption(
        "rounds",
        "--rounds",
        "Rounds (pairing units): measuring until decided the budget, with --until rounds "
        "exactly these.",
        metavar="N",
        default_text="4 first looks of 10 process blocks (40 rounds), each look enough for a "
        "verdict even when two process pairs at each end disagree with the rest; with --until "
        "rounds one first look (10)",
    ),
    JobOption(
        "until",
        "--until",
        "decided: look after the first 10 process blocks and at each doubling, and stop once "
        "every prefill comparison is faster, slower or no established change (--rounds is the "
        "budget; false claims stay at 5% per job); rounds: measure exactly --rounds.",
        metavar="decided|rounds",
        default_text="decided",
    ),
    JobOption(
        "budget_minutes",
        "--budget-minutes",
        "With --until decided: also stop at the first look after this many minutes of measuring.",
        "MINUTES",
        default_text="none on this machine (coldbench run); a service's jobs get the service's "
        "default_budget_minutes (60 unless it sets another)",
    ),
    JobOption(
        "decode_tokens", "--decode-tokens", "Greedy tokens after prefill.", "N", default_text="8"
    ),
    JobOption(
        "model",
        "--model",
        "preset:NAME (synthetic, identical on every host) or a model name of the hosts.",
        default_text="preset:tiny",
    ),
    JobOption("seed", "--seed", "Seed of prompts, order and bootstrap.", "N", default_text="0"),
    JobOption(
        "corpus",
        "--corpus",
        "Prompt corpus: builtin, or a name from the hosts' worker.toml.",
        default_text="builtin",
    ),
    JobOption(
        "labels",
        "--labels",
        "Host labels the job needs, comma-separated.",
        metavar="LABEL,...",
        local=False,
    ),
    JobOption(
        "hosts",
        "--hosts",
        "Reproductions on this many distinct hosts.",
        "N",
        default_text="1",
        local=False,
    ),
    JobOption(
        "fresh_process",
        "--fresh-process",
        "A new process for every cell (slow; no process offsets at all).",
    ),
    JobOption(
        "rounds_per_process",
        "--rounds-per-process",
        "Rounds each variant's process measures before every variant gets a fresh one.",
        "N",
        default_text="rounds // 12, at least 1 (12 or more independent process pairs)",
    ),
    JobOption(
        "precision",
        "--precision",
        "Verdict precision: 'no established change' needs the interval inside 1 +- this.",
        "FRACTION",
        default_text="0.02",
    ),
    JobOption(
        "residency",
        "--residency",
        "auto: the variants' processes are resident side by side where every context fits them "
        "together (the memory guard's estimates), else in turns, one resident at a time; "
        "side-by-side or in-turns to choose.",
        "|".join(get_args(Residency)),
        default_text="auto",
    ),
    JobOption(
        "range",
        "--range",
        "A..B: each commit on B's first-parent line after A, against A (resolved by the host).",
        "A..B",
        modes=HISTORY_MODES,
    ),
    JobOption(
        "every",
        "--every",
        "Every Nth commit of the range (counted back from B).",
        "N",
        modes=HISTORY_MODES,
    ),
    JobOption("last", "--last", "The newest N commits of the range.", "N", modes=HISTORY_MODES),
    JobOption(
        "commits",
        "--commits",
        "An explicit list of commits REF,REF,...; the first is the reference.",
        "REF,REF,...",
        modes=HISTORY_MODES,
        # `coldbench run` pins them in its mirror first; a service job names them as variants
        # (NAME:ref=COMMIT), which its host checks out as they are.
        service=False,
    ),
    JobOption("good", "--good", "A ref that is not yet changed.", "REF", modes=BISECT_MODES),
    JobOption("bad", "--bad", "A ref that is changed.", "REF", modes=BISECT_MODES),
    JobOption(
        "direction",
        "--direction",
        "The change to find: slower or faster.",
        "slower|faster",
        modes=BISECT_MODES,
    ),
    JobOption(
        "base",
        "--base",
        "The PR's base: the commit its commits follow on head's first-parent line (its merge "
        "base).",
        "REF",
        modes=COMMITS_MODES,
    ),
    JobOption(
        "head",
        "--head",
        "The PR's head: each commit of base..head is left out of it in turn.",
        "REF",
        modes=COMMITS_MODES,
    ),
    JobOption(
        "alone",
        "--alone",
        "Also each commit alone on base (two variants per commit).",
        modes=COMMITS_MODES,
    ),
)

# JobSpec's top-level fields -> the option that sets them (where the names differ).
_OPTION_OF_FIELD: Final = {"host_labels": "labels", "baseline": "variants"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the options: the option it belongs to, the JobSpec field path it
    is about (None when it is not one field's), and a one-line message."""

    option: str
    message: str
    field: str | None = None


class JobOptionsError(ValueError):
    """Every problem found in one pass over a job's options."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{p.option}: {p.message}" for p in self.problems))


@dataclass
class _Build:
    mode: str
    problems: list[Problem] = field(default_factory=list)
    # Options whose JobSpec problems would only repeat one already reported.
    explained: set[str] = field(default_factory=set)

    def add(self, option: str, message: str, field_path: str | None = None) -> None:
        self.problems.append(Problem(option, message, field_path))


def _given(value: Any) -> bool:
    """A value a person gave: not None, not blank text, not an empty list, not False."""
    if value is None or value is False:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, Sequence | Mapping):
        return bool(value)
    return True


def _int(build: _Build, name: str, value: Any, *, at_least: int | None = None) -> int | None:
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,18}\s*", value):
        number = int(value)
    else:
        build.add(name, f"{value!r} is not a whole number")
        return None
    if at_least is not None and number < at_least:
        build.add(name, f"{number}: give at least {at_least}")
        return None
    return number


def _float(build: _Build, name: str, value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        build.add(name, f"{value!r} is not a number such as 0.05")
        return None
    if not math.isfinite(number):
        build.add(name, f"{value!r} is not a finite number")
        return None
    return number


def _bool(build: _Build, name: str, value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    build.add(name, f"{value!r}: give true or false")
    return None


def _choice(build: _Build, name: str, value: Any, choices: Sequence[str]) -> str:
    text = str(value).strip()
    if text not in choices:
        build.add(name, f"{text!r}: give {', '.join(choices[:-1])} or {choices[-1]}", name)
    return text


def _texts(value: Any) -> list[str]:
    """A list option as text (`a, b c`) or as a list of items."""
    if isinstance(value, str):
        return split_list(value)
    return [part for item in value for part in split_list(str(item))]


def _contexts(build: _Build, value: Any) -> list[int] | None:
    contexts: list[int] = []
    for item in [str(value)] if isinstance(value, int) else _texts(value):
        try:
            contexts.append(parse_context(item))
        except ValueError as error:
            build.add("contexts", str(error), "contexts")
    if not contexts and not any(p.option == "contexts" for p in build.problems):
        build.add("contexts", "give at least one context length, e.g. 128,256 or 4K", "contexts")
    return contexts if contexts else None


def _variant(build: _Build, index: int, value: Any, recipe: str | None) -> dict[str, Any] | None:
    """A variant as `NAME[:key=value,...]` text (None when it does not parse) or as a row
    {name, ref, recipe, flags} whose flags are text (`a=1, b=false`) or a mapping (a row whose
    flags do not parse keeps its name and ref)."""
    if isinstance(value, str):
        try:
            fields = parse_variant(value.strip())
        except ValueError as error:
            build.add("variants", f"{_variant_label(value)}: {error}", _path(index, None))
            return None
    else:
        fields = {"name": str(value.get("name") or "").strip(), "flags": {}}
        for key in TARGET_KEYS:
            if _given(value.get(key)):
                fields[key] = str(value[key]).strip()
        flags = value.get("flags") or {}
        try:
            fields["flags"] = parse_flags(flags) if isinstance(flags, str) else dict(flags)
        except ValueError as error:
            build.add("variants", f"{_variant_label(value)}: {error}", _path(index, "flags"))
    if recipe is not None and not fields.get("recipe"):
        fields["recipe"] = recipe
    return fields


def _variant_label(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return f"variant {value.get('name') or '(unnamed)'!r}"


def _path(index: int, part: str | None) -> str:
    return f"variants.{index}" + (f".{part}" if part else "")


def _mode(build: _Build, value: Any) -> str:
    if not _given(value):
        return "ab"
    mode = str(value).strip()
    if mode not in MODES:
        build.add("mode", f"{mode!r}: choose one of {', '.join(MODES)}", "mode")
        return "ab"
    return mode


def build_job_spec(given: Mapping[str, Any], *, limits: SpecLimits | None = None) -> JobRequest:
    """The JobRequest of the options a person gave (`JOB_OPTIONS` names; None or blank: not
    given; rounds left out stay None, for `resolve_job`), or JobOptionsError with every problem
    found.

    Values may be typed text (as the form and the command line get them) or values (an int
    for rounds, a list of contexts). `limits`: a service's bounds on sizes, where the front
    end knows them (the form), checked in the same pass.
    """
    unknown = sorted(set(given) - set(JOB_OPTIONS))
    if unknown:
        raise TypeError(f"not job options: {', '.join(unknown)}")
    build = _Build(mode="ab")
    build.mode = mode = _mode(build, given.get("mode"))
    if not any(p.option == "mode" for p in build.problems):
        for name, value in given.items():
            if _given(value) and not JOB_OPTIONS[name].belongs_to(mode):
                modes = " or ".join(JOB_OPTIONS[name].modes)
                build.add(name, f"belongs to mode {modes}, not {mode}")
    raw = _raw_spec(build, given)
    for problem in flag_problems(raw):
        build.add(option_of_field(problem.field), str(problem), problem.field)
    request = _validate(build, raw, limits)
    if build.problems:
        raise JobOptionsError(build.problems)
    assert request is not None
    return request


def service_payload(request: JobRequest, **dump: Any) -> dict[str, Any]:
    """The JSON a front end sends a service for `request` (`dump`: model_dump's options): rounds
    left out stay out, for the service to resolve (api/jobs/service.py, checked_spec), so a job
    gets the same default through the form, `coldbench submit`, a pull request and the JSON
    API."""
    payload = request.model_dump(mode="json", by_alias=True, **dump)
    if payload.get("rounds") is None:
        payload.pop("rounds", None)
    return payload


class DefaultRoundsError(ValueError):
    """The job's default rounds exceed the service's limit: the submitter must choose."""


def resolve_job(
    request: JobRequest,
    *,
    limits: SpecLimits | None = None,
    budget_minutes: float | None = None,
) -> JobSpec:
    """The job that runs: `request` with its rounds, or where it leaves them out the default
    for it (`default_rounds`, DefaultRoundsError where that exceeds `limits.max_rounds`); and,
    measuring until decided without a time budget, `budget_minutes` (a service's default). The
    one place a default that depends on the job is set."""
    rounds = request.rounds
    if rounds is None:
        rounds = default_rounds(request)
        if limits is not None and rounds > limits.max_rounds:
            raise DefaultRoundsError(
                f"this job's default is {rounds} rounds, more than this service's limit of "
                f"{limits.max_rounds}: give rounds (at most {limits.max_rounds}), or fewer "
                "rounds per process"
            )
    raw = {**request.model_dump(by_alias=True), "rounds": rounds}
    if request.until == "decided" and request.budget_minutes is None:
        raw["budget_minutes"] = budget_minutes
    return JobSpec.model_validate(raw, context={"limits": limits})


def _raw_spec(build: _Build, given: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSpec payload of the options (their text parsed); problems go to `build`."""
    mode = build.mode
    raw: dict[str, Any] = {"mode": mode}
    repository = str(given["repository"]).strip() if _given(given.get("repository")) else None
    raw["repository"] = repository
    adapter = given.get("adapter")
    raw["adapter"] = str(adapter).strip() if _given(adapter) else default_adapter(repository)
    recipe = str(given["recipe"]).strip() if _given(given.get("recipe")) else None
    texts = given.get("variants")
    listed: list[Any] = [texts] if isinstance(texts, str) else list(texts or [])
    if mode == "history" and _given(given.get("commits")):
        listed = _commit_variants(build, given, listed)
    variants = [_variant(build, i, text, recipe) for i, text in enumerate(listed)]
    if not variants:
        variants = [_variant(build, 0, DEFAULT_VARIANT, recipe)]
    # A variant that did not parse keeps its place (its problem is said), so the others keep
    # the index their own problems are located by.
    raw["variants"] = [
        {"name": f"unparsed-{i}"} if v is None else v for i, v in enumerate(variants)
    ]
    if mode == "ablation":
        raw["features"] = _texts(given.get("features") or "")
    contexts = given.get("contexts")
    if not _given(contexts):
        contexts = "256" if mode == "bisect" else "128,256"
    raw["contexts"] = _contexts(build, contexts) or [1]
    for name in ("rounds", "decode_tokens", "seed", "hosts", "rounds_per_process"):
        if _given(given.get(name)):
            number = _int(build, name, given[name])
            if number is not None:
                raw[name] = number
    for name in ("precision", "budget_minutes"):
        if _given(given.get(name)):
            number_value = _float(build, name, given[name])
            if number_value is not None:
                raw[name] = number_value
    for name, choices in (("until", get_args(Until)), ("residency", get_args(Residency))):
        if _given(given.get(name)):
            raw[name] = _choice(build, name, given[name], choices)
    if _given(given.get("fresh_process")):
        raw["fresh_process"] = _bool(build, "fresh_process", given["fresh_process"]) or False
    for name in ("model", "corpus"):
        if _given(given.get(name)):
            raw[name] = str(given[name]).strip()
    if _given(given.get("labels")):
        raw["host_labels"] = _texts(given["labels"])
    if mode == "history":
        _history(build, given, raw)
    if mode == "bisect":
        _bisect(build, given, raw)
    if mode == "commits":
        _commits(build, given, raw)
    return raw


def _commit_variants(build: _Build, given: Mapping[str, Any], listed: list[Any]) -> list[Any]:
    """History over an explicit list of commits: the reference first, then each commit, all in
    the one configuration `--variant NAME:flag=value` gives."""
    refs = _texts(given["commits"])
    if len(refs) < 2:
        build.add("commits", "give the reference and at least one other commit")
    bad = [ref for ref in refs if not REF_PATTERN.fullmatch(ref)]
    if bad:
        build.add("commits", f"{bad[0]!r} is not a plain branch, tag or commit name")
        return listed
    configuration = _configuration(build, "commits", listed)
    extra = "".join(f",{flag_text(key, value)}" for key, value in configuration.items())

    def name(prefix: str, ref: str) -> str:
        tail = re.sub(r"[^A-Za-z0-9_.+-]+", "-", ref)[:40].strip("-.") or "ref"
        return f"{prefix}-{tail}"

    return [f"{name('ref', refs[0])}:ref={refs[0]}{extra}"] + [
        f"{name(f'c{position:02d}', ref)}:ref={ref}{extra}"
        for position, ref in enumerate(refs[1:], 1)
    ]


def _configuration(build: _Build, source: str, listed: list[Any]) -> dict[str, Any]:
    """The flags of the one variant a history or bisection is measured in (no ref)."""
    if len(listed) > 1:
        build.add(
            "variants",
            f"the commits come from {source}: give at most one variant (the configuration)",
            "variants",
        )
    if not listed:
        return {}
    first = listed[0]
    try:
        fields = parse_variant(first) if isinstance(first, str) else dict(first)
    except ValueError:
        return {}  # reported with the variant itself
    if any(_given(fields.get(key)) for key in TARGET_KEYS):
        build.add(
            "variants",
            f"the commits come from {source}: the variant takes flags only, no ref or recipe",
            "variants.0.ref",
        )
    flags = fields.get("flags") or {}
    return dict(flags) if isinstance(flags, Mapping) else {}


def _history(build: _Build, given: Mapping[str, Any], raw: dict[str, Any]) -> None:
    has_range, has_commits = _given(given.get("range")), _given(given.get("commits"))
    if has_range and has_commits:
        build.add("range", "give --range A..B or a list of commits, not both", "history.range")
    thinned = [name for name in ("every", "last") if _given(given.get(name))]
    if thinned and not has_range:
        build.add(thinned[0], "every and last thin a range A..B", f"history.{thinned[0]}")
    if not has_range:
        variants = raw["variants"]
        if not has_commits and len(variants) == 1 and not variants[0].get("ref"):
            build.add(
                "range",
                "history needs a range A..B, a list of commits, or variants with ref=COMMIT",
                "history.range",
            )
            build.explained.add("variants")
        return
    _configuration(build, "the range", list(given.get("variants") or []))
    history: dict[str, Any] = {"range": str(given["range"]).strip()}
    for name in ("every", "last"):
        if _given(given.get(name)):
            number = _int(build, name, given[name], at_least=1)
            if number is not None:
                history[name] = number
    raw["history"] = history


def _bisect(build: _Build, given: Mapping[str, Any], raw: dict[str, Any]) -> None:
    _configuration(build, "good..bad", list(given.get("variants") or []))
    bisect: dict[str, Any] = {}
    for name, what in (
        ("good", "a ref that is not yet changed"),
        ("bad", "a ref that is changed"),
        ("direction", "slower or faster"),
    ):
        if _given(given.get(name)):
            bisect[name] = str(given[name]).strip()
        else:
            build.add(name, f"bisect needs {name}: {what}", f"bisect.{name}")
            # A stand-in, so what JobSpec says of the rest is not about its absence.
            bisect[name] = "slower" if name == "direction" else "HEAD"
    raw["bisect"] = bisect


def _commits(build: _Build, given: Mapping[str, Any], raw: dict[str, Any]) -> None:
    _configuration(build, "base..head", list(given.get("variants") or []))
    commits: dict[str, Any] = {}
    for name, what in (("base", "the PR's base (its merge base)"), ("head", "the PR's head")):
        if _given(given.get(name)):
            commits[name] = str(given[name]).strip()
        else:
            build.add(name, f"commits needs {name}: {what}", f"commits.{name}")
            commits[name] = "HEAD"  # a stand-in, as in _bisect
    if _given(given.get("alone")):
        commits["alone"] = _bool(build, "alone", given["alone"]) or False
    raw["commits"] = commits


def _validate(build: _Build, raw: dict[str, Any], limits: SpecLimits | None) -> JobRequest | None:
    """JobRequest's own validation; each of its problems in the builder's terms."""
    try:
        return JobRequest.model_validate(raw, context={"limits": limits})
    except ValidationError as error:
        # What was refused already stands in the payload as a placeholder (or not at all):
        # what JobSpec says of that field, or of an option refused as a whole, would be about
        # the placeholder.
        fields = [p.field for p in build.problems if p.field]
        whole = {p.option for p in build.problems if not p.field} | build.explained
        for item in error.errors():
            for problem in _problems_of(item, raw):
                path = problem.field or ""
                if problem.option in whole or any(
                    path == field or path.startswith(field + ".") for field in fields
                ):
                    continue
                build.problems.append(problem)
        return None


def option_of_field(path: str | None) -> str:
    """The option a JobSpec field path (`variants.1.flags`, `history.range`) comes from."""
    if not path:
        return "job"
    head, _, rest = path.partition(".")
    if head in ("history", "bisect", "commits"):
        part = rest.split(".")[0]
        # `commits.*` is mode commits' (base, head, alone), never history's `--commits` list.
        return (
            part
            if part in JOB_OPTIONS
            else {"history": "range", "bisect": "good"}.get(head, "base")
        )
    if head == "variants":
        return "recipe" if rest.endswith(".recipe") else "variants"
    return _OPTION_OF_FIELD.get(head, head if head in JOB_OPTIONS else "job")


def validation_problems(error: ValidationError) -> list[Problem]:
    """Every problem of JobSpec's validation error, each with its option and field, said as a
    person reads it (the service's refusals use it too)."""
    return [problem for item in error.errors() for problem in _problems_of(item, {})]


def _problems_of(item: Any, raw: Mapping[str, Any]) -> list[Problem]:
    location = tuple(item["loc"])
    cause = (item.get("ctx") or {}).get("error")
    if not location and isinstance(cause, SpecError):
        return [
            Problem(option_of_field(problem.field), str(problem), problem.field)
            for problem in cause.problems
        ]
    path = ".".join(str(part) for part in location) or None
    return [Problem(option_of_field(path), human_message(item, raw), path)]


_PATTERN_HINTS: Final = {
    "model": "not a model name: preset:NAME or a model name of the hosts",
    "corpus": "not a corpus name (letters, digits, _ . -)",
    "host_labels": "not a host label (letters, digits, _ . : = -)",
    "features": "not a feature: write flag or flag=value, e.g. compile or clear_cache=false",
    "name": "not a name: letters, digits, _ . + - (up to 64, not starting with . - + _)",
    "recipe": "not a recipe name: letters, digits, _ . + -",
    "flags": "not a flag name (lowercase letters, digits, _)",
}


def human_message(item: Mapping[str, Any], raw: Mapping[str, Any] | None = None) -> str:
    """One pydantic error as a person reads it: the value, and what would be accepted."""
    kind = item["type"]
    context = item.get("ctx") or {}
    value = item.get("input")
    location = [str(part) for part in item["loc"] if not isinstance(part, int)]
    where = location[-1] if location else ""
    if kind == "value_error":
        return str(item["msg"]).removeprefix("Value error, ")
    if kind == "string_pattern_mismatch":
        if where == "flags" or (len(location) >= 2 and location[-2] == "flags"):
            where = "flags"
        hint = _PATTERN_HINTS.get(where, "not accepted here")
        return f"{value!r}: {hint}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = context.get("ge", context.get("gt", context.get("le", context.get("lt"))))
        words = {
            "greater_than_equal": "at least",
            "greater_than": "more than",
            "less_than_equal": "at most",
            "less_than": "less than",
        }[kind]
        return f"{value!r}: give {words} {bound}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{value!r} is not a whole number"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"{value!r} is not a number such as 0.05"
    if kind == "literal_error":
        return f"{value!r}: choose {context.get('expected', 'one of the listed values')}"
    if kind == "too_short":
        return f"give at least {context.get('min_length', 1)}"
    if kind == "too_long":
        return f"at most {context.get('max_length')} items"
    if kind == "string_too_long":
        return f"at most {context.get('max_length')} characters"
    if kind == "missing":
        return "required"
    return str(item["msg"])


# Measuring until decided, the default budget is this many first looks (looks at 1, 2 and 4).
BUDGET_FIRST_LOOKS: Final = 4


def default_rounds(spec: JobRequest) -> int:
    """The rounds of a job that leaves them out: measuring until decided, `BUDGET_FIRST_LOOKS`
    first looks; with until=rounds, one. A first look lets every comparison reach a verdict even
    when two of its process pairs at each end disagree with the rest
    (evidence/analysis/stats.py, `units_for_verdict`), whatever the size of the family (the
    interval is a t interval: more comparisons widen it, none makes it unreachable)."""
    from coldbench.evidence.analysis.stats import first_look

    return first_look(spec) * (BUDGET_FIRST_LOOKS if spec.until == "decided" else 1)


def typer_option(name: str, *, help: str | None = None, default_text: str | None = None) -> Any:
    """The `typer.Option` of a job option: its flag, help (with the default) and metavar.
    `help` replaces the declared help where a front end takes the option its own way."""
    import typer

    option = JOB_OPTIONS[name]
    text = option.help_text(default_text) if help is None else help
    if option.switch:
        return typer.Option(option.flag, help=text)
    return typer.Option(option.flag, help=text, metavar=option.metavar, show_default=False)


# What a service sets for a pull request's job: its configured repository and adapter, and the
# variants from the pull request's commits.
SET_BY_THE_PULL_REQUEST: Final = (
    "repository",
    "adapter",
    "variants",
    "range",
    "every",
    "last",
    "good",
    "bad",
    "direction",
    "fresh_process",
)


def service_options() -> list[str]:
    """The options a service's front ends offer (`coldbench submit`, the form)."""
    return [name for name, option in JOB_OPTIONS.items() if option.service]


def local_options() -> list[str]:
    """The options `coldbench run` offers."""
    return [name for name, option in JOB_OPTIONS.items() if option.local]


_Command = TypeVar("_Command", bound=Callable[..., Any])


def with_job_options(
    names: Sequence[str],
    *,
    help: Mapping[str, str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> Callable[[_Command], _Command]:
    """A Typer command's decorator: each job option of `names` becomes an option of the
    command, made from `JOB_OPTIONS` (flag, help, metavar), and the command is called with
    what was given as `given` (option name -> the text typed, a list for `--variant`, a bool
    for an on/off flag; None: not given), ready for `build_job_spec`. `help` replaces an
    option's help where the command takes it its own way; `defaults` are the command's own
    defaults, said in the help."""
    import inspect

    help, defaults = dict(help or {}), dict(defaults or {})
    parameters = []
    for name in names:
        option = JOB_OPTIONS[name]
        declared = typer_option(name, help=help.get(name), default_text=defaults.get(name))
        kind: Any = bool if option.switch else (list[str] | None if option.repeated else str | None)
        default: Any = False if option.switch else defaults.get(name)
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[kind, declared],
            )
        )

    def decorate(command: _Command) -> _Command:
        own = inspect.signature(command, eval_str=True)
        if "given" not in own.parameters:
            raise TypeError(f"{command.__name__} takes no `given` for its job options")
        clash = sorted(set(names) & set(own.parameters))
        if clash:
            raise TypeError(f"{command.__name__}: {', '.join(clash)} are job options already")

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name, None) for name in names}
            return command(*args, given=given, **kwargs)

        kept = [p for p in own.parameters.values() if p.name != "given"]
        signature = own.replace(parameters=[*kept, *parameters])
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        del wrapper.__wrapped__  # typer reads the signature above, not the command's own
        return wrapper  # type: ignore[return-value]

    return decorate


def problem_lines(error: JobOptionsError, flags: Mapping[str, str] | None = None) -> list[str]:
    """Each problem as a command line says it: `--contexts: '12x' is not a token count ...`.
    `flags` renames options a command spells its own way."""
    lines = []
    for problem in error.problems:
        option = JOB_OPTIONS.get(problem.option)
        flag = (flags or {}).get(problem.option) or (option.flag if option else None)
        lines.append(f"{flag}: {problem.message}" if flag else problem.message)
    return lines
