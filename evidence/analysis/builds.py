"""The MLX builds the variants ran (engine/mlx_build.py, reported by each variant's own process
into provenance.json's `targets[].software.mlx_build`): summary.json's `mlx_builds`.

Within one run every variant should run the same MLX unless the job asks otherwise: a variant
that loaded other native bytes (another wheel, a source build, a patched library) is measured
against a different MLX, not only against different engine code, and the report says
"variants ran different MLX builds". Runs on different hosts may differ from each other; only
variants of one run are compared.
"""

from __future__ import annotations

from collections.abc import Sequence

from coldbench.evidence.contract.schemas import Provenance
from coldbench.evidence.contract.summary_schema import MlxBuild, MlxBuilds

DIFFERENT_BUILDS = "variants ran different MLX builds"


def builds_section(provenances: Sequence[Provenance]) -> MlxBuilds | None:
    """Each variant's build per run; None where no variant reported one."""
    builds = []
    differ: list[str] = []
    for provenance in provenances:
        mine = []
        for target in provenance.targets:
            build = (target.software or {}).get("mlx_build")
            if not isinstance(build, dict) or not isinstance(build.get("digest"), str):
                continue
            mine.append(
                MlxBuild(
                    run_id=provenance.run_id,
                    variant=target.variant,
                    version=build.get("version") if isinstance(build.get("version"), str) else None,
                    origin=str(build.get("origin") or "unknown"),
                    digest=build["digest"],
                )
            )
        if len({b.digest for b in mine}) > 1:
            differ.append(provenance.run_id)
        builds += mine
    if not builds:
        return None
    return MlxBuilds(builds=builds, runs_with_different_builds=differ)


def builds_caveats(section: MlxBuilds | None) -> list[str]:
    if section is None:
        return []
    found = []
    for run_id in section.runs_with_different_builds:
        mine = [b for b in section.builds if b.run_id == run_id]
        listed = ", ".join(
            f"{b.variant}: {b.version or '?'} {b.origin} {b.digest[:12]}" for b in mine
        )
        found.append(
            f"In run {run_id} the {DIFFERENT_BUILDS} ({listed}): a difference between them may "
            "be MLX's, not the engine code's."
        )
    return found
