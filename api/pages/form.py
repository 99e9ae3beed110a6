"""The job form: its fields to a JobSpec payload, and every error to the field it concerns.

Parsing errors of the form's own syntax (a context list, a flag list) are found here; the spec
is then validated by JobSpec (pydantic, errors located by field path) and by the same
`jobs.service.create_job` the JSON API calls, whose errors carry the JobSpec field they are
about (`ServiceError.field`); `form_field` maps a JobSpec path to the form's input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from evidence.schemas import JobSpec, SpecError
from evidence.spec_text import parse_context, parse_flags, split_list
from evidence.stats import rounds_for_verdict, too_few_rounds

VARIANT_ROWS = 4
DEFAULT_NAMES = ("base", "cand", "cand2", "cand3")
CONTEXT_PRESETS = (4096, 8192, 16384, 32768, 65536, 131072)
MODES = (
    ("ab", "A/B: candidates against the baseline"),
    ("ablation", "ablation: leave one feature out"),
    ("sweep", "sweep: the same code over several flag settings"),
    (
        "history",
        "history: each candidate's ref is a commit, measured against the baseline's commit "
        "(or a range A..B, resolved by the host)",
    ),
    ("bisect", "bisect: the first commit between good and bad that is slower (or faster)"),
)
# Modes whose commits a host resolves (a history's range, a bisection's good..bad): the
# baseline row gives the configuration (flags, no ref) and the other rows stay empty.
HISTORY_FIELDS = ("range", "every", "last")
BISECT_FIELDS = ("good", "bad", "direction")
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
        "repository": "",
        "adapter": "",
        "recipe": "",
        "mode": "ab",
        "features": "",
        "custom_contexts": "",
        # The default matrix (one context, one candidate) can reach a verdict.
        "rounds": str(rounds_for_verdict(1)),
        "decode_tokens": "8",
        "model": "preset:tiny",
        "host_labels": "",
        "hosts": "1",
        "precision": "0.05",
        "seed": "0",
        **dict.fromkeys(HISTORY_FIELDS, ""),
        "good": "",
        "bad": "",
        "direction": "slower",
    }
    for index in range(VARIANT_ROWS):
        values[f"variant-{index}-name"] = DEFAULT_NAMES[index] if index < 2 else ""
        values[f"variant-{index}-ref"] = ""
        values[f"variant-{index}-flags"] = ""
    return JobForm(values=values, contexts=[4096])


def _int_field(form: JobForm, name: str, label: str) -> int | None:
    text = form.values.get(name, "").strip()
    try:
        return int(text)
    except ValueError:
        form.add_error(name, f"{label}: give a whole number")
        return None


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
        return "embedded"
    offered = adapters.get(repository, [])
    if len(offered) > 1:
        form.add_error(
            "adapter",
            f"hosts drive {repository} with {' and '.join(offered)}: choose the adapter",
        )
    # A repository no host allows gets mlx-lm here and is refused by the service, by name.
    return offered[0] if offered else "mlx-lm"


def build_payload(
    form: JobForm, adapters: Mapping[str, list[str]] | None = None
) -> tuple[dict[str, Any], dict[int, int]]:
    """The JobSpec payload, and which form row each spec variant came from.

    `adapters` is what enrolled hosts allow per repository (hosts.service.adapters_by_repository).
    Syntax errors go into form.errors; the payload is only meaningful when there are none.
    """
    values = form.values
    contexts = list(form.contexts)
    for item in split_list(values["custom_contexts"]):
        try:
            contexts.append(parse_context(item))
        except ValueError as error:
            form.add_error("contexts", str(error))
    if not contexts and "contexts" not in form.errors:
        form.add_error("contexts", "choose at least one context length")

    repository = values["repository"] or None
    recipe = values["recipe"] or None
    variants: list[dict[str, Any]] = []
    rows: dict[int, int] = {}
    for index in range(VARIANT_ROWS):
        name = values[f"variant-{index}-name"]
        ref = values[f"variant-{index}-ref"]
        flags_text = values[f"variant-{index}-flags"]
        if index > 0 and not (name or ref or flags_text):
            continue  # an unused candidate row
        try:
            flags = parse_flags(flags_text)
        except ValueError as error:
            form.add_error(f"variant-{index}-flags", str(error))
            flags = {}
        variant: dict[str, Any] = {"name": name or DEFAULT_NAMES[index], "flags": flags}
        if ref:
            variant["ref"] = ref
            if recipe:
                variant["recipe"] = recipe
        rows[len(variants)] = index
        variants.append(variant)

    mode = values["mode"] or "ab"
    if (mode == "history" and values["range"]) or mode == "bisect":
        _one_configuration(form, variants, rows, "range" if mode == "history" else "good..bad")
    payload: dict[str, Any] = {
        "schema": "coldbench.job/1",
        "mode": mode,
        "adapter": choose_adapter(form, adapters or {}),
        "repository": repository,
        "variants": variants,
        "features": split_list(values["features"]),
        "contexts": contexts,
        "model": values["model"] or "preset:tiny",
        "host_labels": split_list(values["host_labels"]),
    }
    for name, label in (
        ("rounds", "rounds"),
        ("decode_tokens", "decode tokens"),
        ("hosts", "hosts"),
        ("seed", "seed"),
    ):
        number = _int_field(form, name, label)
        if number is not None:
            payload[name] = number
    try:
        payload["precision"] = float(values["precision"])
    except ValueError:
        form.add_error("precision", "precision: give a fraction such as 0.05")
    if mode == "history" and values["range"]:
        history: dict[str, Any] = {"range": values["range"]}
        for name in ("every", "last"):
            if values[name]:
                history[name] = _int_field(form, name, name)
        payload["history"] = history
    elif values["every"] or values["last"]:
        form.add_error("range", "every and last thin a range A..B of mode history")
    if mode == "bisect":
        payload["bisect"] = {name: values[name] for name in BISECT_FIELDS}
    return payload, rows


def _one_configuration(
    form: JobForm, variants: list[dict[str, Any]], rows: dict[int, int], source: str
) -> None:
    """A range or a bisection: the baseline row is the configuration every commit runs in."""
    if variants and variants[0].get("ref"):
        form.add_error("variant-0-ref", f"the commits come from the {source}: leave ref empty")
    if len(variants) > 1:
        form.add_error(
            f"variant-{rows[1]}-name",
            f"the commits come from the {source}: give only the baseline row (the configuration)",
        )


# JobSpec field (first element of a pydantic error location) -> form field.
_SPEC_FIELDS = {
    "contexts": "contexts",
    "rounds": "rounds",
    "decode_tokens": "decode_tokens",
    "model": "model",
    "host_labels": "host_labels",
    "hosts": "hosts",
    "features": "features",
    "mode": "mode",
    "repository": "repository",
    "adapter": "adapter",
    "precision": "precision",
    "seed": "seed",
    "baseline": "variant-0-name",
}


def _field_of_location(location: tuple[Any, ...], rows: dict[int, int]) -> str:
    if not location:
        return FORM_ERROR
    head = str(location[0])
    if head in ("history", "bisect"):
        part = str(location[1]) if len(location) > 1 else ""
        if part in (*HISTORY_FIELDS, *BISECT_FIELDS):
            return part
        return "range" if head == "history" else "good"
    if head == "variants" and len(location) >= 2 and isinstance(location[1], int):
        row = rows.get(location[1], 0)
        part = str(location[2]) if len(location) > 2 else "name"
        if part == "recipe":
            return "recipe"
        return f"variant-{row}-{part if part in ('name', 'ref', 'flags') else 'name'}"
    return _SPEC_FIELDS.get(head, FORM_ERROR)


def form_field(path: str | None, rows: dict[int, int]) -> str:
    """The form input a JobSpec field path (`contexts`, `variants.1.flags`) is about."""
    if not path:
        return FORM_ERROR
    location = tuple(int(part) if part.isdigit() else part for part in path.split("."))
    return _field_of_location(location, rows)


# The form's script looks the rounds up here for the comparisons a job would have (the rule
# stays in evidence/stats.py); larger families fall back to the server's warning.
MAX_FAMILY_LOOKUP = 256


def rounds_by_family() -> dict[int, int]:
    return {m: rounds_for_verdict(m) for m in range(1, MAX_FAMILY_LOOKUP + 1)}


def validate_payload(form: JobForm, payload: dict[str, Any], rows: dict[int, int]) -> None:
    """JobSpec's own validation, each error placed beside its field; a rounds warning when
    the spec is valid but its rounds cannot reach a verdict."""
    try:
        spec = JobSpec.model_validate(payload)
        form.rounds_warning = too_few_rounds(spec)
    except ValidationError as error:
        for item in error.errors():
            message = item["msg"].removeprefix("Value error, ")
            cause = (item.get("ctx") or {}).get("error")
            if not item["loc"] and isinstance(cause, SpecError):
                target = form_field(cause.field, rows)
            else:
                target = _field_of_location(tuple(item["loc"]), rows)
            form.add_error(target, message)
