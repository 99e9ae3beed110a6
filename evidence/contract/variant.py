"""Variants of a job: ablation expansion (`none`, `all`, `all-minus-<flag>`) and the baseline.

An ablation feature is `flag` (meaning `flag=true`) or `flag=value`, the value that turns the
optimization on. The job's first variant is the template: the configuration the optimizations
are added to, so a feature is "off" at the template's own value of that flag (or the engine's
default where the template does not set it). From it:

- `none`: the template as given (the baseline),
- `all`: the template with every feature on,
- `all-minus-<flag>`: every feature on except that one, which keeps the template's value,

followed by the job's other variants, kept as they are.
"""

from __future__ import annotations

from pydantic import ValidationError

from coldbench.evidence.contract.schemas import (
    ABLATION_ALL,
    ABLATION_BASELINE,
    ABLATION_MINUS_PREFIX,
    FlagValue,
    JobRequest,
    VariantSpec,
    error_line,
)
from coldbench.evidence.contract.spec_text import parse_feature, parse_flag_value
from coldbench.evidence.contract.spec_text import parse_variant as parse_variant_fields

__all__ = [
    "ABLATION_ALL",
    "ABLATION_BASELINE",
    "ablation_features",
    "baseline_name",
    "expand_variants",
    "minus_variant_name",
    "parse_feature",
    "parse_flag_value",
    "parse_variant",
]


def parse_variant(text: str) -> VariantSpec:
    """`NAME[:key=value,...]` as a VariantSpec; ValueError `where: why` in one line."""
    fields = parse_variant_fields(text)
    try:
        return VariantSpec.model_validate(fields)
    except ValidationError as error:
        raise ValueError(error_line(error)) from None


def minus_variant_name(flag: str) -> str:
    return f"{ABLATION_MINUS_PREFIX}{flag}"


def expand_variants(spec: JobRequest) -> list[VariantSpec]:
    """The variants a job really runs: the spec's own, or the ablation set for ablation mode.

    JobSpec's validator has already refused what cannot expand (a feature twice, a feature the
    template already has on, names too long or clashing).
    """
    if spec.mode != "ablation":
        return [variant.model_copy(deep=True) for variant in spec.variants]
    features = [parse_feature(feature) for feature in spec.features]
    template = spec.variants[0]
    # Dropping a template flag that is also a feature would measure against the engine's
    # default instead of the configuration the maintainer named (e.g. a template chunk width of
    # 32 silently becoming 2048 in `none` and every `all-minus-*`).
    base_flags = dict(template.flags)
    on = dict(features)

    def variant(name: str, extra: dict[str, FlagValue]) -> VariantSpec:
        return VariantSpec(
            name=name, ref=template.ref, recipe=template.recipe, flags={**base_flags, **extra}
        )

    expanded = [variant(ABLATION_BASELINE, {}), variant(ABLATION_ALL, on)]
    for flag, _ in features:
        expanded.append(
            variant(minus_variant_name(flag), {k: v for k, v in on.items() if k != flag})
        )
    expanded.extend(kept.model_copy(deep=True) for kept in spec.variants[1:])
    return expanded


def baseline_name(spec: JobRequest) -> str:
    """`none` for an ablation, else the spec's baseline (its first variant by default)."""
    if spec.mode == "ablation":
        return ABLATION_BASELINE
    return spec.baseline or spec.variants[0].name


def ablation_features(spec: JobRequest) -> list[str]:
    """The flag names of an ablation's features (empty for other modes)."""
    if spec.mode != "ablation":
        return []
    return [parse_feature(feature)[0] for feature in spec.features]
