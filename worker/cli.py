"""`coldbench run` (the whole matrix on this machine, no server), `coldbench reproduce` (a
bundle's job again, from the bundle alone), `coldbench calibrate` and `coldbench worker`.

`run` goes options -> spec (`_local_setup`: this machine's repository, model and corpus, then
the one builder, evidence/job_options.py) -> measuring (`_measure`, or `_bisect` for its steps)
-> output (`_print_outcome`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from coldbench.evidence.job_options import local_options, with_job_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coldbench.evidence.schemas import HostNoise, JobSpec
    from coldbench.evidence.summary_schema import Comparison
    from coldbench.worker.config import RepositoryConfig
    from coldbench.worker.run import RunOutcome

app = typer.Typer(add_completion=False)


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _fail_all(lines: Sequence[str], code: int = 2) -> NoReturn:
    """Every problem found, one line each; the last line says how many."""
    for line in lines:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def local_corpus(option: str) -> tuple[str, Path]:
    """`--corpus NAME=FILE` or `--corpus FILE` -> (name, resolved file); ValueError."""
    from coldbench.evidence.schemas import BUILTIN_CORPUS, CORPUS_NAME_PATTERN

    name, sep, file = option.partition("=")
    if not sep:
        file = option
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(option).stem).strip("-.")[:56] or "corpus"
    path = Path(file).expanduser().resolve()
    if not re.fullmatch(CORPUS_NAME_PATTERN, name) or name == BUILTIN_CORPUS:
        raise ValueError(
            f"--corpus {option}: {name!r} is not a corpus name (letters, digits, _ . -)"
        )
    if not path.is_file():
        raise ValueError(f"--corpus {option}: {path} is not a file")
    return name, path


def local_model(model: str) -> tuple[str, dict[str, Path]]:
    """(the job's model name, this run's model table) for `--model DIR` or `preset:NAME`;
    ValueError for a folder that is no checkpoint."""
    if model.startswith("preset:"):
        return model, {}
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"--model {model}: not a checkpoint folder (no config.json) and not preset:NAME"
        )
    # Jobs name models; a folder becomes a name of this run's own model table.
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", path.resolve().name).strip("-.") or "model"
    return name, {name: path.resolve()}


@dataclass
class LocalSetup:
    """What `coldbench run` measures: the spec and this machine's side of it."""

    spec: JobSpec
    repositories: dict[str, RepositoryConfig] = field(default_factory=dict)
    models: dict[str, Path] = field(default_factory=dict)
    corpora: dict[str, Path] = field(default_factory=dict)
    model_argument: str | None = None  # `--model` as given, where it is a folder
    corpus_argument: str | None = None


@dataclass
class ServerOptions:
    """`coldbench run --adapter openai-server`: the server as worker.toml would declare it."""

    command: str | None = None
    options: list[str] = field(default_factory=list)
    wipe: list[str] = field(default_factory=list)
    first_token_timeout_s: float | None = None

    def given(self) -> list[str]:
        return [
            flag
            for flag, value in (
                ("--server-command", self.command),
                ("--option", self.options),
                ("--wipe", self.wipe),
                ("--first-token-timeout-s", self.first_token_timeout_s),
            )
            if value
        ]


def _local_repository(
    adapter: str | None,
    repo: Path | None,
    module: str | None,
    server: ServerOptions,
    problems: list[str],
) -> RepositoryConfig | None:
    """The repository `--repo` (or `--server-command`) names on this machine, or None."""
    from coldbench.worker.config import ConfigError, local_repository, server_repository

    if adapter == "openai-server" and server.command is None:
        problems.append("--adapter openai-server needs --server-command (with {port})")
        return None
    if adapter != "openai-server" and server.given():
        problems.append(f"{', '.join(server.given())}: only with --adapter openai-server")
    try:
        if adapter == "openai-server":
            return server_repository(
                server_command=server.command or "",
                options=server.options,
                wipe=server.wipe,
                first_token_timeout_s=server.first_token_timeout_s,
                repo=repo,
                module=module,
            )
        if repo is not None and adapter in (None, "embedded", "mlx-lm"):
            return local_repository(repo, module=module, adapter=adapter or "mlx-lm")
    except ConfigError as error:
        problems.append(str(error))
    return None


def _pinned_commits(
    repository: RepositoryConfig, commits: str, state_dir: Path, problems: list[str]
) -> list[str] | None:
    """`--commits REF,REF,...` as the commits they name in the repository's mirror."""
    from coldbench.worker.checkout import CheckoutError, resolve_ref, update_mirror

    try:
        mirror = update_mirror(repository, state_dir=state_dir)
        return [resolve_ref(mirror, ref) for ref in commits.split(",") if ref.strip()]
    except CheckoutError as error:
        problems.append(f"--commits: {error}")
        return None


def _local_setup(
    given: dict[str, Any],
    *,
    repo: Path | None,
    module: str | None,
    server: ServerOptions,
    state_dir: Path,
) -> LocalSetup:
    """Options -> spec: this machine's model, corpus and repository, then the one builder.
    `given`'s model and corpus are this machine's (a folder, a file) or names.
    Exits with every problem found, one line each."""
    from coldbench.evidence.job_options import JobOptionsError, build_job_spec, problem_lines
    from coldbench.evidence.schemas import INSTALLED_SERVER

    problems: list[str] = []
    # What the builder gets for them is named below, where they are this machine's.
    model, corpus = given.pop("model", None), given.pop("corpus", None)
    setup_models: dict[str, Path] = {}
    model_argument = None
    if model is not None:
        try:
            given["model"], setup_models = local_model(model)
            model_argument = model if setup_models else None
        except ValueError as error:
            problems.append(str(error))
    corpora: dict[str, Path] = {}
    if corpus is not None:
        try:
            given["corpus"], corpus_file = local_corpus(corpus)
            corpora[given["corpus"]] = corpus_file
        except ValueError as error:
            problems.append(str(error))
    adapter = given.get("adapter")
    repository = _local_repository(adapter, repo, module, server, problems)
    repositories = {repository.name: repository} if repository is not None else {}
    if repository is not None:
        given["repository"] = repository.name
    elif adapter == "openai-server":
        given["repository"] = INSTALLED_SERVER  # what is missing is said above
    elif repo is not None:
        given["repository"] = repo.name  # the problem with it is said above
    if given.get("commits") and given.get("mode") == "history" and repository is not None:
        pinned = _pinned_commits(repository, given["commits"], state_dir, problems)
        given["commits"] = ",".join(pinned) if pinned is not None else None
    try:
        spec = build_job_spec(given)
    except JobOptionsError as error:
        problems += problem_lines(error)
    if problems:
        _fail_all(problems)
    return LocalSetup(
        spec=spec,
        repositories=repositories,
        models=setup_models,
        corpora=corpora,
        model_argument=model_argument,
        corpus_argument=corpus,
    )


def _bisect(
    setup: LocalSetup, *, out: Path | None, state_dir: Path, cell_timeout_s: float, console: Any
) -> None:
    """Halve good..bad by paired lo/mid/hi steps, each its own run and bundle under `out`
    (step-01, step-02, ...); the last step's evidence names the result. The steps, decisions
    and halving are evidence/bisect.py's, as the service's (api/jobs/bisect.py)."""
    from coldbench.evidence.bisect import bisect_sentences, next_line, step_spec
    from coldbench.evidence.bundle import write_folder, zip_bytes
    from coldbench.evidence.history import plural
    from coldbench.evidence.schemas import BisectStep
    from coldbench.worker.fingerprint import host_fingerprint, host_labels
    from coldbench.worker.run import RunRefused, execute_run

    spec = setup.spec
    started = datetime.now(UTC)
    out = out or Path(f"bisect-{started:%Y%m%dT%H%M%S}")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out}: folder exists and is not empty; choose a new one")
    host = host_fingerprint()
    steps: list[BisectStep] = []
    while True:
        name = f"step-{len(steps) + 1:02d}"
        run_id = f"local-{datetime.now(UTC):%Y%m%dT%H%M%S}-{name}"
        try:
            outcome = execute_run(
                spec,
                run_id=run_id,
                workdir=state_dir / "runs" / run_id,
                state_dir=state_dir,
                host=host,
                labels=host_labels(host, []),
                repositories=setup.repositories,
                models=setup.models,
                corpora=setup.corpora,
                command=None,
                cell_timeout_s=cell_timeout_s,
            )
        except RunRefused as error:
            _fail(str(error))
        folder = write_folder(out / name, outcome.files)
        folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
        if outcome.status != "succeeded" or not outcome.summary or outcome.spec is None:
            _fail(f"{name} failed: {outcome.reason} (bundle {folder})", code=1)
        ran = outcome.spec.bisect
        assert ran is not None and ran.line is not None  # resolved by execute_run
        lo, mid, hi = ran.step_commits()
        console.print(
            f"{name}: {lo[:10]} .. {mid[:10] + ' .. ' if mid else ''}{hi[:10]} "
            f"({plural(len(ran.line) - 1, 'commit')} apart)"
        )
        section = outcome.summary.bisect
        if section is None:
            _fail(f"{name}'s summary has no bisect section (bundle {folder})", code=1)
        console.print(f"  {section.decision}: {section.why}")
        steps.append(
            BisectStep(
                lo=lo,
                mid=mid,
                hi=hi,
                decision=section.decision,
                evidence_id=outcome.evidence_id or "0" * 24,
                location=f"../{name}/report.html",
            )
        )
        line = next_line(ran.line, section.decision)
        if line is None:
            break
        spec = step_spec(outcome.spec, line, steps)
    for sentence in bisect_sentences(section):
        typer.echo(sentence)
    typer.echo(f"evidence {outcome.evidence_id}")
    typer.echo(f"bundle {folder.resolve()}")


def _verdict_table(
    rows: Sequence[Comparison],
    title: str = "prefill: variant vs baseline (paired, same prompts)",
) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for column in ("context", "variant", "n", "ratio", "95% joint interval", "verdict"):
        table.add_column(column)
    for row in rows:
        ratio, low, high = row.ratio_median, row.ci_low, row.ci_high
        table.add_row(
            str(row.context_tokens),
            f"{row.variant} / {row.baseline}",
            str(row.n),
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]",
            str(row.verdict),
        )
    return table


# `coldbench run`'s job options: the table's, but for a service's own (labels, hosts) and
# `--repo`, a folder of this machine here (`_local_repository`).
RUN_OPTIONS = [name for name in local_options() if name != "repository"]


@app.command("run")
@with_job_options(
    RUN_OPTIONS,
    help={
        "model": "A checkpoint folder or preset:NAME. Default: preset:tiny.",
        "corpus": "Prompts from this UTF-8 text file instead of the built-in corpus: "
        "NAME=FILE or FILE (named after the file).",
        "recipe": "Build recipe for --repo variants: editable (default) or, for --adapter "
        "embedded, offline (installs nothing: no package index needed).",
        "adapter": "mlx-lm (--repo, the default with it), embedded (without --repo: this "
        "engine; with it: a checkout of coldbench whose engine/ each variant runs) or "
        "openai-server (--server-command, with or without --repo).",
    },
)
def run(
    given: dict[str, Any],
    out: Annotated[
        Path | None,
        typer.Option(help="Bundle folder to write (new; default: evidence-local-<time>)."),
    ] = None,
    repo: Annotated[
        Path | None, typer.Option(help="A git repository of the engine (mlx-lm or a fork).")
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(help="Engine module of --repo (default: mlx_lm, or engine for embedded)."),
    ] = None,
    server_command: Annotated[
        str | None,
        typer.Option(
            help="openai-server: the server's argv with {python}, {model} and {port}, e.g. "
            "'{python} -m mlx_lm server --model {model} --port {port} --prompt-cache-size 0'."
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            help='openai-server: declare an option as worker.toml does, NAME={type = "bool", '
            'argv = ["--flag"], proof = "regex"}; repeat. Variants then ask NAME=VALUE.',
        ),
    ] = None,
    wipe: Annotated[
        list[str] | None,
        typer.Option("--wipe", help="openai-server: a cache folder deleted before each start."),
    ] = None,
    first_token_timeout_s: Annotated[
        float | None,
        typer.Option(min=0.001, help="openai-server: seconds to the first token (default 300)."),
    ] = None,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[
        Path, typer.Option(help="Mirrors, worktrees, build venvs and spools.")
    ] = Path(".coldbench"),
    prespawn: Annotated[
        bool | None,
        typer.Option(
            "--prespawn/--no-prespawn",
            help="Start each block's processes (interpreters, imports) while the previous "
            "block measures (default: on for GPU backends, off on the CPU backend).",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="This host's `coldbench calibrate` result: the blocks' length and the "
            "statistics follow its noise (default: rounds // 12 and a unit per process pair).",
        ),
    ] = None,
) -> None:
    """Run the cold-prefill matrix on this machine and write a checksummed evidence bundle.

    SIGINT or SIGTERM stops the run: every process it started is stopped and the bundle holds
    what was measured, marked stopped (exit code 130); a second signal interrupts at once."""
    import logging

    from rich.console import Console

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    state_dir = state_dir.resolve()
    setup = _local_setup(
        given,
        repo=repo,
        module=module,
        server=ServerOptions(
            server_command, list(option or []), list(wipe or []), first_token_timeout_s
        ),
        state_dir=state_dir,
    )
    if setup.spec.mode == "bisect":
        _bisect(setup, out=out, state_dir=state_dir, cell_timeout_s=cell_timeout_s, console=console)
        return
    noise = None
    if calibration is not None:
        from coldbench.worker.config import ConfigError, load_noise

        try:
            noise = load_noise(calibration)
        except ConfigError as error:
            _fail(f"--calibration: {error}")
    setup.spec = _checked_on_this_host(setup, state_dir)
    run_id = f"local-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    out = out or Path(f"evidence-{run_id}")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out}: folder exists and is not empty; choose a new one")
    outcome = _measure(
        setup,
        run_id=run_id,
        state_dir=state_dir,
        cell_timeout_s=cell_timeout_s,
        console=console,
        prespawn=prespawn,
        noise=noise,
    )
    _print_outcome(outcome, out)


def _checked_on_this_host(setup: LocalSetup, state_dir: Path) -> JobSpec:
    """The spec as this machine runs it: a range resolved in the mirror, then the host's own
    checks (flags the adapter knows, options the declarations allow, the corpus), before
    anything is built or measured. Warns when a resolved range's rounds cannot conclude."""
    from coldbench.evidence.stats import too_few_rounds
    from coldbench.worker.checkout import CheckoutError
    from coldbench.worker.config import ConfigError
    from coldbench.worker.run import check_job, resolve_on_host

    try:
        spec = resolve_on_host(setup.spec, setup.repositories, state_dir=state_dir)
        check_job(spec, setup.repositories, setup.corpora)
    except (ValueError, ConfigError, CheckoutError) as error:
        _fail(str(error))
    warning = too_few_rounds(spec)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    return spec


def _measure(
    setup: LocalSetup,
    *,
    run_id: str,
    state_dir: Path,
    cell_timeout_s: float,
    console: Any,
    prespawn: bool | None = None,
    noise: HostNoise | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> RunOutcome:
    """The run itself, with a live bar on a terminal or a line per cell elsewhere."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from coldbench.worker.fingerprint import host_fingerprint, host_labels
    from coldbench.worker.run import RunRefused, execute_run
    from coldbench.worker.variants import Progress as CellProgress

    workdir = state_dir / "runs" / run_id
    host = host_fingerprint()
    # A live bar only where someone watches a terminal; redirected to a file (nohup, CI, an ssh
    # log) a bar is drawn once at the end, so a run of hours would show nothing until then:
    # there each phase and each finished cell is one plain line instead.
    live = console.is_terminal
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[left]}"),
        console=console,
        transient=False,
        disable=not live,
    ) as bar:
        task = bar.add_task("preparing", total=None, left="")
        cells_printed = 0

        def on_phase(text: str) -> None:
            bar.update(task, description=text)
            if not live:
                console.print(text, highlight=False)

        def on_progress(progress: CellProgress) -> None:
            nonlocal cells_printed
            where = (
                f"{progress.variant} @ {progress.context_tokens} tokens"
                if progress.variant
                else "done"
            )
            left = "" if progress.eta_s is None else f"~{progress.eta_s:.0f} s left"
            if progress.invalid:
                left += f"  ({len(progress.invalid)} not ok)"
            bar.update(
                task,
                description=where,
                total=progress.cells_total,
                completed=progress.cells_done,
                left=left,
            )
            # A cell reports as it starts and as it ends: a line for each one ended.
            if not live and progress.cells_done not in (0, cells_printed):
                cells_printed = progress.cells_done
                console.print(
                    f"{progress.cells_done}/{progress.cells_total} cells done, last {where}"
                    + (f" ({left.strip()})" if left else ""),
                    highlight=False,
                )

        stop = StopRequest(on_first=lambda: on_phase("stopping: writing what was measured"))
        try:
            with stop.installed():
                return execute_run(
                    setup.spec,
                    run_id=run_id,
                    workdir=workdir,
                    state_dir=state_dir,
                    host=host,
                    labels=host_labels(host, []),
                    repositories=setup.repositories,
                    models=setup.models,
                    corpora=setup.corpora,
                    local_arguments=_local_arguments(setup),
                    cell_timeout_s=cell_timeout_s,
                    on_progress=on_progress,
                    on_phase=on_phase,
                    should_stop=stop.is_set,
                    prespawn=prespawn,
                    noise=noise,
                    extra_files=extra_files,
                )
        except RunRefused as error:
            bar.stop()
            _fail(str(error))
        except KeyboardInterrupt:
            bar.stop()
            console.print(f"interrupted; records so far are in {workdir}")
            raise typer.Exit(130) from None


def _local_arguments(setup: LocalSetup) -> dict[str, str]:
    """The reproduce command's arguments for what only this machine names: a model folder and
    a corpus file (a host's names would mean nothing to `coldbench run`)."""
    arguments = {}
    if setup.model_argument is not None:
        arguments["--model"] = str(Path(setup.model_argument).expanduser().resolve())
    if setup.corpus_argument is not None:
        name, path = local_corpus(setup.corpus_argument)
        arguments["--corpus"] = f"{name}={path}"
    return arguments


def _print_outcome(outcome: RunOutcome, out: Path) -> None:
    """The bundle written to `out`, its verdicts, where it is; exit 1 when the run failed."""
    from rich.console import Console

    from coldbench.evidence.bundle import write_folder, zip_bytes

    folder = write_folder(out, outcome.files)
    folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
    out_console = Console()
    if outcome.summary and outcome.summary.history:
        from coldbench.evidence.history import history_sentences

        for sentence in history_sentences(outcome.summary.history):
            out_console.print(sentence)
    elif outcome.summary and outcome.summary.commits:
        from coldbench.evidence.commits import commits_sentences

        for sentence in commits_sentences(outcome.summary.commits):
            out_console.print(sentence, soft_wrap=True)
    elif outcome.summary:
        from coldbench.evidence.markdown import noise_floor_text, time_spent_lines

        out_console.print(_verdict_table(outcome.summary.comparisons))
        floor = noise_floor_text(outcome.summary)
        if floor:
            out_console.print(floor, soft_wrap=True)
        for line in time_spent_lines(outcome.summary):
            out_console.print(line, soft_wrap=True, highlight=False)
        entries = outcome.summary.ablation.entries if outcome.summary.ablation else []
        if entries:
            title = "ablation: all vs all-minus-<feature> (contributions are not additive)"
            out_console.print(_verdict_table(entries, title))
        invalid = outcome.summary.invalid.total
        if invalid:
            out_console.print(f"{invalid} cells not ok (see summary.md)")
    # Whole lines, never wrapped at the terminal's width: scripts and people copy them.
    out_console.print(f"evidence {outcome.evidence_id}", soft_wrap=True)
    out_console.print(f"bundle {folder.resolve()}", soft_wrap=True)
    if outcome.stopped:
        typer.echo(f"stopped: {outcome.reason}; the bundle holds what was measured", err=True)
        raise typer.Exit(130)
    if outcome.status != "succeeded":
        _fail(f"run failed: {outcome.reason}", code=1)


@app.command("reproduce")
def reproduce(
    source: Annotated[
        str,
        typer.Argument(help="An evidence bundle (folder or zip) or URL (https://HOST/e/<id>)."),
    ],
    repo: Annotated[
        Path | None,
        typer.Option(
            help="This machine's clone of the job's repository (default: the URL the bundle names)."
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="The checkpoint folder, where the job's model was a folder of the "
            "original host (its digests must match the bundle's)."
        ),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="The prompts file, where the job's corpus was a file of the original "
            "host (its sha256 must match)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Bundle folder to write (new; default: reproduction-<id>-<time>)."),
    ] = None,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[
        Path, typer.Option(help="Mirrors, worktrees, build venvs and spools.")
    ] = Path(".coldbench"),
) -> None:
    """Re-run a bundle's job on this machine from the bundle alone: the commits it measured,
    its flags, recipes, seed, rounds and contexts, its model and prompts (digests checked).
    Writes a bundle naming the evidence it reproduces (reproduces.json), then prints the
    hosts' agreement as `coldbench compare` does. Exits 2, with every reason, where the job
    cannot be had here (a commit missing, a model digest that differs, ...)."""
    import logging

    from rich.console import Console

    from coldbench.evidence.compare import (
        CompareError,
        Source,
        compare_hosts,
        comparison_lines,
        host_runs,
        load_source,
    )
    from coldbench.worker.reproduce import ReproductionRefused, build_differences, plan_reproduction

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    state_dir = state_dir.resolve()
    try:
        original = load_source(source)
        plan = plan_reproduction(
            original, state_dir=state_dir, repo=repo, model=model, corpus=corpus
        )
    except (CompareError, ReproductionRefused) as error:
        _fail_all([f"cannot reproduce: {line}" for line in str(error).splitlines()])
    run_id = f"local-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    out = out or Path(f"reproduction-{plan.evidence_id[:12]}-{run_id.removeprefix('local-')}")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out}: folder exists and is not empty; choose a new one")
    console.print(
        f"reproducing evidence {plan.evidence_id} ({plan.spec.mode}, job pinned to "
        "the commits it measured)",
        highlight=False,
    )
    setup = LocalSetup(
        spec=plan.spec,
        repositories=plan.repositories,
        models=plan.models,
        corpora=plan.corpora,
        model_argument=str(model) if model is not None else None,
        corpus_argument=f"{plan.spec.corpus}={corpus}" if corpus is not None else None,
    )
    outcome = _measure(
        setup,
        run_id=run_id,
        state_dir=state_dir,
        cell_timeout_s=cell_timeout_s,
        console=console,
        extra_files={"reproduces.json": plan.reproduces_file()},
    )
    lines = []
    if outcome.status == "succeeded":
        try:
            hosts = host_runs(original) + host_runs(Source(str(out), outcome.files))
            lines = comparison_lines(compare_hosts(hosts))
            differences = build_differences(plan.provenance, hosts[-1].provenance)
            lines += [f"warning: {line}" for line in differences]
        except CompareError as error:
            lines = [f"not compared: {error}"]
    try:
        _print_outcome(outcome, out)
    finally:
        for line in lines:
            typer.echo(line)


class StopRequest:
    """SIGINT and SIGTERM as a stop request: the first one asks the run to stop (its processes
    are killed, what was measured becomes the bundle), a second one interrupts at once."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self._event = threading.Event()
        self._on_first = on_first

    def is_set(self) -> bool:
        return self._event.is_set()

    def _handle(self, _signum: int, _frame: object) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt
        self._event.set()
        if self._on_first is not None:
            self._on_first()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._handle)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@app.command("calibrate")
@with_job_options(
    ["model", "contexts", "rounds", "rounds_per_process", "decode_tokens", "seed", "residency"],
    help={
        "model": "A checkpoint folder or preset:NAME. Default: preset:tiny.",
        "rounds": "Rounds of every job. Default: 24.",
        "seed": "Seed of the first job (then +1 per job). Default: 0.",
    },
    defaults={"model": "preset:tiny", "contexts": "256", "rounds": "24", "decode_tokens": "2"},
)
def calibrate(
    given: dict[str, Any],
    planted_step: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="prefill_step_size of the planted variant: a chunk width known to cost a few "
            "percent against --base-step at these contexts (required unless --merge).",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option(min=1, max=100, help="A/A jobs, and as many planted-effect jobs.")
    ] = 10,
    base_step: Annotated[
        int | None,
        typer.Option(min=1, help="prefill_step_size of every other variant (default: stock)."),
    ] = None,
    variants: Annotated[
        int,
        typer.Option(
            min=2, max=3, help="Variants per job: 3 (a, b, c) as the targets are set, or 2."
        ),
    ] = 3,
    out: Annotated[Path, typer.Option(help="The result file (JSON).")] = Path("calibration.json"),
    bundles: Annotated[
        Path | None, typer.Option(help="Keep every job's evidence bundle in this folder.")
    ] = None,
    api: Annotated[
        str | None, typer.Option(help="Report the result to this coldbench server as the host.")
    ] = None,
    config: Annotated[
        Path, typer.Option(help="This host's worker.toml (with --api: whose secret to use).")
    ] = Path("worker.toml"),
    merge: Annotated[
        list[Path] | None,
        typer.Option(
            help="Measure nothing: merge these result files (e.g. one per GPU, run side by side "
            "with seeds apart) into --out. Repeat."
        ),
    ] = None,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[Path, typer.Option(help="Spools of the jobs' runs.")] = Path(".coldbench"),
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace a --bundles folder that is not empty (a recipe re-run)."
        ),
    ] = False,
) -> None:
    """Calibrate this host: runs of three identical variants beside a planted effect, each read
    as an A/A/A job and a planted-effect job, through the same machinery as `coldbench run`;
    prints how often identical code was called different, whether the planted effect was found,
    the smallest effect this host resolves and its variance components (give the result to
    `coldbench run --calibration` or worker.toml's `calibration`)."""
    import logging

    from rich.console import Console

    from coldbench.evidence.job_options import JobOptionsError, problem_lines
    from coldbench.worker.calibrate import calibration_spec, run_calibration
    from coldbench.worker.fingerprint import host_fingerprint, host_labels
    from coldbench.worker.run import RunRefused

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    if out.exists() and out.is_dir():
        _fail(f"--out {out}: is a folder; give a file name")
    if bundles is not None and bundles.exists() and any(bundles.iterdir()) and not force:
        _fail(
            f"--bundles {bundles}: folder exists and is not empty; choose a new one (or "
            "--force to replace it)"
        )
    if api is not None and not re.fullmatch(r"https?://[^\s]+", api):
        _fail(f"--api {api!r}: give an http:// or https:// URL")
    agent = None
    if api is not None:  # before hours of measuring: the secret must be there
        from coldbench.worker.agent import Agent, AgentError
        from coldbench.worker.config import ConfigError, load_host_config

        try:
            agent = Agent(api, load_host_config(config))
            agent.load_secret()
        except (ConfigError, AgentError) as error:
            _fail(str(error))
    if merge:
        from pydantic import ValidationError

        from coldbench.evidence.calibration import HostCalibration, merge_calibrations

        loaded = []
        for path in merge:
            try:
                loaded.append(HostCalibration.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError) as error:
                detail = " ".join(str(error).split())[:200]
                _fail(f"--merge {path}: not a calibration result ({detail})")
        try:
            result = merge_calibrations(loaded)
        except ValueError as error:
            _fail(str(error))
        _finish_calibration(result, out, agent, api)
        return
    if planted_step is None:
        _fail("--planted-step: give the planted variant's chunk width (or --merge FILES)")
    try:
        model_name, models = local_model(given["model"])
    except ValueError as error:
        _fail(str(error))
    base_flags = {} if base_step is None else {"prefill_step_size": base_step}
    try:  # every job's spec is this one's but for its seed: its problems, all at once
        first = calibration_spec(
            **{**given, "model": model_name},
            base_flags=base_flags,
            planted_flags={"prefill_step_size": planted_step},
            variants=variants,
        )
    except JobOptionsError as error:
        _fail_all(problem_lines(error))
    host = host_fingerprint()

    def on_job(_kind: str, index: int, total: int) -> None:
        console.print(f"run {index} of {total}: an A/A/A job and a planted-effect job")

    def on_phase(text: str) -> None:
        if text.startswith("variants run in turns"):  # the memory plan: say which
            console.print(text, highlight=False)

    if force and bundles is not None and bundles.is_dir():
        import shutil

        shutil.rmtree(bundles)

    try:
        result = run_calibration(
            model=model_name,
            models=models,
            contexts=first.contexts,
            rounds=first.rounds,
            jobs=jobs,
            planted_flags={"prefill_step_size": planted_step},
            base_flags=base_flags,
            decode_tokens=first.decode_tokens,
            seed=first.seed,
            rounds_per_process=first.rounds_per_process,
            variants=variants,
            state_dir=state_dir.resolve(),
            host=host,
            labels=host_labels(host, []),
            bundles_dir=bundles,
            cell_timeout_s=cell_timeout_s,
            on_job=on_job,
            on_phase=on_phase,
            residency=first.residency,
        )
    except (RunRefused, ValueError) as error:
        _fail(str(error).splitlines()[0])
    if not any(c.n for job in result.jobs for c in job.comparisons):
        # nothing a merge or `coldbench run --calibration` could take for this host's noise
        failed = [job for job in result.jobs if job.status != "succeeded"]
        why = f": {failed[0].reason}" if failed and failed[0].reason else ""
        _fail(
            f"no calibration job produced statistics ({len(failed)} of {len(result.jobs)} "
            f"jobs failed{why}); no result written to {out}",
            code=1,
        )
    _finish_calibration(result, out, agent, api)


def _finish_calibration(result: Any, out: Path, agent: Any, api: str | None) -> None:
    """Write the result, print its lines, report it when asked."""
    import json

    out.write_text(json.dumps(result.to_json_dict(), indent=1, sort_keys=True) + "\n")
    for line in result.lines():
        typer.echo(line)
    failed = [job for job in result.jobs if job.status != "succeeded"]
    if failed:
        typer.echo(f"{len(failed)} jobs failed: {failed[0].reason}")
    typer.echo(f"result {out.resolve()}")
    if agent is not None:
        from coldbench.worker.agent import AgentError

        try:
            agent.report_calibration(result)
        except AgentError as error:
            _fail(f"result written, but not reported: {error}", code=1)
        typer.echo(f"reported to {api}")


def _valid_token(token: str) -> bool:
    return re.fullmatch(r"cbe_[A-Za-z0-9_-]{8,200}", token) is not None


@app.command("worker")
def worker(
    api: Annotated[str, typer.Option(help="The coldbench server, e.g. https://bench.example.org")],
    config: Annotated[Path, typer.Option(help="This host's worker.toml.")] = Path("worker.toml"),
    enroll: Annotated[
        str | None, typer.Option(help="One-use enrollment token (first start only).")
    ] = None,
    heartbeat_s: Annotated[float, typer.Option(min=0.1, help="Heartbeat period.")] = 15.0,
    lease_wait_s: Annotated[int, typer.Option(min=0, max=25, help="Lease long-poll.")] = 25,
    max_runs: Annotated[
        int | None, typer.Option(min=1, help="Exit after this many runs (default: never).")
    ] = None,
    idle_exit_s: Annotated[
        float | None, typer.Option(min=0.0, help="Exit after this long without work.")
    ] = None,
    host_lock: Annotated[
        Path | None,
        typer.Option(help="Lock file shared by every agent of this host (default: in /tmp)."),
    ] = None,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING.")] = "INFO",
) -> None:
    """Run this host's agent: lease jobs from the server, measure them, upload the evidence."""
    import logging

    from coldbench.worker.agent import Agent, AgentError, AgentOptions
    from coldbench.worker.config import ConfigError, load_host_config

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not re.fullmatch(r"https?://[^\s]+", api):
        _fail(f"--api {api!r}: give an http:// or https:// URL")
    try:
        host_config = load_host_config(config)
    except ConfigError as error:
        _fail(str(error))
    options = AgentOptions(
        heartbeat_s=heartbeat_s,
        lease_wait_s=lease_wait_s,
        max_runs=max_runs,
        idle_exit_s=idle_exit_s,
        host_lock_path=host_lock,
        cell_timeout_s=cell_timeout_s,
    )
    agent = Agent(api, host_config, options=options)
    try:
        if enroll is not None:
            if not _valid_token(enroll):
                _fail("--enroll: not an enrollment token (they look like cbe_...)")
            secret = agent.enroll(enroll)
            typer.echo(
                f"enrolled as {secret['worker_id']}; secret kept in {host_config.secret_path}",
                err=True,
            )
        else:
            agent.load_secret()
        code = agent.run_forever()
    except AgentError as error:
        _fail(str(error), code=1)
    raise typer.Exit(code)
