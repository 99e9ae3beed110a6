"""One run on this host: prepare every variant, run the balanced rounds, write the bundle.

Shared by `coldbench run` (a maintainer's machine, no server) and the agent (a leased job), so
both produce identical evidence. Order of work: resolve the model; for a repository target
mirror it, resolve each ref to a commit and build each (repository, commit, recipe) in
isolation; then the rounds, cut into process blocks (a fresh process per variant per block,
every model loaded and every context warmed before the block's first timed cell); then
provenance and the bundle.

A build failure is a result: the run completes as failed with its build logs. In a history a
commit that does not build is skipped with its reason; in a commits job a synthesized tree
(head without one commit, base with only one) that does not apply, build or load is "not
separable" with its reason and the rest go on. A failed run's bundle also holds `reason.txt`,
and a server run's bundle each server's log (its last `SERVER_LOG_BYTES`), so a reviewer sees
why without the host.

Server variants (adapter `openai-server`) name host-declared options like flags; they are
validated here against the repository's declarations (`coldbench.evidence.spec.options`) and handed
to the variant process resolved (argv pieces, env, proof), with the repository's wipe paths and
first-token bound. A repository without a URL is the one of `coldbench run --adapter
openai-server` without `--repo`: its server runs from this interpreter, nothing is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coldbench.engine.adapter_traits import runs_checkout_engine, starts_server
from coldbench.engine.memory import IN_TURNS, RESIDENCIES, SIDE_BY_SIDE, MemoryPlan
from coldbench.engine.plan import Plan
from coldbench.evidence.analysis.bisect import step_spec
from coldbench.evidence.analysis.commits import commits_spec
from coldbench.evidence.analysis.history import history_spec
from coldbench.evidence.analysis.stats import job_looks
from coldbench.evidence.analysis.summary import look_decided, prefill_verdicts_at_look
from coldbench.evidence.contract.calibration import block_length
from coldbench.evidence.contract.schemas import (
    BUILTIN_CORPUS,
    MAX_BISECT_LINE,
    MAX_HISTORY_COMMITS,
    MAX_PR_COMMITS,
    MIN_PROCESS_BLOCKS,
    CommitTreePlan,
    HostInfo,
    HostNoise,
    JobSpec,
    Record,
    SynthesizedTree,
    VariantSpec,
    effective_rounds_per_process,
)
from coldbench.evidence.contract.summary_schema import Summary
from coldbench.evidence.contract.variant import baseline_name, expand_variants
from coldbench.evidence.spec.options import OptionError, resolved_options, validate_option_values
from coldbench.worker.build import (
    FAST_PATH_PACKAGES,
    Build,
    build,
    engine_layout,
    install_path_problem,
)
from coldbench.worker.checkout import (
    Checkout,
    CheckoutError,
    NotSeparable,
    check_ref,
    commit_line,
    commit_subject,
    commit_subject_of,
    history_commits,
    mirror_path,
    prepare,
    synthesize,
    uncommitted_work_refusal,
)
from coldbench.worker.config import Recipe, RepositoryConfig
from coldbench.worker.provenance import (
    corpus_info,
    device_peak,
    model_info,
    module_file_of,
    reproduce_command,
    run_provenance,
    software_info,
    target_info,
)
from coldbench.worker.schedule import plan_rounds
from coldbench.worker.variants import (
    CONTROLS_FILE,
    RECORDS_FILE,
    RUNNER,
    Progress,
    ScheduleOutcome,
    VariantError,
    VariantLaunch,
    child_env,
    run_schedule,
)

log = logging.getLogger(__name__)

CELL_TIMEOUT_S = 600.0
# Each server's log in a bundle: its end, where a failure explains itself.
SERVER_LOG_BYTES = 256 * 1024
# Builds of one run at once, at most one per core: each is pip and a Python import, CPU-bound.
MAX_PARALLEL_BUILDS = 8


class RunRefused(ValueError):
    """The job cannot run on this host (repository not allow-listed, recipe unknown, ...)."""


@dataclass
class PreparedVariant:
    spec: VariantSpec
    launch: VariantLaunch
    adapter: str
    checkout: Checkout | None = None
    build: Build | None = None
    # History mode: a commit that did not check out or build is recorded and never launched;
    # commits mode: a synthesized tree that did not apply, build or load (not separable).
    skipped: str | None = None
    # Commits mode: how this variant's tree was made (head without a commit, base with one).
    synthesized: SynthesizedTree | None = None


@dataclass
class RunOutcome:
    run_id: str
    status: str  # "succeeded" | "failed"
    reason: str | None
    files: dict[str, bytes]  # every bundle file, manifest.json included
    evidence_id: str | None
    summary: Summary | None
    cells_done: int = 0
    cells_total: int = 0
    stopped: bool = False
    workdir: Path | None = None
    build_logs: dict[str, bytes] = field(default_factory=dict)
    # The spec as run: the job's, with a history's range or a bisection's good..bad resolved
    # to commits on this host (resolve_on_host).
    spec: JobSpec | None = None


def resolve_on_host(
    spec: JobSpec, repositories: Mapping[str, RepositoryConfig], *, state_dir: Path
) -> JobSpec:
    """The spec with a history's range or a bisection's good..bad resolved to commits in this
    host's mirror (evidence/spec/resolution.py), or the spec itself when it names its commits.
    The refs were validated by JobSpec and go to git after `--end-of-options`."""
    if not spec.needs_host_resolution:
        return spec
    repository = repositories.get(spec.repository or "")
    if repository is None or repository.url is None:
        raise RunRefused(f"repository {spec.repository!r} is not on this host's allow-list")
    try:
        if spec.history is not None:
            reference, listed = history_commits(
                repository,
                spec.history.range,
                state_dir=state_dir,
                every=spec.history.every,
                last=spec.history.last,
                limit=spec.history.max_commits or MAX_HISTORY_COMMITS,
            )
            return history_spec(spec, reference, [sha for sha, _subject in listed])
        if spec.commits is not None:
            line = commit_line(
                repository,
                spec.commits.base,
                spec.commits.head,
                state_dir=state_dir,
                limit=spec.commits.max_commits or MAX_PR_COMMITS,
            )
            return commits_spec(spec, line)
        assert spec.bisect is not None  # needs_host_resolution: mode history, bisect or commits
        reference, listed = history_commits(
            repository,
            f"{spec.bisect.good}..{spec.bisect.bad}",
            state_dir=state_dir,
            limit=MAX_BISECT_LINE - 1,
            narrower="name a good commit closer to the bad one",
        )
    except CheckoutError as error:
        raise RunRefused(str(error)) from None
    return step_spec(spec, [reference, *(sha for sha, _subject in listed)], [])


def check_job(
    spec: JobSpec,
    repositories: Mapping[str, RepositoryConfig],
    corpora: Mapping[str, Path] | None = None,
    *,
    variants: Sequence[VariantSpec] | None = None,
) -> None:
    """Refuse what this host must never run, before anything is cloned or built. `variants`:
    the spec's expansion (evidence/contract/variant.py), where the caller has made it already."""
    if spec.corpus != BUILTIN_CORPUS and spec.corpus not in (corpora or {}):
        raise RunRefused(
            f"corpus {spec.corpus!r} is not on this host (worker.toml [corpora] names: "
            f"{', '.join(sorted(corpora or {})) or 'none'})"
        )
    if spec.corpus != BUILTIN_CORPUS and not Path((corpora or {})[spec.corpus]).is_file():
        raise RunRefused(f"corpus {spec.corpus!r}: its file on this host is gone")
    if not spec.repository:
        return  # the engine installed beside this worker (JobSpec: only its adapter needs none)
    repository = repositories.get(spec.repository or "")
    if repository is None:
        raise RunRefused(f"repository {spec.repository!r} is not on this host's allow-list")
    if spec.adapter != repository.adapter:
        raise RunRefused(
            f"repository {repository.name} is driven through the {repository.adapter} adapter "
            f"on this host, not {spec.adapter}"
        )
    for variant in expand_variants(spec) if variants is None else variants:
        if starts_server(repository.adapter):
            try:
                validate_option_values(repository.options, variant.flags)
            except OptionError as error:
                raise RunRefused(f"variant {variant.name}: {error}") from None
        if repository.url is None:
            if variant.ref is not None or variant.recipe is not None:
                raise RunRefused(
                    f"variant {variant.name}: the installed server has no refs or recipes "
                    "(give --repo to build commits)"
                )
            continue
        if variant.ref is None:
            raise RunRefused(f"variant {variant.name} names no ref of {repository.name}")
        try:
            check_ref(variant.ref)
        except CheckoutError as error:
            raise RunRefused(str(error)) from None
        recipe_for(repository, variant)


def recipe_for(repository: RepositoryConfig, variant: VariantSpec) -> Recipe:
    name = variant.recipe or repository.default_recipe
    if name is not None:
        recipe = repository.recipes.get(name)
        if recipe is None:
            raise RunRefused(
                f"recipe {name!r} is not defined for {repository.name} on this host "
                f"(defined: {', '.join(sorted(repository.recipes)) or 'none'})"
            )
        return recipe
    if len(repository.recipes) == 1:
        return next(iter(repository.recipes.values()))
    if "default" in repository.recipes:
        return repository.recipes["default"]
    raise RunRefused(
        f"variant {variant.name}: name a recipe of {repository.name} "
        f"({', '.join(sorted(repository.recipes))})"
    )


def _plan(
    spec: JobSpec,
    variant: VariantSpec,
    *,
    run_id: str,
    model: Path,
    adapter: str,
    corpora: Mapping[str, Path] | None = None,
) -> Plan:
    corpus = None
    if spec.corpus != BUILTIN_CORPUS:
        # the host's own file for the corpus the job named (check_job: it exists here); only
        # then, so an engine from before corpora (an embedded ref) still reads the plan
        corpus = (spec.corpus, str((corpora or {})[spec.corpus]))
    return Plan(
        run_id=run_id,
        variant=variant.name,
        adapter=adapter,
        model=str(model),
        flags=dict(variant.flags),
        decode_tokens=spec.decode_tokens,
        seed=spec.seed,
        warmup_contexts=list(spec.contexts),
        corpus=corpus[0] if corpus else None,
        corpus_path=corpus[1] if corpus else None,
    )


def _server_plan(plan: Plan, repository: RepositoryConfig, variant: VariantSpec) -> Plan:
    """`plan` with the host's server command, the variant's options resolved against the
    host's declarations (checked in check_job), the wipe paths and the first-token bound."""
    options = resolved_options(repository.options, variant.flags)
    return dataclasses.replace(
        plan,
        server_command=list(repository.server_command or ()),
        server_options=options,
        flags={name: option["value"] for name, option in options.items()},
        wipe=list(repository.wipe),
        first_token_timeout_s=repository.first_token_timeout_s,
    )


def prepare_variants(
    spec: JobSpec,
    variants: Sequence[VariantSpec],
    *,
    run_id: str,
    model: Path,
    repositories: Mapping[str, RepositoryConfig],
    state_dir: Path,
    workdir: Path,
    on_phase: Callable[[str], None] | None = None,
    corpora: Mapping[str, Path] | None = None,
) -> tuple[list[PreparedVariant], dict[str, bytes], str | None]:
    """(variants, build logs by file name, failure reason or None) for the spec's `variants`
    (its expansion), checked by `check_job`. Builds before any timing."""
    prepared: list[PreparedVariant] = []
    logs: dict[str, bytes] = {}
    if not spec.repository:  # the engine installed beside this worker (JobSpec's adapter rule)
        for variant in variants:
            plan = _plan(
                spec, variant, run_id=run_id, model=model, adapter=spec.adapter, corpora=corpora
            )
            launch = VariantLaunch(name=variant.name, python=sys.executable, plan=plan)
            prepared.append(PreparedVariant(variant, launch, spec.adapter))
        return prepared, logs, None

    repository = repositories[spec.repository or ""]
    if repository.url is None:
        # The installed server of `coldbench run --adapter openai-server`: nothing to build.
        for variant in variants:
            plan = _plan(spec, variant, run_id=run_id, model=model, adapter=repository.adapter)
            plan = _server_plan(plan, repository, variant)
            launch = VariantLaunch(name=variant.name, python=sys.executable, plan=plan)
            prepared.append(PreparedVariant(variant, launch, repository.adapter))
        return prepared, logs, None
    plans = (
        {plan.name: plan for plan in spec.commits.planned()}
        if spec.commits is not None and spec.commits.line is not None
        else {}
    )
    # Checkouts one at a time (they share the repository's mirror), then every distinct
    # (commit, recipe) built at once: builds are independent processes, nothing is timed yet.
    to_build: list[tuple[VariantSpec, Checkout, Recipe, SynthesizedTree | None]] = []
    failure: str | None = None
    for variant in variants:
        assert variant.ref is not None  # check_job
        recipe = recipe_for(repository, variant)
        plan = plans.get(variant.name)
        synthesized = _tree_plan(repository, plan, state_dir=state_dir)
        if on_phase:
            on_phase(f"checkout {repository.name}@{variant.ref}" + _change_text(plan))
        try:
            if plan is not None and synthesized is not None:
                assert plan.change is not None and plan.commit is not None
                checkout, tree = synthesize(
                    repository,
                    onto=plan.onto,
                    commit=plan.commit,
                    change=plan.change,
                    state_dir=state_dir,
                )
                synthesized = synthesized.model_copy(update={"tree": tree})
            else:
                checkout = prepare(repository, variant.ref, state_dir=state_dir)
        except CheckoutError as error:
            if may_skip(spec, variant.name):
                if isinstance(error, NotSeparable) and synthesized is not None:
                    synthesized = synthesized.model_copy(update={"conflicts": error.conflicts})
                # never started: the plan is the variant's, for what the run reports of it
                unstarted = _plan(
                    spec, variant, run_id=run_id, model=model, adapter=repository.adapter
                )
                launch = VariantLaunch(name=variant.name, python=sys.executable, plan=unstarted)
                prepared.append(
                    PreparedVariant(
                        variant,
                        launch,
                        repository.adapter,
                        skipped=str(error),
                        synthesized=synthesized,
                    )
                )
                continue
            failure = f"variant {variant.name}: {error}"
            break
        to_build.append((variant, checkout, recipe, synthesized))

    builds = _build_all(
        repository,
        [
            (checkout, recipe, f"build-{variant.name}.log")
            for variant, checkout, recipe, _ in to_build
        ],
        state_dir=state_dir,
        workdir=workdir,
        on_phase=on_phase,
    )
    order = {variant.name: index for index, variant in enumerate(variants)}
    for variant, checkout, recipe, synthesized in to_build:
        result = builds[(checkout.commit, recipe.name)]
        logs[f"build-{variant.name}.log"] = Path(result.log_path).read_bytes()
        launch_plan = _plan(
            spec, variant, run_id=run_id, model=model, adapter=repository.adapter, corpora=corpora
        )
        launch_plan = dataclasses.replace(launch_plan, checkout=str(checkout.path))
        if starts_server(repository.adapter):
            launch_plan = _server_plan(launch_plan, repository, variant)
        embedded = runs_checkout_engine(repository.adapter)
        launch = VariantLaunch(
            name=variant.name,
            python=result.python,
            plan=launch_plan,
            # an embedded repository's variant runs its worktree's engine/, not ours, under the
            # name of the tree's layout (`engine.runner` in a tree from before the move)
            pythonpath_first=str(checkout.path) if embedded else None,
            module=engine_layout(checkout.path).runner if embedded else RUNNER,
        )
        if not result.ok and may_skip(spec, variant.name):
            skipped = f"did not build: {result.reason}"
            if synthesized is not None:
                tail = log_tail(Path(result.log_path).read_bytes())
                synthesized = synthesized.model_copy(update={"failure_tail": tail})
            prepared.append(
                PreparedVariant(
                    variant, launch, repository.adapter, checkout, result, skipped, synthesized
                )
            )
            continue
        prepared.append(
            PreparedVariant(
                variant, launch, repository.adapter, checkout, result, synthesized=synthesized
            )
        )
        if not result.ok:
            # as if built one at a time: nothing after the first variant that cannot run
            failure = f"variant {variant.name}: {result.reason}"
            prepared = [p for p in prepared if order[p.spec.name] <= order[variant.name]]
            break
    prepared.sort(key=lambda p: order[p.spec.name])
    if failure:
        return prepared, logs, failure
    if spec.mode == "history" and all(p.skipped for p in prepared[1:]):
        return prepared, logs, "no commit of the history built besides the reference"
    return prepared, logs, None


def _build_all(
    repository: RepositoryConfig,
    wanted: Sequence[tuple[Checkout, Recipe, str]],
    *,
    state_dir: Path,
    workdir: Path,
    on_phase: Callable[[str], None] | None,
) -> dict[tuple[str, str], Build]:
    """Each distinct (commit, recipe) of `wanted` (checkout, recipe, log name) built once, up to
    one build per core at a time: a build is a venv, an install and an import check, each its
    own process, and a run of a pull request's commits builds one tree per commit."""
    first: dict[tuple[str, str], tuple[Checkout, Recipe, str]] = {}
    for checkout, recipe, log_name in wanted:
        first.setdefault((checkout.commit, recipe.name), (checkout, recipe, log_name))
    if not first:
        return {}
    if on_phase:
        commits = ", ".join(f"{commit[:12]} ({recipe})" for commit, recipe in first)
        on_phase(f"build {repository.name}@{commits}")

    def one(item: tuple[Checkout, Recipe, str]) -> Build:
        checkout, recipe, log_name = item
        return build(
            repository,
            checkout,
            recipe,
            state_dir=state_dir,
            log_path=workdir / "builds" / log_name,
        )

    workers = max(1, min(len(first), os.cpu_count() or 1, MAX_PARALLEL_BUILDS))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="build") as pool:
        return dict(zip(first, pool.map(one, first.values()), strict=True))


def may_skip(spec: JobSpec, variant: str) -> bool:
    """In a history, a commit that cannot check out, build or load is a result to record, not
    the end of the run; the reference commit must run (every point is measured against it). In
    a commits job, a tree made from base and head (head without one commit, base with only one)
    that cannot be made, build or load is not separable; base and head must run."""
    if spec.mode == "commits":
        if spec.commits is None or spec.commits.line is None:
            return False
        return any(
            plan.name == variant and plan.change is not None for plan in spec.commits.planned()
        )
    return spec.mode == "history" and variant != baseline_name(spec)


def _tree_plan(
    repository: RepositoryConfig, plan: CommitTreePlan | None, *, state_dir: Path
) -> SynthesizedTree | None:
    """What a commits job's variant will be made of (its tree comes later), or None for a
    variant that is a commit of the repository as it is (base, head, any other mode)."""
    if plan is None or plan.change is None or plan.commit is None:
        return None
    mirror = mirror_path(repository, state_dir=state_dir)
    return SynthesizedTree(
        change=plan.change,
        onto=plan.onto,
        commit=plan.commit,
        subject=commit_subject_of(mirror, plan.commit),
    )


def _change_text(plan: CommitTreePlan | None) -> str:
    if plan is None or plan.change is None or plan.commit is None:
        return ""
    return f" with {plan.commit[:12]} {'reverted' if plan.change == 'revert' else 'picked'}"


def log_tail(data: bytes, *, lines: int = 40, limit: int = 3000) -> str:
    """The last lines of a build log or a process's output, where a failure explains itself:
    any character a `Paragraph` may not hold (a progress bar's backspace, NUL) as a space."""
    text = data[-limit * 2 :].decode("utf-8", "replace")
    kept = [
        "".join(char if char == "\t" or char.isprintable() else " " for char in line).rstrip()
        for line in text.splitlines()
        if line.strip()
    ][-lines:]
    return "\n".join(kept)[-limit:]


def _stderr_tail(workdir: Path, variant: str, fallback: str) -> str:
    """The end of the last stderr log of a variant's processes (why it did not load)."""
    logs = sorted((workdir / "logs").glob(f"{variant}.*.stderr.log"))
    return log_tail(logs[-1].read_bytes() if logs else fallback.encode())


def _imported_elsewhere(variant: PreparedVariant, target: Mapping[str, Any] | None) -> str | None:
    """The variant process's own report of what it imported, checked against its checkout:
    the engine module (an embedded one must report it), and the fast-path package where
    reported (`kernels`; `fastpaths` from a tree before the move, `kernels` again before that
    package's rename; commits older than that report were checked by the build, in the same
    environment)."""
    assert variant.checkout is not None
    embedded = runs_checkout_engine(variant.adapter)
    software = (target or {}).get("software") or {}
    reported = software.get("files") or {}
    files: dict[str, str | None] = {"the engine module": module_file_of(target)}
    if embedded:
        for package in FAST_PATH_PACKAGES:
            files[package] = reported.get(package)
    for module, module_file in files.items():
        if module_file or (embedded and module == "the engine module"):
            problem = install_path_problem(module_file, module, variant.checkout.path)
            if problem:
                return f"variant {variant.spec.name}: {problem}"
    return None


def until_decided(spec: JobSpec) -> Callable[[int, Sequence[dict[str, Any]]], str | None]:
    """The check a run measuring until decided makes after each complete round: at a look
    (coldbench.evidence.analysis.stats `Looks`), the prefill verdicts by the rule summary.json
    states; it ends the run when every one is decided (a bisection step: when the step is,
    `look_decided`), or when the job's time budget is spent."""
    looks = job_looks(spec)
    began = time.monotonic()

    def check(rounds_done: int, raw: Sequence[dict[str, Any]]) -> str | None:
        if rounds_done not in looks.rounds:
            return None
        look = looks.rounds.index(rounds_done) + 1
        if spec.budget_minutes is not None and time.monotonic() - began >= 60 * spec.budget_minutes:
            return f"the time budget of {spec.budget_minutes:g} minutes was spent at look {look}"
        records = []
        for value in raw:
            try:
                records.append(Record.model_validate(value))
            except ValueError:
                continue  # a record the bundle will refuse; it decides nothing
        _, comparisons = prefill_verdicts_at_look(records, spec=spec)
        decided = look_decided(spec, comparisons)
        return f"{decided} at look {look} ({rounds_done} rounds)" if decided else None

    return check


def default_prespawn(host: HostInfo) -> bool:
    """Start the next block's processes while a block loads and warms up on a GPU (Metal,
    CUDA): their imports overlap the start's untimed phases, and the first timed cell waits for
    the rest (worker/variants.py; interpreters importing beside a timed cell slowed it 1.7-1.8x
    on the H200). Not on the CPU backend, where a GPU block's seconds of load and warm-ups are
    a tiny model's fraction of a second, so the imports would mostly be waited for anyway
    (docs/PERFORMANCE.md, "Time to evidence")."""
    return host.backend in ("cuda", "metal")


def process_blocks(
    spec: JobSpec, *, variants: int, noise: HostNoise | None, in_turns: bool = False
) -> tuple[int | None, str]:
    """The run's rounds per process (None: a process per cell) and why: the job's own, else
    what this host's calibration makes cheapest
    (coldbench.evidence.contract.calibration.block_length, with a block start priced at a load per
    variant where the variants run `in_turns`), else the conservative default for a host without
    one."""
    if spec.fresh_process:
        return None, "a fresh process for every cell (fresh_process)"
    if spec.rounds_per_process is not None:
        asked = spec.rounds_per_process
        return asked, f"{asked} round{'s' if asked != 1 else ''} per process, as asked"
    if spec.until == "decided":
        length = effective_rounds_per_process(spec) or 1
        return length, (
            f"{length} round{'s' if length != 1 else ''} per process: measuring until decided, "
            "each look a whole number of process blocks"
        )
    if noise is not None:
        return block_length(
            spec.rounds, contexts=spec.contexts, variants=variants, noise=noise, in_turns=in_turns
        )
    length = effective_rounds_per_process(spec)
    return length, (
        f"{length} round{'s' if length != 1 else ''} per process: rounds // "
        f"{MIN_PROCESS_BLOCKS}, at least 1 (no host calibration: at least "
        f"{MIN_PROCESS_BLOCKS} process pairs, or a fresh process every round below "
        f"{2 * MIN_PROCESS_BLOCKS} rounds)"
    )


PLAN_TIMEOUT_S = 120.0


def memory_plan(
    launches: Sequence[VariantLaunch], *, model: Path, contexts: Sequence[int], asked: str
) -> MemoryPlan:
    """coldbench.engine.memory's plan for these variants, from the guard's estimates, computed in a
    process of its own (`python -m coldbench.engine.memory`: this process never touches the device).
    A plan that cannot be made (an unreadable checkpoint) is side by side, as before plans:
    the variant processes then refuse what they cannot load, with their own reasons."""
    if asked not in ("auto", *RESIDENCIES):
        raise RunRefused(f"residency {asked!r}: give auto, side-by-side or in-turns")
    request = {
        "model": str(model),
        "variants": {launch.name: dict(launch.plan.flags) for launch in launches},
        "contexts": list(contexts),
        "residency": asked,
    }
    fallback = SIDE_BY_SIDE if asked == "auto" else asked
    try:
        done = subprocess.run(
            [sys.executable, "-m", "coldbench.engine.memory"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PLAN_TIMEOUT_S,
            env=child_env(),
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-300:]}
        if "error" in answer:
            return MemoryPlan(fallback, f"no memory plan ({answer['error']})", {})
        return MemoryPlan.from_json(answer)
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError) as error:
        return MemoryPlan(fallback, f"no memory plan ({error})", {})


def _records_bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def server_logs(workdir: Path, *, limit: int = SERVER_LOG_BYTES) -> dict[str, bytes]:
    """Each server's log of this run (one per variant process), its last `limit` bytes."""
    logs: dict[str, bytes] = {}
    for path in sorted((workdir / "spool").glob("*.server.log")):
        data = path.read_bytes()
        if len(data) > limit:
            cut = data[-limit:]
            # Start at a line: a reader should not meet half a line first.
            cut = cut[cut.find(b"\n") + 1 :] if b"\n" in cut else cut
            data = f"[first {len(data) - len(cut)} bytes cut]\n".encode() + cut
        logs["server-" + path.name.removesuffix(".server.log") + ".log"] = data
    return logs


def execute_run(
    spec: JobSpec,
    *,
    run_id: str,
    workdir: Path,
    state_dir: Path,
    host: HostInfo,
    labels: Sequence[str] = (),
    repositories: Mapping[str, RepositoryConfig] | None = None,
    models: Mapping[str, Path] | None = None,
    corpora: Mapping[str, Path] | None = None,
    command: str | None = None,
    local_arguments: Mapping[str, str] | None = None,
    cell_timeout_s: float = CELL_TIMEOUT_S,
    on_progress: Callable[[Progress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    prespawn: bool | None = None,
    noise: HostNoise | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> RunOutcome:
    """Run a job's plan on this host and return the bundle's files. Raises `RunRefused`.

    `command` is the provenance's reproduce line; by default the `coldbench run` line of the
    spec at the commits measured (`reproduce_command`, with `local_arguments`). `prespawn`
    starts each block's processes while the previous block warms up (None: this host's backend
    decides, `default_prespawn`). `noise` is this host's calibration: the block length follows
    it when the job does not set one, and the provenance carries it to the statistics.
    The spec's `residency` (auto, side-by-side, in-turns): whether the variants' processes are
    resident together or in turns; auto follows the memory plan made before any timing
    (`memory_plan`).
    A run stopped by `should_stop` or failed by a variant still returns the bundle of what was
    measured. `extra_files` join the bundle (`coldbench reproduce`: reproduces.json)."""
    from coldbench.engine.checkpoints import resolve_model
    from coldbench.evidence.bundles.bundle import MANIFEST_FILE, build_run_bundle, evidence_id_of

    repositories = dict(repositories or {})
    corpora = dict(corpora or {})
    if spec.needs_host_resolution and on_phase:
        on_phase(f"resolve {spec.repository} commits")
    spec = resolve_on_host(spec, repositories, state_dir=state_dir)
    # The variants the job really runs (an ablation's expansion), made once for the whole run.
    variants = expand_variants(spec)
    check_job(spec, repositories, corpora, variants=variants)
    source = repositories.get(spec.repository or "")
    if source is not None and source.url is not None:
        refs = [variant.ref for variant in variants if variant.ref]
        refusal = uncommitted_work_refusal(source.url, refs)
        if refusal:
            raise RunRefused(refusal)
    workdir.mkdir(parents=True, exist_ok=True)
    if on_phase:
        on_phase(f"model {spec.model}")
    try:
        model = resolve_model(spec.model, {k: str(v) for k, v in (models or {}).items()})
    except ValueError as error:
        raise RunRefused(str(error).splitlines()[0]) from None
    prepared, build_logs, failure = prepare_variants(
        spec,
        variants,
        run_id=run_id,
        model=model,
        repositories=repositories,
        state_dir=state_dir,
        workdir=workdir,
        on_phase=on_phase,
        corpora=corpora,
    )
    baseline = baseline_name(spec)
    outcome: ScheduleOutcome | None = None
    if failure is None:
        measured = {p.spec.name for p in prepared if not p.skipped}
        rounds = plan_rounds(
            [v.name for v in variants if v.name in measured],
            spec.contexts,
            seed=spec.seed,
            rounds=spec.rounds,
            baseline=baseline,
        )
        if on_phase:
            on_phase("rounds")
        launches = [p.launch for p in prepared if not p.skipped]
        plan = memory_plan(launches, model=model, contexts=spec.contexts, asked=spec.residency)
        # the blocks' length prices the starts this run will pay: in turns, one per variant
        rounds_per_process, rule = process_blocks(
            spec,
            variants=len(measured),
            noise=noise,
            in_turns=plan.residency == IN_TURNS and not spec.fresh_process,
        )
        if on_phase and plan.residency == IN_TURNS and not spec.fresh_process:
            on_phase(f"variants run {plan.reason}")
        try:
            outcome = run_schedule(
                launches,
                rounds,
                workdir=workdir,
                cell_timeout_s=cell_timeout_s,
                fresh_process=spec.fresh_process,
                rounds_per_process=rounds_per_process,
                seed=spec.seed,
                on_progress=on_progress,
                should_stop=should_stop,
                prespawn=default_prespawn(host) if prespawn is None else prespawn,
                block_rule=rule,
                run_id=run_id,
                # a history commit, or a tree a commits job made, that cannot load is a result,
                # like one that cannot build
                droppable=[p.spec.name for p in prepared if may_skip(spec, p.spec.name)],
                end_after_round=until_decided(spec) if spec.until == "decided" else None,
                residency=plan.residency,
                residency_reason=plan.reason,
                baseline=baseline,
            )
        except VariantError as error:
            failure = str(error)
            outcome = error.outcome
        for p in prepared:
            if outcome is not None and p.spec.name in outcome.dropped:
                why = outcome.dropped[p.spec.name]
                p.skipped = f"did not load: {why}"
                if p.synthesized is not None:
                    tail = _stderr_tail(workdir, p.spec.name, why)
                    p.synthesized = p.synthesized.model_copy(update={"failure_tail": tail})
        if failure is None and spec.mode == "history" and all(p.skipped for p in prepared[1:]):
            failure = "no commit of the history built and loaded besides the reference"
    ready = outcome.targets if outcome else {}
    for p in prepared:
        if failure is None and p.checkout is not None and not p.skipped:
            failure = _imported_elsewhere(p, ready.get(p.spec.name))
    targets = []
    for p in prepared:
        target = target_info(
            p.spec,
            adapter=p.adapter,
            ready_target=ready.get(p.spec.name),
            checkout=p.checkout,
            build=p.build,
        )
        target.skipped = p.skipped
        target.synthesized = p.synthesized
        if p.skipped and target.ref is None:
            target.ref = p.spec.ref
        if (
            p.checkout is not None
            and p.synthesized is None
            and spec.mode in ("history", "bisect", "commits")
        ):
            target.subject = commit_subject(p.checkout)
        targets.append(target)
    if not targets:
        targets = [target_info(v, adapter=spec.adapter, ready_target=None) for v in variants]
    repository = repositories.get(spec.repository or "")
    provenance = run_provenance(
        run_id=run_id,
        host=host,
        software=software_info(),
        targets=targets,
        model=model_info(spec.model, model),
        spec=spec,
        command=command
        or reproduce_command(
            spec,
            repository=repository,
            commits={t.variant: t.commit for t in targets if t.commit},
            local_arguments=local_arguments,
        ),
        labels=labels,
        corpus=corpus_info(spec.corpus, corpora.get(spec.corpus)),
        noise=noise,
        # measured (on a CPU) after the last variant process is gone
        peak=device_peak(host) if outcome is not None else None,
    )
    stopped = bool(outcome and outcome.stopped)
    if failure is None and stopped:
        failure = f"stopped after {outcome.cells_done} of {outcome.cells_total} cells"
    bundle_extras = {**server_logs(workdir), **(extra_files or {})}
    if failure:
        bundle_extras["reason.txt"] = (failure + "\n").encode()
    controls = _records_bytes(workdir / CONTROLS_FILE)
    if controls:
        # The bracketing controls' own file, when the rounds were long enough to have them.
        bundle_extras[CONTROLS_FILE] = controls
    files, summary = build_run_bundle(
        records=_records_bytes(workdir / RECORDS_FILE),
        provenances=[provenance],
        spec=spec,
        build_logs=build_logs,
        extra_files=bundle_extras,
        timeline=outcome.timeline if outcome else None,
    )
    return RunOutcome(
        run_id=run_id,
        status="failed" if failure else "succeeded",
        reason=failure,
        files=files,
        evidence_id=evidence_id_of(files[MANIFEST_FILE]),
        summary=summary,
        cells_done=outcome.cells_done if outcome else 0,
        cells_total=outcome.cells_total if outcome else 0,
        stopped=stopped,
        workdir=workdir,
        build_logs=dict(build_logs),
        spec=spec,
    )


def refused_files(raw_spec: Any, *, run_id: str, host: HostInfo, reason: str) -> dict[str, bytes]:
    """The bundle of a run that never measured (refused or crashed): no records, provenance
    saying who refused what and why, so the server and the submitter can see it."""
    from coldbench.evidence.bundles.bundle import bundle_files
    from coldbench.evidence.contract.schemas import ModelInfo, TargetInfo

    targets: list[TargetInfo] = []
    model = ModelInfo()
    spec: JobSpec | None = None
    with contextlib.suppress(ValueError):
        spec = JobSpec.model_validate(raw_spec)
    if spec is not None:
        model = ModelInfo(name=spec.model)
        try:
            targets = [
                TargetInfo(
                    variant=v.name,
                    adapter=spec.adapter,
                    repository=spec.repository,
                    ref=v.ref,
                    recipe=v.recipe,
                    flags=dict(v.flags),
                )
                for v in expand_variants(spec)
            ]
        except ValueError:
            targets = []
    provenance = run_provenance(
        run_id=run_id,
        host=host,
        software=software_info(),
        targets=targets,
        model=model,
        spec=spec,
        command=reproduce_command(spec) if spec is not None else "",
    )
    return bundle_files(
        records=b"",
        provenances=[provenance],
        spec=spec,
        extra_files={"reason.txt": (reason + "\n").encode()},
    )
