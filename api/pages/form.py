"""The job form: its fields to the one builder of job specs, and every problem to its field.

The form's fields are evidence/spec/job_options.py's table, `JOB_OPTIONS` (the one `coldbench
run` and `coldbench submit` are made from): each option a service offers is an input
(`form_fields`) with the option's help, the default the builder fills where it is left blank
(its `default_text`, shown, never typed in for the user) and the modes that show it; the
template lays out a few of them its own way (the mode, the target, the variant rows, the
contexts) and writes every other from its FormField, so a new option needs no template edit.
The form passes the fields of the chosen mode only (a bisection
has no candidate rows, an A/B no range), the builder parses and validates them in one pass and
names each problem's option and JobSpec field; `form_field` puts it beside its input. The same
`jobs.service.create_job` as the JSON API then judges the spec against the service's limits and
hosts, its problems located the same way (`ServiceError.field`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from coldbench.evidence.analysis.stats import too_few_rounds, units_for_verdict
from coldbench.evidence.contract.schemas import JobRequest, SpecLimits, default_adapter
from coldbench.evidence.spec.job_options import (
    DEFAULT_VARIANT,
    JOB_OPTIONS,
    MODE_HELP,
    MODES,
    SET_BY_THE_PULL_REQUEST,
    JobOption,
    JobOptionsError,
    build_job_spec,
    option_of_field,
    service_options,
)

VARIANT_ROWS = 4
DEFAULT_NAMES = (DEFAULT_VARIANT, "cand", "cand2", "cand3")
CONTEXT_PRESETS = (4096, 8192, 16384, 32768, 65536, 131072)
MODE_LABELS = tuple((mode, f"{mode}: {text}") for mode, text in MODE_HELP.items())
FORM_ERROR = "_form"
# The form's inputs of job options named otherwise (the rest are named as the option).
_INPUT_OF_OPTION: Final = {"labels": "host_labels", "variants": "variant-0-name"}
# Job options whose inputs the template lays out its own way: the mode's radio buttons, the
# repository and adapter chosen from what hosts allow, the variant rows, and the context
# checkboxes beside the custom contexts. Every other option the service offers is one input
# made from its JobOption (`form_fields`).
_OWN_INPUTS: Final = ("mode", "repository", "adapter", "variants", "contexts")
_NOT_ON_THE_FORM: Final = ("fresh_process",)  # offered by the command lines only


@dataclass(frozen=True)
class _Look:
    """How the form shows an option, beyond what its JobOption says: the label, the placeholder
    (an example, or "auto" for a default computed from the job; left out: the default where
    short), the fieldset, the page's list of suggestions."""

    label: str
    example: str = ""
    fieldset: str | None = None
    suggestions: str | None = None
    small: bool | None = None
    # What only the form needs said (about its own lists and rows).
    note: str = ""


_LOOKS: Final = {
    "repository": _Look(
        "Repository", note="Only repositories on a registered host's allow-list can be built."
    ),
    "adapter": _Look(
        "Adapter",
        note="Each enrolled host drives a repository with one adapter; its options are the "
        "engine flags of a server variant.",
    ),
    "recipe": _Look(
        "Build recipe",
        "e.g. editable",
        fieldset="target",
        suggestions="recipes",
        note="Configured on the host; used for variants with a ref.",
    ),
    "contexts": _Look("Contexts (tokens)", "512, 2048, 12K"),
    "features": _Look(
        "Ablation features",
        "compile, clear_cache=false, prefill_step_size=4096",
        note="The baseline variant's flags are the template.",
    ),
    # Computed from the job (the hint says how): "auto", whatever the default's text.
    "rounds": _Look("Rounds", "auto"),
    "until": _Look("Measure until"),
    # Left blank, a job measuring until decided gets the service's default_budget_minutes.
    "budget_minutes": _Look("Budget (minutes)", "service default"),
    "decode_tokens": _Look("Decode tokens"),
    "model": _Look("Model", suggestions="models", small=False),
    "seed": _Look("Seed"),
    "corpus": _Look("Corpus", small=True),
    "labels": _Look(
        "Host labels (all required)", "backend:metal, lab:home", "hosts", suggestions="labels"
    ),
    "hosts": _Look("Reproductions (distinct hosts)", fieldset="hosts"),
    "rounds_per_process": _Look("Rounds per process", "auto"),
    "precision": _Look("Precision"),
    "residency": _Look("Variant processes"),
    "range": _Look(
        "History range",
        "v1.0..main",
        note="Instead of listing commits: the commits run in the baseline row's configuration "
        "(leave its ref empty).",
    ),
    "every": _Look("every Nth"),
    "last": _Look("newest N"),
    "good": _Look("Bisect: good ref", "v1.0"),
    "bad": _Look("bad ref", "main"),
    "direction": _Look("change"),
    "base": _Look("Commits: base ref", "main"),
    "head": _Look("head ref", "my-pr"),
    "alone": _Look("each alone on base"),
}
# What the form says under a mode's own fields (about its variant rows).
MODE_NOTES: Final = {
    "bisect": "One context; each step is a run of its own (good, midpoint, bad in every round), "
    "halved by its verdicts until the first commit whose verdict differs from its parent's. The "
    "baseline row is the configuration (leave its ref empty).",
    "commits": "The host runs base, head, and head without each commit of base..head (reverted "
    "in a tree of its own); a commit whose revert conflicts or whose tree does not build is "
    "reported as not separable. The baseline row is the configuration (leave its ref empty).",
}
_INPUT_MODES: Final = {"N": "numeric", "MINUTES": "decimal", "FRACTION": "decimal"}
# A default longer than this is said in the hint only; the input's placeholder says "auto".
_PLACEHOLDER_CHARS: Final = 20
# A number or a choice is a narrow field, unless its hint is longer than this.
_NARROW_HINT_CHARS: Final = 100


@dataclass(frozen=True)
class FormField:
    """One input of the form, made from its job option: the input's name, label, hint (the
    option's help and default), placeholder and kind, and the modes that show it."""

    option: JobOption
    name: str
    label: str
    hint: str
    placeholder: str
    widget: str  # "text", "select" or "checkbox"
    inputmode: str | None
    fieldset: str  # "target", "mode", "matrix" or "hosts"
    small: bool
    suggestions: str | None

    @property
    def default(self) -> str | None:
        """What the builder fills where the input is left blank (the option's default_text)."""
        return self.option.default_text

    @property
    def modes(self) -> tuple[str, ...]:
        return self.option.modes


def _form_field(option: JobOption) -> FormField:
    look = _LOOKS.get(option.name) or _Look(option.name.replace("_", " ").capitalize())
    widget = "checkbox" if option.switch else "select" if option.choices else "text"
    inputmode = _INPUT_MODES.get(option.metavar)
    default = option.default_text or ""
    placeholder = look.example or (
        default if len(default) <= _PLACEHOLDER_CHARS else "auto" if default else ""
    )
    hint = " ".join(part for part in (option.help_text(say_modes=False), look.note) if part)
    return FormField(
        option=option,
        name=_INPUT_OF_OPTION.get(option.name, option.name),
        label=look.label,
        hint=hint,
        placeholder=placeholder,
        widget=widget,
        inputmode=inputmode,
        fieldset=look.fieldset or ("matrix" if option.modes == MODES else "mode"),
        small=look.small
        if look.small is not None
        else (widget != "text" or bool(inputmode)) and len(hint) <= _NARROW_HINT_CHARS,
        suggestions=look.suggestions,
    )


def form_fields() -> dict[str, FormField]:
    """Option name -> its input, for every job option a service offers (JOB_OPTIONS' order):
    those the template lays out its own way (`_OWN_INPUTS`) take their label and hint from here
    too; every other one the template writes from its FormField alone."""
    return {
        name: _form_field(JOB_OPTIONS[name])
        for name in service_options()
        if name not in _NOT_ON_THE_FORM
    }


def plain_fields() -> list[FormField]:
    """The inputs made from their job option alone (all but `_OWN_INPUTS`)."""
    return [f for name, f in form_fields().items() if name not in _OWN_INPUTS]


def fields_by_modes() -> dict[tuple[str, ...], list[FormField]]:
    """The mode fieldset's inputs, by the modes that show them."""
    grouped: dict[tuple[str, ...], list[FormField]] = {}
    for item in plain_fields():
        if item.fieldset == "mode":
            grouped.setdefault(item.modes, []).append(item)
    return grouped


@dataclass
class JobForm:
    """What the user typed (echoed back on errors) and what went wrong, by field name."""

    values: dict[str, str] = field(default_factory=dict)
    contexts: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    # Not an error: the job is accepted, but its rounds cannot reach a verdict.
    rounds_warning: str | None = None

    def add_error(self, name: str, message: str) -> None:
        self.errors[name] = f"{self.errors[name]}; {message}" if name in self.errors else message

    @property
    def mode(self) -> str:
        return self.values.get("mode") or str(JOB_OPTIONS["mode"].default_text)


def blank_form() -> JobForm:
    """Every input blank (the builder fills each default; the page shows it), but the variant
    rows' names."""
    values = {
        **{item.name: "" for name, item in form_fields().items() if name != "contexts"},
        # The contexts are the checked presets (JobForm.contexts) and these.
        "custom_contexts": "",
        # OWNER/REPO#N: the service measures the pull request's commits (docs/github.md).
        "pull_request": "",
    }
    for index in range(VARIANT_ROWS):
        values[f"variant-{index}-name"] = DEFAULT_NAMES[index] if index < 2 else ""
        values[f"variant-{index}-ref"] = ""
        values[f"variant-{index}-flags"] = ""
    return JobForm(values=values)


def read_form(fields: Mapping[str, Any], preset_contexts: list[str]) -> JobForm:
    """The submitted form as typed, with the context checkboxes already parsed."""
    form = blank_form()
    for name in form.values:
        form.values[name] = str(fields.get(name, "")).strip()
    form.contexts = []
    for text in preset_contexts:
        if text.isdigit() and int(text) in CONTEXT_PRESETS:
            form.contexts.append(int(text))
        else:
            form.add_error("contexts", f"{text!r} is not one of the context presets")
    return form


def _contexts_text(form: JobForm) -> str:
    """The contexts checked and typed, as one list (blank: the builder's default)."""
    return ", ".join([*(str(c) for c in form.contexts), form.values["custom_contexts"]]).strip(", ")


def pull_request_options(form: JobForm) -> dict[str, str]:
    """The form's options for a pull request's job (`coldbench.api.github`): the PR's commits and
    its repository are the service's, so the target, the variant rows and the commits of mode
    commits are not read."""
    values = form.values
    given = {
        "mode": values["mode"],
        "contexts": _contexts_text(form),
        **{
            item.option.name: values[item.name]
            for item in plain_fields()
            if item.option.name not in (*SET_BY_THE_PULL_REQUEST, "recipe")
            and item.option.modes != ("commits",)
        },
    }
    return {
        name: value
        for name, value in given.items()
        if value and JOB_OPTIONS[name].belongs_to(form.mode)
    }


def adapter_choices(adapters: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """adapter -> the repositories some host drives with it (the form's adapter options)."""
    choices: dict[str, list[str]] = {}
    for repository, names in sorted(adapters.items()):
        for name in names:
            choices.setdefault(name, []).append(repository)
    return dict(sorted(choices.items()))


def choose_adapter(form: JobForm, adapters: Mapping[str, list[str]]) -> str:
    """The adapter typed, or where left to the form the one hosts drive the repository with."""
    chosen, repository = form.values["adapter"], form.values["repository"]
    if chosen:
        return chosen
    if not repository:
        return default_adapter(None)
    offered = adapters.get(repository, [])
    if len(offered) > 1:
        form.add_error(
            "adapter",
            f"hosts drive {repository} with {' and '.join(offered)}: choose the adapter",
        )
    # A repository no host allows gets the default adapter here and is refused by the
    # service, by name.
    return offered[0] if offered else default_adapter(repository)


def uses_candidate_rows(mode: str, values: Mapping[str, str]) -> bool:
    """A history over a range, a bisection and a commits job run one configuration: the
    baseline row only."""
    return not (
        mode in ("bisect", "commits") or (mode == "history" and values.get("range", "").strip())
    )


def build_spec(
    form: JobForm,
    adapters: Mapping[str, list[str]] | None = None,
    *,
    limits: SpecLimits | None = None,
) -> tuple[JobRequest | None, dict[int, int]]:
    """The job spec of the form (None when it has errors, each in form.errors), and which form
    row each spec variant came from.

    `adapters` is what enrolled hosts allow per repository (hosts.service.adapters_by_repository);
    `limits` the service's bounds on sizes, checked in the same pass. Only the fields of the
    chosen mode are read: the page shows no others.
    """
    values = form.values
    mode = form.mode
    variants: list[dict[str, Any]] = []
    rows: dict[int, int] = {}
    for index in range(VARIANT_ROWS if uses_candidate_rows(mode, values) else 1):
        name = values[f"variant-{index}-name"]
        ref = values[f"variant-{index}-ref"] if values["repository"] else ""
        flags = values[f"variant-{index}-flags"]
        if index > 0 and not (name or ref or flags):
            continue  # an unused candidate row
        rows[len(variants)] = index
        variants.append({"name": name or DEFAULT_NAMES[index], "ref": ref, "flags": flags})
    given: dict[str, Any] = {
        "mode": mode,
        "repository": values["repository"],
        "adapter": choose_adapter(form, adapters or {}),
        "variants": variants,
        "contexts": _contexts_text(form),
        **{item.option.name: values[item.name] for item in plain_fields()},
    }
    chosen = {name: value for name, value in given.items() if JOB_OPTIONS[name].belongs_to(mode)}
    try:
        spec = build_job_spec(chosen, limits=limits)
    except JobOptionsError as error:
        for problem in error.problems:
            target = (
                form_field(problem.field, rows)
                if problem.field
                else _INPUT_OF_OPTION.get(problem.option, problem.option)
            )
            form.add_error(
                target if target in form.values or target == "contexts" else FORM_ERROR,
                problem.message,
            )
        return None, rows
    form.rounds_warning = too_few_rounds(spec)
    return spec, rows


def _field_of_location(location: tuple[Any, ...], rows: dict[int, int]) -> str:
    if not location:
        return FORM_ERROR
    if location[0] == "variants" and len(location) >= 2 and isinstance(location[1], int):
        row = rows.get(location[1], 0)
        part = str(location[2]) if len(location) > 2 else "name"
        if part == "recipe":
            return "recipe"
        return f"variant-{row}-{part if part in ('name', 'ref', 'flags') else 'name'}"
    # Every other field: the input of the option that sets it (the builder's mapping).
    option = option_of_field(".".join(str(part) for part in location))
    inputs = form_fields()
    if option not in inputs:
        return FORM_ERROR
    return inputs[option].name


def form_field(path: str | None, rows: dict[int, int]) -> str:
    """The form input a JobSpec field path (`contexts`, `variants.1.flags`) is about."""
    if not path:
        return FORM_ERROR
    location = tuple(int(part) if part.isdigit() else part for part in path.split("."))
    return _field_of_location(location, rows)


# The form's script looks the rounds up here for the comparisons a job would have (the rule
# stays in evidence/analysis/stats.py); larger families fall back to the server's warning.
MAX_FAMILY_LOOKUP = 256


def rounds_by_family() -> dict[int, int]:
    # The robust interval needs as many process pairs whatever the family's size.
    return {m: units_for_verdict() for m in range(1, MAX_FAMILY_LOOKUP + 1)}
