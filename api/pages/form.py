"""The job form: its fields to the one builder of job specs, and every problem to its field.

What the form's fields mean is evidence/spec/job_options.py's (the builder `coldbench run` and
`coldbench submit` use too): the form passes the fields of the chosen mode only (a bisection
has no candidate rows, an A/B no range), the builder parses and validates them in one pass and
names each problem's option and JobSpec field; `form_field` puts it beside its input. The same
`jobs.service.create_job` as the JSON API then judges the spec against the service's limits and
hosts, its problems located the same way (`ServiceError.field`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from coldbench.evidence.analysis.stats import too_few_rounds, units_for_verdict
from coldbench.evidence.contract.schemas import JobSpec, Residency, SpecLimits, default_adapter
from coldbench.evidence.spec.job_options import (
    JOB_OPTIONS,
    MODE_HELP,
    JobOptionsError,
    build_job_spec,
    option_of_field,
    service_options,
)

VARIANT_ROWS = 4
DEFAULT_NAMES = ("base", "cand", "cand2", "cand3")
CONTEXT_PRESETS = (4096, 8192, 16384, 32768, 65536, 131072)
MODES = tuple((mode, f"{mode}: {text}") for mode, text in MODE_HELP.items())
RESIDENCIES = get_args(Residency)
HISTORY_FIELDS = ("range", "every", "last")
BISECT_FIELDS = ("good", "bad", "direction")
COMMITS_FIELDS = ("base", "head", "alone")
# The form's inputs of job options named otherwise (the rest are named as the option).
_INPUT_OF_OPTION = {"labels": "host_labels", "variants": "variant-0-name"}
# Job options the form reads its own way: the target (repository, adapter and recipe, the
# adapter chosen from what hosts allow), the variant rows, the context checkboxes beside the
# custom contexts, and the model and labels, which a pull request's job takes too.
_OWN_INPUTS = ("mode", "repository", "adapter", "recipe", "variants", "contexts", "model", "labels")
# Every other option the service offers is one input named as the option.
PLAIN_OPTIONS = tuple(
    name
    for name in service_options()
    if name not in _OWN_INPUTS and name != "fresh_process"  # not offered on the form
)
# What a pull request's job takes of the form: its commits and repository are the service's.
_PULL_REQUEST_OPTIONS = tuple(
    name for name in PLAIN_OPTIONS if name not in (*HISTORY_FIELDS, *BISECT_FIELDS, *COMMITS_FIELDS)
)
FORM_ERROR = "_form"


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


def blank_form() -> JobForm:
    values = {
        **dict.fromkeys(PLAIN_OPTIONS, ""),
        "repository": "",
        "adapter": "",
        "recipe": "",
        "mode": "ab",
        "features": "",
        "custom_contexts": "",
        # Blank: the builder's default for the job (enough for a verdict).
        "rounds": "",
        "decode_tokens": "8",
        "model": "preset:tiny",
        "host_labels": "",
        "hosts": "1",
        "precision": "0.02",
        "until": "rounds",
        "budget_minutes": "",
        "residency": "auto",
        "seed": "0",
        **dict.fromkeys(HISTORY_FIELDS, ""),
        "good": "",
        "bad": "",
        "direction": "slower",
        **dict.fromkeys(COMMITS_FIELDS, ""),
        # OWNER/REPO#N: the service measures the pull request's commits (docs/github.md).
        "pull_request": "",
    }
    for index in range(VARIANT_ROWS):
        values[f"variant-{index}-name"] = DEFAULT_NAMES[index] if index < 2 else ""
        values[f"variant-{index}-ref"] = ""
        values[f"variant-{index}-flags"] = ""
    return JobForm(values=values, contexts=[4096])


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


def pull_request_options(form: JobForm) -> dict[str, str]:
    """The form's options for a pull request's job (`coldbench.api.github`): the PR's commits and
    its repository are the service's, so the target and variant rows are not read."""
    values = form.values
    contexts = ", ".join([*(str(c) for c in form.contexts), values["custom_contexts"]])
    given = {
        "mode": values["mode"],
        "contexts": contexts.strip(", "),
        "labels": values["host_labels"],
        "model": values["model"],
        **{name: values[name] for name in _PULL_REQUEST_OPTIONS},
    }
    mode = values["mode"] or "ab"
    return {
        name: value
        for name, value in given.items()
        if value and (name not in JOB_OPTIONS or JOB_OPTIONS[name].belongs_to(mode))
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
) -> tuple[JobSpec | None, dict[int, int]]:
    """The job spec of the form (None when it has errors, each in form.errors), and which form
    row each spec variant came from.

    `adapters` is what enrolled hosts allow per repository (hosts.service.adapters_by_repository);
    `limits` the service's bounds on sizes, checked in the same pass. Only the fields of the
    chosen mode are read: the page shows no others.
    """
    values = form.values
    mode = values.get("mode") or "ab"
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
        "recipe": values["recipe"],
        "variants": variants,
        "contexts": [*form.contexts, values["custom_contexts"]],
        "model": values["model"],
        "labels": values["host_labels"],
        **{name: values[name] for name in PLAIN_OPTIONS},
    }
    chosen = {
        name: value
        for name, value in given.items()
        if name not in JOB_OPTIONS or JOB_OPTIONS[name].belongs_to(mode)
    }
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
    head = str(location[0])
    if head in ("history", "bisect", "commits"):
        part = str(location[1]) if len(location) > 1 else ""
        if part in (*HISTORY_FIELDS, *BISECT_FIELDS, *COMMITS_FIELDS):
            return part
        return {"history": "range", "bisect": "good"}.get(head, "base")
    if head == "variants" and len(location) >= 2 and isinstance(location[1], int):
        row = rows.get(location[1], 0)
        part = str(location[2]) if len(location) > 2 else "name"
        if part == "recipe":
            return "recipe"
        return f"variant-{row}-{part if part in ('name', 'ref', 'flags') else 'name'}"
    # Every other field: the input of the option that sets it (the builder's mapping).
    option = option_of_field(head)
    return FORM_ERROR if option == "job" else _INPUT_OF_OPTION.get(option, option)


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
