"""`coldbench run` (the whole matrix on this machine, no server) and `coldbench worker`."""

from __future__ import annotations

import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from evidence.schemas import JobSpec, VariantSpec
    from evidence.summary_schema import Comparison

app = typer.Typer(add_completion=False)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def parse_variant(text: str) -> VariantSpec:
    """`--variant NAME[:key=value,...]` (evidence/spec_text.py); errors name the option."""
    from evidence.variant import parse_variant as parse

    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"--variant {text!r}: {error}") from None


def parse_contexts(text: str) -> list[int]:
    """`--contexts 128,256` or `4K,16K` (evidence/spec_text.py); errors name the option."""
    from evidence.spec_text import parse_contexts as parse

    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"--contexts {text!r}: {error}") from None


def local_corpus(option: str) -> tuple[str, Path]:
    """`--corpus NAME=FILE` or `--corpus FILE` -> (name, resolved file); exits on bad input."""
    from evidence.schemas import BUILTIN_CORPUS, CORPUS_NAME_PATTERN

    name, sep, file = option.partition("=")
    if not sep:
        file = option
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(option).stem).strip("-.")[:56] or "corpus"
    path = Path(file).expanduser().resolve()
    if not re.fullmatch(CORPUS_NAME_PATTERN, name) or name == BUILTIN_CORPUS:
        _fail(f"--corpus {option}: {name!r} is not a corpus name (letters, digits, _ . -)")
    if not path.is_file():
        _fail(f"--corpus {option}: {path} is not a file")
    return name, path


def build_spec(
    *,
    model: str,
    contexts: str,
    rounds: int,
    decode_tokens: int,
    variants: list[str],
    seed: int,
    mode: str,
    features: str | None,
    repository: str | None,
    recipe: str | None,
    fresh_process: bool,
    precision: float = 0.05,
    corpus: str = "builtin",
    rounds_per_process: int | None = None,
    adapter: str | None = None,
    history: dict[str, Any] | None = None,
    bisect: dict[str, Any] | None = None,
) -> JobSpec:
    from pydantic import ValidationError

    from evidence.schemas import JobSpec, error_field, error_line
    from evidence.spec_text import parse_features

    parsed = [parse_variant(v) for v in variants] or [parse_variant("base")]
    if recipe is not None:
        parsed = [v.model_copy(update={"recipe": v.recipe or recipe}) for v in parsed]
    raw = {
        "mode": mode,
        "adapter": adapter or ("mlx-lm" if repository else "embedded"),
        "repository": repository,
        "variants": [v.model_dump() for v in parsed],
        "features": parse_features(features or ""),
        "contexts": parse_contexts(contexts),
        "rounds": rounds,
        "decode_tokens": decode_tokens,
        "model": model,
        "seed": seed,
        "fresh_process": fresh_process,
        "rounds_per_process": rounds_per_process,
        "precision": precision,
        "corpus": corpus,
        "history": history,
        "bisect": bisect,
    }
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as error:
        field = error_field(error)
        if repository is None and field and field.endswith((".ref", ".recipe")):
            message = "ref= and recipe= name commits of a repository: add --repo PATH"
            raise ValueError(f"{field}: {message}") from None
        raise ValueError(error_line(error, whole="job")) from None


def history_variants(
    repository: Any,
    *,
    commit_range: str | None,
    commits: str | None,
    every: int | None,
    last: int | None,
    state_dir: Path,
    flags: list[str],
) -> list[str]:
    """`--variant` values for a history: the reference commit first, then each commit, all
    with the same flags (one configuration; `--variant NAME:flag=value` gives them)."""
    from evidence.spec_text import TARGET_KEYS
    from worker.checkout import resolve_ref, update_mirror

    if (commit_range is None) == (commits is None):
        raise ValueError("--mode history needs --range A..B or --commits REF,REF,...")
    if commits is not None and (every or last):
        raise ValueError("--every and --last thin a --range, not a --commits list")
    if len(flags) > 1:
        raise ValueError("--mode history measures one configuration: give at most one --variant")
    extra = ""
    if flags:
        _, _, extra = flags[0].partition(":")
        if any(item.split("=")[0] in TARGET_KEYS for item in extra.split(",") if item):
            raise ValueError("--mode history: the commits are the refs; --variant takes flags only")
    if commit_range is not None:
        # One variant without a ref: execute_run resolves the range in the mirror
        # (worker.run.resolve_on_host), as a host of the service does.
        return flags or ["base"]
    mirror = update_mirror(repository, state_dir=state_dir)
    refs = [ref for ref in (commits or "").split(",") if ref]
    if len(refs) < 2:
        raise ValueError("--commits: give the reference and at least one other commit")
    reference, *shas = [resolve_ref(mirror, ref) for ref in refs]
    suffix = f",{extra}" if extra else ""
    return [f"ref-{reference[:10]}:ref={reference}{suffix}"] + [
        f"c{position:02d}-{sha[:10]}:ref={sha}{suffix}" for position, sha in enumerate(shas, 1)
    ]


def _bisect(
    *,
    repository: Any,
    good: str,
    bad: str,
    direction: str,
    base: dict[str, Any],
    models: dict[str, Path],
    corpora: dict[str, Path],
    out: Path | None,
    state_dir: Path,
    cell_timeout_s: float,
    console: Any,
) -> None:
    """Halve good..bad by paired lo/mid/hi steps, each its own run and bundle under `out`
    (step-01, step-02, ...); the last step's evidence names the result. The steps, decisions
    and halving are evidence/bisect.py's, as the service's (api/jobs/bisect.py)."""
    from evidence.bisect import bisect_sentences, next_line, step_spec
    from evidence.bundle import write_folder, zip_bytes
    from evidence.schemas import BisectStep
    from worker.fingerprint import host_fingerprint, host_labels
    from worker.run import RunRefused, execute_run

    if len(base["flags"]) > 1:
        raise ValueError("--mode bisect measures one configuration: give at most one --variant")
    # One variant without a ref (the configuration); execute_run resolves --good..--bad to
    # commits in the mirror, as a host of the service does.
    spec = build_spec(
        model=base["model"],
        contexts=base["contexts"],
        rounds=base["rounds"],
        decode_tokens=base["decode_tokens"],
        variants=base["flags"] or ["base"],
        seed=base["seed"],
        mode="bisect",
        features=None,
        repository=repository.name,
        recipe=None,
        fresh_process=False,
        precision=base["precision"],
        corpus=base["corpus"],
        bisect={"good": good, "bad": bad, "direction": direction},
    )
    started = datetime.now(UTC)
    out = out or Path(f"bisect-{started:%Y%m%dT%H%M%S}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out}: folder exists and is not empty; choose a new one")
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
                repositories={repository.name: repository},
                models=models,
                corpora=corpora,
                command=None,
                cell_timeout_s=cell_timeout_s,
            )
        except RunRefused as error:
            raise ValueError(str(error)) from None
        folder = write_folder(out / name, outcome.files)
        folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
        if outcome.status != "succeeded" or not outcome.summary or outcome.spec is None:
            typer.echo(f"error: {name} failed: {outcome.reason} (bundle {folder})", err=True)
            raise typer.Exit(1)
        ran = outcome.spec.bisect
        assert ran is not None and ran.line is not None  # resolved by execute_run
        lo, mid, hi = ran.step_commits()
        console.print(
            f"{name}: {lo[:10]} .. {mid[:10] + ' .. ' if mid else ''}{hi[:10]} "
            f"({len(ran.line) - 1} commits apart)"
        )
        section = outcome.summary.bisect
        if section is None:
            typer.echo(f"error: {name}'s summary has no bisect section (bundle {folder})", err=True)
            raise typer.Exit(1)
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
    for column in ("context", "variant", "n", "ratio", "95% interval", "verdict"):
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


@app.command("run")
def run(
    model: Annotated[str, typer.Option(help="A checkpoint folder or preset:NAME.")] = "preset:tiny",
    contexts: Annotated[str, typer.Option(help="Context lengths in tokens, e.g. 128,256.")] = (
        "128,256"
    ),
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (pairing units).")] = 3,
    decode_tokens: Annotated[int, typer.Option(min=0, help="Greedy tokens after prefill.")] = 8,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant",
            help="NAME[:key=value,...]; repeat. The first is the baseline. Keys ref and recipe "
            "pick a commit and a build recipe of --repo; the rest are engine flags.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of prompts, order and bootstrap.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Bundle folder to write (new).")] = None,
    mode: Annotated[str, typer.Option(help="ab, ablation or sweep.")] = "ab",
    features: Annotated[
        str | None, typer.Option(help="Ablation features: flag or flag=value, comma-separated.")
    ] = None,
    repo: Annotated[
        Path | None, typer.Option(help="A git repository of the engine (mlx-lm or a fork).")
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            help="Build recipe for --repo variants: editable (default) or, for --adapter "
            "embedded, offline (installs nothing: no package index needed)."
        ),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(help="Engine module of --repo (default: mlx_lm, or engine for embedded)."),
    ] = None,
    adapter: Annotated[
        str | None,
        typer.Option(
            help="mlx-lm (--repo, the default with it), embedded (without --repo: this "
            "engine; with it: a checkout of coldbench whose engine/ each variant runs) or "
            "openai-server (--server-command, with or without --repo)."
        ),
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
    fresh_process: Annotated[
        bool, typer.Option("--fresh-process", help="A new process for every cell.")
    ] = False,
    rounds_per_process: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Rounds each variant's process measures before every variant gets a fresh "
            "one (default: rounds // 12, at least 1: 12 or more independent process pairs).",
        ),
    ] = None,
    precision: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=0.5,
            help="Verdict precision: 'no established change' needs the 95% interval within "
            "1 +- this.",
        ),
    ] = 0.05,
    commit_range: Annotated[
        str | None,
        typer.Option(
            "--range",
            help="History: A..B, each commit on B's first-parent line after A against A.",
        ),
    ] = None,
    every: Annotated[
        int | None, typer.Option(min=1, help="History: every Nth commit (counted back from B).")
    ] = None,
    last: Annotated[int | None, typer.Option(min=1, help="History: the newest N commits.")] = None,
    commits: Annotated[
        str | None,
        typer.Option(help="History: an explicit list REF,REF,...; the first is the reference."),
    ] = None,
    good: Annotated[str | None, typer.Option(help="Bisect: a ref that is not yet changed.")] = None,
    bad: Annotated[str | None, typer.Option(help="Bisect: a ref that is changed.")] = None,
    direction: Annotated[
        str | None, typer.Option(help="Bisect: the change to find, slower or faster.")
    ] = None,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[
        Path, typer.Option(help="Mirrors, worktrees, build venvs and spools.")
    ] = Path(".coldbench"),
    corpus: Annotated[
        str | None,
        typer.Option(
            help="Prompts from this UTF-8 text file instead of the built-in corpus: "
            "NAME=FILE or FILE (named after the file)."
        ),
    ] = None,
) -> None:
    """Run the cold-prefill matrix on this machine and write a checksummed evidence bundle."""
    import logging

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from worker.checkout import CheckoutError
    from worker.config import ConfigError, local_repository, server_repository
    from worker.fingerprint import host_fingerprint, host_labels
    from worker.run import RunRefused, execute_run
    from worker.variants import Progress as CellProgress

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    if mode not in ("ab", "ablation", "sweep", "history", "bisect"):
        _fail(f"--mode {mode!r}: choose ab, ablation, sweep, history or bisect")
    if mode != "bisect" and any(option is not None for option in (good, bad, direction)):
        _fail("--good, --bad and --direction belong to --mode bisect")
    history_options = (commit_range, every, last, commits)
    if mode != "history" and any(option is not None for option in history_options):
        _fail("--range, --every, --last and --commits belong to --mode history")
    models: dict[str, Path] = {}
    model_name = model
    if not model.startswith("preset:"):
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            _fail(f"--model {model}: not a checkpoint folder (no config.json) and not preset:NAME")
        # Jobs name models; a folder becomes a name of this run's own model table.
        model_name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", path.resolve().name).strip("-.") or "model"
        models[model_name] = path.resolve()
    corpora: dict[str, Path] = {}
    corpus_name = "builtin"
    if corpus is not None:
        corpus_name, corpus_file = local_corpus(corpus)
        corpora[corpus_name] = corpus_file
    repositories = {}
    if adapter not in (None, "embedded", "mlx-lm", "openai-server"):
        _fail(f"--adapter {adapter!r}: choose one of embedded, mlx-lm, openai-server")
    server_given = [
        name
        for name, given in (
            ("--server-command", server_command),
            ("--option", option),
            ("--wipe", wipe),
            ("--first-token-timeout-s", first_token_timeout_s),
        )
        if given
    ]
    if adapter == "openai-server" and server_command is None:
        _fail("--adapter openai-server needs --server-command (with {port})")
    if adapter != "openai-server" and server_given:
        _fail(f"{', '.join(server_given)}: only with --adapter openai-server")
    if adapter == "mlx-lm" and repo is None:
        _fail("--adapter mlx-lm drives a checkout: add --repo PATH")
    try:
        if adapter == "openai-server":
            repository = server_repository(
                server_command=server_command or "",
                options=list(option or []),
                wipe=list(wipe or []),
                first_token_timeout_s=first_token_timeout_s,
                repo=repo,
                module=module,
            )
            repositories[repository.name] = repository
        elif repo is not None:
            repository = local_repository(repo, module=module, adapter=adapter or "mlx-lm")
            repositories[repository.name] = repository
        history = None
        if mode == "history":
            if repo is None:
                raise ValueError("--mode history needs --repo PATH (its commits are measured)")
            variant = history_variants(
                repositories[next(iter(repositories))],
                commit_range=commit_range,
                commits=commits,
                every=every,
                last=last,
                state_dir=state_dir.resolve(),
                flags=list(variant or []),
            )
            if commit_range:
                history = {"range": commit_range, "every": every, "last": last}
        if mode == "bisect":
            if repo is None:
                raise ValueError("--mode bisect needs --repo PATH (its commits are bisected)")
            if good is None or bad is None or direction not in ("slower", "faster"):
                raise ValueError(
                    "--mode bisect needs --good REF, --bad REF and --direction slower|faster"
                )
            if len(parse_contexts(contexts)) != 1:
                raise ValueError("--mode bisect takes exactly one context (--contexts N)")
            _bisect(
                repository=repositories[next(iter(repositories))],
                good=good,
                bad=bad,
                direction=direction,
                base={
                    "model": model_name,
                    "contexts": contexts,
                    "rounds": rounds,
                    "decode_tokens": decode_tokens,
                    "seed": seed,
                    "precision": precision,
                    "flags": list(variant or []),
                    "corpus": corpus_name,
                },
                models=models,
                corpora=corpora,
                out=out,
                state_dir=state_dir.resolve(),
                cell_timeout_s=cell_timeout_s,
                console=console,
            )
            return
        spec = build_spec(
            model=model_name,
            contexts=contexts,
            rounds=rounds,
            decode_tokens=decode_tokens,
            variants=list(variant or []),
            seed=seed,
            mode=mode,
            features=features,
            repository=next(iter(repositories), None),
            recipe=recipe,
            fresh_process=fresh_process,
            precision=precision,
            corpus=corpus_name,
            rounds_per_process=rounds_per_process,
            adapter=adapter,
            history=history,
        )
        from worker.run import check_job, resolve_on_host

        # a range that does not resolve, an option the declarations refuse (or a corpus it
        # lacks) fails here, not later
        spec = resolve_on_host(spec, repositories, state_dir=state_dir.resolve())
        check_job(spec, repositories, corpora)
    except (ValueError, ConfigError, CheckoutError) as error:
        _fail(str(error))
    started = datetime.now(UTC)
    run_id = f"local-{started:%Y%m%dT%H%M%S}"
    out = out or Path(f"evidence-{run_id}")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out}: folder exists and is not empty; choose a new one")
    workdir = state_dir.resolve() / "runs" / run_id
    host = host_fingerprint()
    command = shlex.join(["coldbench", *sys.argv[1:]]) if sys.argv[1:2] == ["run"] else None

    refused: str | None = None
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

        try:
            outcome = execute_run(
                spec,
                run_id=run_id,
                workdir=workdir,
                state_dir=state_dir.resolve(),
                host=host,
                labels=host_labels(host, []),
                repositories=repositories,
                models=models,
                corpora=corpora,
                command=command,
                cell_timeout_s=cell_timeout_s,
                on_progress=on_progress,
                on_phase=on_phase,
            )
        except RunRefused as error:
            refused = str(error)
        except KeyboardInterrupt:
            bar.stop()
            console.print(f"interrupted; records so far are in {workdir}")
            raise typer.Exit(130) from None
    if refused is not None:
        _fail(refused)

    from evidence.bundle import write_folder, zip_bytes

    folder = write_folder(out, outcome.files)
    folder.with_name(folder.name + ".zip").write_bytes(zip_bytes(outcome.files))
    out_console = Console()
    if outcome.summary and outcome.summary.history:
        from evidence.history import history_sentences

        for sentence in history_sentences(outcome.summary.history):
            out_console.print(sentence)
    elif outcome.summary:
        from evidence.markdown import noise_floor_text

        out_console.print(_verdict_table(outcome.summary.comparisons))
        floor = noise_floor_text(outcome.summary)
        if floor:
            out_console.print(floor, soft_wrap=True)
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
    if outcome.status != "succeeded":
        typer.echo(f"error: run failed: {outcome.reason}", err=True)
        raise typer.Exit(1)


def _model_option(model: str) -> tuple[str, dict[str, Path]]:
    """(the job's model name, this run's model table) for `--model DIR` or `preset:NAME`."""
    if model.startswith("preset:"):
        return model, {}
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        _fail(f"--model {model}: not a checkpoint folder (no config.json) and not preset:NAME")
    # Jobs name models; a folder becomes a name of this run's own model table.
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", path.resolve().name).strip("-.") or "model"
    return name, {name: path.resolve()}


@app.command("calibrate")
def calibrate(
    planted_step: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="prefill_step_size of the planted variant: a chunk width known to cost a few "
            "percent against --base-step at these contexts (required unless --merge).",
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="A checkpoint folder or preset:NAME.")] = "preset:tiny",
    contexts: Annotated[str, typer.Option(help="Context lengths in tokens, e.g. 16384.")] = "256",
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of every job.")] = 24,
    jobs: Annotated[
        int, typer.Option(min=1, max=100, help="A/A jobs, and as many planted-effect jobs.")
    ] = 10,
    base_step: Annotated[
        int | None,
        typer.Option(min=1, help="prefill_step_size of every other variant (default: stock)."),
    ] = None,
    rounds_per_process: Annotated[
        int | None, typer.Option(min=1, help="As for coldbench run (default: rounds // 12).")
    ] = None,
    decode_tokens: Annotated[int, typer.Option(min=0, help="Greedy tokens after prefill.")] = 2,
    variants: Annotated[
        int,
        typer.Option(
            min=2, max=3, help="Variants per job: 3 (a, b, c) as the targets are set, or 2."
        ),
    ] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the first job (then +1 per job).")] = 0,
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
) -> None:
    """Calibrate this host: A/A jobs of three identical variants and jobs with a planted effect,
    through the same machinery as `coldbench run`; prints how often identical code was called
    different, whether the planted effect was found, and the smallest effect this host resolves."""
    import logging

    from rich.console import Console

    from worker.calibrate import run_calibration
    from worker.fingerprint import host_fingerprint, host_labels
    from worker.run import RunRefused

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    try:
        context_list = parse_contexts(contexts)
    except ValueError as error:
        _fail(str(error))
    if out.exists() and out.is_dir():
        _fail(f"--out {out}: is a folder; give a file name")
    if bundles is not None and bundles.exists() and any(bundles.iterdir()):
        _fail(f"--bundles {bundles}: folder exists and is not empty; choose a new one")
    if api is not None and not re.fullmatch(r"https?://[^\s]+", api):
        _fail(f"--api {api!r}: give an http:// or https:// URL")
    agent = None
    if api is not None:  # before hours of measuring: the secret must be there
        from worker.agent import Agent, AgentError
        from worker.config import ConfigError, load_host_config

        try:
            agent = Agent(api, load_host_config(config))
            agent.load_secret()
        except (ConfigError, AgentError) as error:
            _fail(str(error))
    if merge:
        from pydantic import ValidationError

        from evidence.calibration import HostCalibration, merge_calibrations

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
    model_name, models = _model_option(model)
    base_flags = {} if base_step is None else {"prefill_step_size": base_step}
    host = host_fingerprint()

    def on_job(kind: str, index: int, total: int) -> None:
        what = "A/A" if kind == "aa" else "planted effect"
        console.print(f"job {index} of {total}: {what}")

    try:
        result = run_calibration(
            model=model_name,
            models=models,
            contexts=context_list,
            rounds=rounds,
            jobs=jobs,
            planted_flags={"prefill_step_size": planted_step},
            base_flags=base_flags,
            decode_tokens=decode_tokens,
            seed=seed,
            rounds_per_process=rounds_per_process,
            variants=variants,
            state_dir=state_dir.resolve(),
            host=host,
            labels=host_labels(host, []),
            bundles_dir=bundles,
            cell_timeout_s=cell_timeout_s,
            on_job=on_job,
        )
    except (RunRefused, ValueError) as error:
        _fail(str(error).splitlines()[0])
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
        from worker.agent import AgentError

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

    from worker.agent import Agent, AgentError, AgentOptions
    from worker.config import ConfigError, load_host_config

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
