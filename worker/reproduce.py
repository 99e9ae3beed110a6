"""`coldbench reproduce`: the job of a bundle (or an evidence URL) re-run on this machine, from
the bundle alone.

The bundle holds the job as it ran (job.json: variants, flags, recipes, seed, rounds,
contexts, decode tokens) and what each variant ran (provenance.json: the commit each target
was built from, the repository's URL, the build recipe and the diff its build left; the
model's digests; the prompts' digest). `plan_reproduction` turns them into the job pinned to
those commits (coldbench.evidence.bundles.compare.pinned_spec) and this machine's repository, model
and corpus, refusing with the reason where something cannot be had: a commit the repository lacks, a
model or corpus whose digest differs, a recipe this machine does not define. Only commits were
measured (a source repository's uncommitted changes never are), so a commit is all a variant
needs; where a build changed tracked files (`dirty`, its diff's sha256), `build_differences`
says after the run whether this machine's build changed them the same way. The run itself is
`execute_run`'s, as `coldbench run`'s; its bundle adds `reproduces.json`, naming the evidence
it reproduces and the job's identity digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coldbench.engine.adapter_traits import ADAPTERS, starts_server
from coldbench.evidence.bundles.compare import (
    REPRODUCES_FILE,
    Source,
    checked,
    job_identity,
    pinned_spec,
)
from coldbench.evidence.contract.canonical import canonical_json, sha256_json
from coldbench.evidence.contract.schemas import BUILTIN_CORPUS, JobSpec, Provenance
from coldbench.worker.config import (
    ConfigError,
    RepositoryConfig,
    default_recipes,
    local_repository,
)

# A repository URL git fetches over the network (a local path is a clone on this machine).
REMOTE_URL = re.compile(r"^(https?|ssh|git|file)://|^[\w.-]+@[\w.-]+:")


class ReproductionRefused(ValueError):
    """The bundle's job cannot be re-run here as it ran; the message says why."""


@dataclass
class ReproductionPlan:
    evidence_id: str
    source: str
    spec: JobSpec  # the job pinned to the commits measured
    provenance: Provenance  # the original run's (the first, for a job of several hosts)
    repositories: dict[str, RepositoryConfig] = field(default_factory=dict)
    models: dict[str, Path] = field(default_factory=dict)
    corpora: dict[str, Path] = field(default_factory=dict)
    identity_sha256: str = ""

    def reproduces_file(self) -> bytes:
        """reproduces.json: which evidence this bundle re-runs, and the job's identity."""
        return canonical_json(
            {
                "evidence_id": self.evidence_id,
                "source": self.source,
                "job_identity_sha256": self.identity_sha256,
            }
        )


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _repository(
    spec: JobSpec, provenance: Provenance, repo: Path | None, problems: list[str]
) -> RepositoryConfig | None:
    """This machine's copy of the job's repository: `--repo`, else the URL the bundle names."""
    if spec.repository is None:
        return None  # the embedded engine installed beside this worker
    if starts_server(spec.adapter):
        problems.append(
            "an openai-server job's server command is its host's own: run the provenance's "
            "`coldbench run` line with this machine's --server-command"
        )
        return None
    urls = sorted({t.repository for t in provenance.targets if t.repository})
    modules = {
        Path(t.engine_module_file).parent.name for t in provenance.targets if t.engine_module_file
    }
    module = modules.pop() if len(modules) == 1 else None
    if repo is None:
        if not urls:
            problems.append(f"the bundle names no URL of repository {spec.repository!r}: --repo")
            return None
        if REMOTE_URL.match(urls[0]):
            # a URL git fetches: mirrored under --state-dir like any allow-listed repository
            remote = RepositoryConfig(
                name=spec.repository,
                url=urls[0],
                module=module or ADAPTERS[spec.adapter].target_module,
                adapter=spec.adapter,
                recipes=default_recipes(spec.adapter),
                default_recipe="editable",
            )
            return _with_recipes(remote, provenance, problems)
        repo = Path(urls[0])
        if not repo.exists():
            problems.append(
                f"repository {spec.repository!r} was {urls[0]}, not on this machine: give "
                "--repo PATH (a clone holding the commits measured)"
            )
            return None
    try:
        local = local_repository(repo, module=module, adapter=spec.adapter)
    except ConfigError as error:
        problems.append(str(error))
        return None
    # the job names its repository; this machine's copy goes by that name
    return _with_recipes(dataclasses.replace(local, name=spec.repository), provenance, problems)


def _with_recipes(
    repository: RepositoryConfig, provenance: Provenance, problems: list[str]
) -> RepositoryConfig:
    """The repository building with the recipe the bundle's targets were built with."""
    recipes = {t.recipe for t in provenance.targets if t.recipe}
    for recipe in sorted(recipes):
        if recipe not in repository.recipes:
            problems.append(
                f"recipe {recipe!r} is not defined on this machine "
                f"(defined: {', '.join(sorted(repository.recipes))})"
            )
    if len(recipes) == 1:
        repository = dataclasses.replace(repository, default_recipe=recipes.pop())
    return repository


def _missing_commits(repository: RepositoryConfig, spec: JobSpec, *, state_dir: Path) -> list[str]:
    from coldbench.worker.checkout import CheckoutError, resolve_ref, update_mirror

    try:
        mirror = update_mirror(repository, state_dir=state_dir)
    except CheckoutError as error:
        return [f"repository {repository.url}: {error}"]
    missing = []
    for variant in spec.variants:
        if variant.ref is None:
            continue
        try:
            found = resolve_ref(mirror, variant.ref)
        except CheckoutError:
            found = None
        if found != variant.ref:
            missing.append(
                f"variant {variant.name}: commit {variant.ref} is not in {repository.url} "
                "(fetch it, or give --repo a clone that has it)"
            )
    return missing


def _model(
    spec: JobSpec, provenance: Provenance, model: Path | None, problems: list[str]
) -> dict[str, Path]:
    """The job's model on this machine, checked against the digests the bundle recorded."""
    from coldbench.engine.checkpoints import inspect_checkpoint, resolve_model

    models: dict[str, Path] = {}
    if model is not None:
        models[spec.model] = model.expanduser().resolve()
    elif not spec.model.startswith("preset:"):
        problems.append(
            f"model {spec.model!r} was a checkpoint of the original host: give --model DIR "
            f"(its weights sha256 {provenance.model.weights_sha256 or 'unrecorded'})"
        )
        return models
    try:
        path = resolve_model(spec.model, {k: str(v) for k, v in models.items()})
        found = inspect_checkpoint(path)
    except (OSError, ValueError) as error:
        problems.append(f"model {spec.model}: {str(error).splitlines()[0]}")
        return models
    for key in ("config_sha256", "weights_sha256", "tokenizer_sha256"):
        recorded = getattr(provenance.model, key)
        if recorded is not None and found.get(key) != recorded:
            problems.append(
                f"model {spec.model}: {key.removesuffix('_sha256')} digest "
                f"{str(found.get(key))[:16]}... here, {recorded[:16]}... in the bundle"
            )
    return models


def _corpus(
    spec: JobSpec, provenance: Provenance, corpus: Path | None, problems: list[str]
) -> dict[str, Path]:
    """The job's prompts on this machine, checked against the bundle's digest."""
    from coldbench.engine.corpus import corpus_sha256

    recorded = provenance.corpus.sha256 if provenance.corpus is not None else None
    if spec.corpus == BUILTIN_CORPUS:
        if recorded is not None and corpus_sha256() != recorded:
            problems.append(
                f"prompts: the built-in corpus here is sha256 {corpus_sha256()[:16]}..., the "
                f"bundle's {recorded[:16]}... (another coldbench version's corpus)"
            )
        return {}
    if corpus is None:
        problems.append(f"corpus {spec.corpus!r} was a file of the original host: --corpus FILE")
        return {}
    if not corpus.is_file():
        problems.append(f"--corpus {corpus}: not a file")
        return {}
    if recorded is not None and _file_sha256(corpus) != recorded:
        problems.append(f"--corpus {corpus}: sha256 differs from the bundle's {recorded[:16]}...")
    return {spec.corpus: corpus.resolve()}


def plan_reproduction(
    source: Source,
    *,
    state_dir: Path,
    repo: Path | None = None,
    model: Path | None = None,
    corpus: Path | None = None,
) -> ReproductionPlan:
    """The bundle's job as this machine re-runs it; ReproductionRefused with every reason."""
    from coldbench.evidence.bundles.compare import CompareError

    try:
        evidence_id, _summary, provenances, spec = checked(source)
    except CompareError as error:
        raise ReproductionRefused(str(error)) from None
    provenance = provenances[0]
    problems: list[str] = []
    pinned = pinned_spec(spec, provenance)
    if pinned.needs_host_resolution:
        problems.append(f"the bundle's {spec.mode} job names no commits it resolved")
    for target in provenance.targets:
        if target.skipped is None and target.repository and not target.commit:
            problems.append(f"variant {target.variant}: the bundle names no commit")
    repository = _repository(pinned, provenance, repo, problems)
    models = _model(pinned, provenance, model, problems)
    corpora = _corpus(pinned, provenance, corpus, problems)
    if repository is not None and not problems:
        problems += _missing_commits(repository, pinned, state_dir=state_dir)
    if problems:
        raise ReproductionRefused("\n".join(problems))
    return ReproductionPlan(
        evidence_id=evidence_id,
        source=source.name,
        spec=pinned,
        provenance=provenance,
        repositories={repository.name: repository} if repository is not None else {},
        models=models,
        corpora=corpora,
        identity_sha256=sha256_json(job_identity(spec, provenance)),
    )


def reproduces_of(files: Mapping[str, bytes]) -> dict[str, str] | None:
    """A bundle's reproduces.json, or None for a bundle that reproduces nothing."""
    raw = files.get(REPRODUCES_FILE)
    return None if raw is None else json.loads(raw)


def build_differences(original: Provenance, reproduction: Provenance) -> list[str]:
    """Variants whose build changed tracked files other than the original's did (the diff's
    sha256 after the recipe ran): the trees measured were not the same."""
    before = {t.variant: t.diff_sha256 for t in original.targets}
    lines = []
    for target in reproduction.targets:
        if target.variant in before and target.diff_sha256 != before[target.variant]:
            lines.append(
                f"variant {target.variant}: its build left the tree with diff "
                f"{target.diff_sha256 or 'none'}, the original's {before[target.variant] or 'none'}"
            )
    return lines


def upload_bundle(agent: Any, bundle: Path) -> Any:
    """Upload a reproduction bundle (folder or zip, with reproduces.json) through `agent` as a
    reproduction of the evidence it names: the server's `ReproductionAccepted`."""
    from coldbench.evidence.bundles.bundle import BundleError, read_bundle, zip_bytes

    try:
        files = read_bundle(bundle)
    except BundleError as error:
        raise ReproductionRefused(f"{bundle}: {error}") from None
    named = reproduces_of(files)
    if named is None:
        raise ReproductionRefused(
            f"{bundle}: no {REPRODUCES_FILE}, not a bundle `coldbench reproduce` wrote"
        )
    return agent.upload_reproduction(named["evidence_id"], zip_bytes(files))
