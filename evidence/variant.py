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

from collections import Counter

from evidence.schemas import FlagValue, JobSpec, VariantSpec, is_valid_name

ABLATION_BASELINE = "none"
ABLATION_ALL = "all"
ABLATION_MINUS_PREFIX = "all-minus-"


def parse_flag_value(text: str) -> FlagValue:
    """`true`/`false` (any case) -> bool, then int, then float, else the string itself."""
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_feature(feature: str) -> tuple[str, FlagValue]:
    """`compile` -> ("compile", True); `prefill_step_size=4096` -> ("prefill_step_size", 4096)."""
    flag, sep, value = feature.partition("=")
    if not flag:
        raise ValueError(f"feature {feature!r} has no flag name")
    return flag, parse_flag_value(value) if sep else True


def minus_variant_name(flag: str) -> str:
    return f"{ABLATION_MINUS_PREFIX}{flag}"


def expand_variants(spec: JobSpec) -> list[VariantSpec]:
    """The variants a job really runs: the spec's own, or the ablation set for ablation mode."""
    if spec.mode != "ablation":
        return [variant.model_copy(deep=True) for variant in spec.variants]
    features = [parse_feature(feature) for feature in spec.features]
    flags = [flag for flag, _ in features]
    repeated = sorted(flag for flag, times in Counter(flags).items() if times > 1)
    if repeated:
        raise ValueError(f"ablation features name the same flag twice: {', '.join(repeated)}")
    template = spec.variants[0]
    # Dropping a template flag that is also a feature would measure against the engine's
    # default instead of the configuration the maintainer named (e.g. a template chunk width of
    # 32 silently becoming 2048 in `none` and every `all-minus-*`).
    base_flags = dict(template.flags)
    on = dict(features)
    unchanged = sorted(flag for flag, value in on.items() if template.flags.get(flag) == value)
    if unchanged:
        raise ValueError(
            "ablation features already on in the first variant (nothing to leave out): "
            + ", ".join(f"{flag}={on[flag]}" for flag in unchanged)
        )

    def variant(name: str, extra: dict[str, FlagValue]) -> VariantSpec:
        if not is_valid_name(name):
            raise ValueError(f"variant name {name!r} is too long or not a plain name")
        return VariantSpec(
            name=name, ref=template.ref, recipe=template.recipe, flags={**base_flags, **extra}
        )

    expanded = [variant(ABLATION_BASELINE, {}), variant(ABLATION_ALL, on)]
    for flag in flags:
        expanded.append(
            variant(minus_variant_name(flag), {k: v for k, v in on.items() if k != flag})
        )
    names = {v.name for v in expanded}
    for kept in spec.variants[1:]:
        if kept.name in names:
            raise ValueError(
                f"variant {kept.name!r} clashes with a name the ablation expansion uses; rename it"
            )
        expanded.append(kept.model_copy(deep=True))
    return expanded


def baseline_name(spec: JobSpec) -> str:
    """`none` for an ablation, else the spec's baseline (its first variant by default)."""
    if spec.mode == "ablation":
        return ABLATION_BASELINE
    return spec.baseline or spec.variants[0].name


def ablation_features(spec: JobSpec) -> list[str]:
    """The flag names of an ablation's features (empty for other modes)."""
    if spec.mode != "ablation":
        return []
    return [parse_feature(feature)[0] for feature in spec.features]
