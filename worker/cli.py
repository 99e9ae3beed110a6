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
    from evidence.schemas import JobSpec, VariantSpec

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
    adapter: str | None = None,
) -> JobSpec:
    from pydantic import ValidationError

    from evidence.schemas import JobSpec, error_field
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
        "precision": precision,
    }
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as error:
        field = error_field(error)
        message = error.errors()[0]["msg"].removeprefix("Value error, ")
        if repository is None and field and field.endswith((".ref", ".recipe")):
            message = "ref= and recipe= name commits of a repository: add --repo PATH"
        raise ValueError(f"{field or 'job'}: {message}") from None


def _verdict_table(
    summary: dict[str, Any],
    rows: list[dict[str, Any]] | None = None,
    title: str = "prefill: variant vs baseline (paired, same prompts)",
) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for column in ("context", "variant", "n", "ratio", "95% interval", "verdict"):
        table.add_column(column)
    for row in summary.get("comparisons", []) if rows is None else rows:
        ratio = row.get("ratio_median")
        low, high = row.get("ci_low"), row.get("ci_high")
        table.add_row(
            str(row["context_tokens"]),
            f"{row['variant']} / {row.get('baseline') or summary.get('baseline')}",
            str(row.get("n")),
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]",
            str(row.get("verdict")),
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
        str | None, typer.Option(help="Build recipe for --repo variants (default: editable).")
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
    precision: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=0.5,
            help="Verdict precision: 'no established change' needs the 95% interval within "
            "1 +- this.",
        ),
    ] = 0.05,
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[
        Path, typer.Option(help="Mirrors, worktrees, build venvs and spools.")
    ] = Path(".coldbench"),
) -> None:
    """Run the cold-prefill matrix on this machine and write a checksummed evidence bundle."""
    import logging

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from worker.config import ConfigError, local_repository, server_repository
    from worker.fingerprint import host_fingerprint, host_labels
    from worker.run import RunRefused, execute_run
    from worker.variants import Progress as CellProgress

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    if mode not in ("ab", "ablation", "sweep"):
        _fail(f"--mode {mode!r}: choose ab, ablation or sweep")
    models: dict[str, Path] = {}
    model_name = model
    if not model.startswith("preset:"):
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            _fail(f"--model {model}: not a checkpoint folder (no config.json) and not preset:NAME")
        # Jobs name models; a folder becomes a name of this run's own model table.
        model_name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", path.resolve().name).strip("-.") or "model"
        models[model_name] = path.resolve()
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
            adapter=adapter,
        )
        from worker.run import check_job

        check_job(spec, repositories)  # an option the declarations refuse fails here, not later
    except (ValueError, ConfigError) as error:
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
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[left]}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("preparing", total=None, left="")

        def on_phase(text: str) -> None:
            bar.update(task, description=text)

        def on_progress(progress: CellProgress) -> None:
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
    if outcome.summary:
        out_console.print(_verdict_table(outcome.summary))
        entries = (outcome.summary.get("ablation") or {}).get("entries") or []
        if entries:
            title = "ablation: all vs all-minus-<feature> (contributions are not additive)"
            out_console.print(_verdict_table(outcome.summary, entries, title))
        invalid = (outcome.summary.get("invalid") or {}).get("total")
        if invalid:
            out_console.print(f"{invalid} cells not ok (see summary.md)")
    out_console.print(f"evidence {outcome.evidence_id}")
    out_console.print(f"bundle {folder.resolve()}")
    if outcome.status != "succeeded":
        typer.echo(f"error: run failed: {outcome.reason}", err=True)
        raise typer.Exit(1)


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
