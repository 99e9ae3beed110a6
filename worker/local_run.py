"""`coldbench run`'s orchestration on this machine, no server: options -> spec (`local_setup`:
this machine's repository, model and corpus, then the one builder, evidence/spec/job_options.py),
the host's checks (`checked_on_this_host`), measuring (`measure`, or `bisect_locally` for its
steps) and output (`print_outcome`). worker/cli.py parses the command lines and calls these;
`coldbench reproduce` and `coldbench calibrate` share them.

May import evidence/ and the rest of worker/; never api/.
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
from typing import TYPE_CHECKING, Any, NoReturn, get_args

import typer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coldbench.evidence.contract.schemas import HostNoise, JobSpec
    from coldbench.evidence.contract.summary_schema import Comparison
    from coldbench.worker.config import RepositoryConfig
    from coldbench.worker.run import RunOutcome


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def refuse_used_out(out: Path) -> None:
    """A bundle folder is written new: one that already holds files is refused, not mixed."""
    if out.exists() and any(out.iterdir()):
        fail(f"--out {out}: folder exists and is not empty; choose a new one")


def fail_all(lines: Sequence[str], code: int = 2) -> NoReturn:
    """Every problem found, one line each; the last line says how many."""
    for line in lines:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def local_corpus(option: str) -> tuple[str, Path]:
    """`--corpus NAME=FILE` or `--corpus FILE` -> (name, resolved file); ValueError."""
    from coldbench.evidence.contract.schemas import BUILTIN_CORPUS, CORPUS_NAME_PATTERN

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
    from coldbench.evidence.contract.schemas import SERVER_ADAPTERS, AdapterName, default_adapter
    from coldbench.worker.config import ConfigError, local_repository, server_repository

    servers = " or ".join(sorted(SERVER_ADAPTERS))
    if adapter in SERVER_ADAPTERS and server.command is None:
        problems.append(f"--adapter {adapter} needs --server-command (with {{port}})")
        return None
    if adapter not in SERVER_ADAPTERS and server.given():
        problems.append(f"{', '.join(server.given())}: only with --adapter {servers}")
    try:
        if adapter in SERVER_ADAPTERS:
            return server_repository(
                adapter=adapter,
                server_command=server.command or "",
                options=server.options,
                wipe=server.wipe,
                first_token_timeout_s=server.first_token_timeout_s,
                repo=repo,
                module=module,
            )
        # An adapter the service does not know is refused by the builder, by name.
        if repo is not None and (adapter is None or adapter in get_args(AdapterName)):
            chosen = adapter or default_adapter(repo.name)
            return local_repository(repo, module=module, adapter=chosen)
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


def local_setup(
    given: dict[str, Any],
    *,
    repo: Path | None,
    module: str | None,
    server: ServerOptions,
    state_dir: Path,
) -> LocalSetup:
    """Options -> spec: this machine's model, corpus and repository, then the one builder and
    the one resolution of a local job (its default rounds; no time budget unless given).
    `given`'s model and corpus are this machine's (a folder, a file) or names.
    Exits with every problem found, one line each."""
    from coldbench.evidence.contract.schemas import INSTALLED_SERVER, SERVER_ADAPTERS
    from coldbench.evidence.spec.job_options import (
        JobOptionsError,
        build_job_spec,
        problem_lines,
        resolve_job,
    )

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
    elif adapter in SERVER_ADAPTERS:
        given["repository"] = INSTALLED_SERVER  # what is missing is said above
    elif repo is not None:
        given["repository"] = repo.name  # the problem with it is said above
    if given.get("commits") and given.get("mode") == "history" and repository is not None:
        pinned = _pinned_commits(repository, given["commits"], state_dir, problems)
        given["commits"] = ",".join(pinned) if pinned is not None else None
    try:
        spec = resolve_job(build_job_spec(given))
    except JobOptionsError as error:
        problems += problem_lines(error)
    if problems:
        fail_all(problems)
    return LocalSetup(
        spec=spec,
        repositories=repositories,
        models=setup_models,
        corpora=corpora,
        model_argument=model_argument,
        corpus_argument=corpus,
    )


def bisect_locally(
    setup: LocalSetup, *, out: Path | None, state_dir: Path, cell_timeout_s: float, console: Any
) -> None:
    """Halve good..bad by paired lo/mid/hi steps, each its own run and bundle under `out`
    (step-01, step-02, ...); the last step's evidence names the result. The steps, decisions
    and halving are evidence/analysis/bisect.py's, as the service's (api/jobs/bisect.py)."""
    from coldbench.evidence.analysis.bisect import bisect_sentences, next_line, step_spec
    from coldbench.evidence.analysis.history import plural
    from coldbench.evidence.analysis.stats import too_few_rounds
    from coldbench.evidence.bundles.bundle import write_folder, zip_bytes
    from coldbench.evidence.contract.schemas import BisectStep
    from coldbench.worker.fingerprint import host_fingerprint, host_labels
    from coldbench.worker.run import RunRefused, execute_run

    spec = setup.spec
    started = datetime.now(UTC)
    out = out or Path(f"bisect-{started:%Y%m%dT%H%M%S}")
    refuse_used_out(out)
    host = host_fingerprint()
    # Said before the first step, as for every other mode (`checked_on_this_host`): a step
    # too noisy to tell ends the bisection, so the rounds it needs are named up front.
    warning = too_few_rounds(spec)
    if warning:
        typer.echo(
            f"warning: {warning}; a step that cannot tell mid from both ends stops the "
            "bisection (without --rounds each step measures until decided within 40 rounds)",
            err=True,
        )
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
            fail(str(error))
        folder = write_folder(out / name, outcome.files)
        folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
        if outcome.status != "succeeded" or not outcome.summary or outcome.spec is None:
            fail(f"{name} failed: {outcome.reason} (bundle {folder})", code=1)
        ran = outcome.spec.bisect
        assert ran is not None and ran.line is not None  # resolved by execute_run
        lo, mid, hi = ran.step_commits()
        console.print(
            f"{name}: {lo[:10]} .. {mid[:10] + ' .. ' if mid else ''}{hi[:10]} "
            f"({plural(len(ran.line) - 1, 'commit')} apart)"
        )
        section = outcome.summary.bisect
        if section is None:
            fail(f"{name}'s summary has no bisect section (bundle {folder})", code=1)
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


def checked_on_this_host(setup: LocalSetup, state_dir: Path) -> JobSpec:
    """The spec as this machine runs it: a range resolved in the mirror, then the host's own
    checks (flags the adapter knows, options the declarations allow, the corpus), before
    anything is built or measured. Warns when a resolved range's rounds cannot conclude."""
    from coldbench.evidence.analysis.stats import too_few_rounds
    from coldbench.worker.checkout import CheckoutError
    from coldbench.worker.config import ConfigError
    from coldbench.worker.run import check_job, resolve_on_host

    try:
        spec = resolve_on_host(setup.spec, setup.repositories, state_dir=state_dir)
        check_job(spec, setup.repositories, setup.corpora)
    except (ValueError, ConfigError, CheckoutError) as error:
        fail(str(error))
    warning = too_few_rounds(spec)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    return spec


def measure(
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
            fail(str(error))
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


def print_outcome(outcome: RunOutcome, out: Path) -> None:
    """The bundle written to `out`, its verdicts, where it is; exit 1 when the run failed."""
    from rich.console import Console

    from coldbench.evidence.bundles.bundle import write_folder, zip_bytes

    folder = write_folder(out, outcome.files)
    folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
    out_console = Console()
    if outcome.summary and outcome.summary.history:
        from coldbench.evidence.analysis.history import history_sentences

        for sentence in history_sentences(outcome.summary.history):
            out_console.print(sentence)
    elif outcome.summary and outcome.summary.commits:
        from coldbench.evidence.analysis.commits import commits_sentences

        for sentence in commits_sentences(outcome.summary.commits):
            out_console.print(sentence, soft_wrap=True)
    elif outcome.summary:
        from coldbench.evidence.rendering.markdown import noise_floor_text, time_spent_lines

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
        fail(f"run failed: {outcome.reason}", code=1)


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


def run_locally(
    setup: LocalSetup,
    *,
    out: Path | None,
    state_dir: Path,
    cell_timeout_s: float,
    console: Any,
    prespawn: bool | None,
    calibration: Path | None,
) -> None:
    """`coldbench run` once its options are a spec: a bisection's steps, or the host's checks,
    the run and its bundle written to `out`."""
    if setup.spec.mode == "bisect":
        bisect_locally(
            setup, out=out, state_dir=state_dir, cell_timeout_s=cell_timeout_s, console=console
        )
        return
    noise = None
    if calibration is not None:
        from coldbench.worker.config import ConfigError, load_noise

        try:
            noise = load_noise(calibration)
        except ConfigError as error:
            fail(f"--calibration: {error}")
    setup.spec = checked_on_this_host(setup, state_dir)
    run_id = f"local-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    out = out or Path(f"evidence-{run_id}")
    refuse_used_out(out)
    outcome = measure(
        setup,
        run_id=run_id,
        state_dir=state_dir,
        cell_timeout_s=cell_timeout_s,
        console=console,
        prespawn=prespawn,
        noise=noise,
    )
    print_outcome(outcome, out)
