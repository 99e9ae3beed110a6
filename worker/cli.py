"""`coldbench run` (the whole matrix on this machine, no server), `coldbench reproduce` (a
bundle's job again, from the bundle alone), `coldbench calibrate` and `coldbench worker`: their
command lines parsed here, the local runs' orchestration called in worker/local_run.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from coldbench.evidence.spec.job_options import local_options, with_job_options
from coldbench.worker.local_run import (
    LocalSetup,
    ServerOptions,
    fail,
    fail_all,
    local_model,
    local_setup,
    measure,
    print_outcome,
    refuse_used_out,
    run_locally,
)

app = typer.Typer(add_completion=False)


# `coldbench run`'s job options: the table's, but for a service's own (labels, hosts) and
# `--repo`, a folder of this machine here (worker/local_run.py).
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
        typer.Option(
            help="Engine module of --repo (default: mlx_lm, or coldbench.engine for embedded)."
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
    cell_timeout_s: Annotated[float, typer.Option(min=1.0, help="Seconds per cell.")] = 600.0,
    state_dir: Annotated[
        Path, typer.Option(help="Mirrors, worktrees, build venvs and spools.")
    ] = Path(".coldbench"),
    prespawn: Annotated[
        bool | None,
        typer.Option(
            "--prespawn/--no-prespawn",
            help="Start each block's processes (interpreters, imports) while the previous "
            "block loads and warms up, never beside a timed cell (default: on for GPU backends, "
            "off on the CPU backend).",
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
    setup = local_setup(
        given,
        repo=repo,
        module=module,
        server=ServerOptions(
            server_command, list(option or []), list(wipe or []), first_token_timeout_s
        ),
        state_dir=state_dir,
    )
    run_locally(
        setup,
        out=out,
        state_dir=state_dir,
        cell_timeout_s=cell_timeout_s,
        console=console,
        prespawn=prespawn,
        calibration=calibration,
    )


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
    api: Annotated[
        str | None,
        typer.Option(help="Upload the reproduction to this coldbench server, as this host."),
    ] = None,
    config: Annotated[
        Path, typer.Option(help="This host's worker.toml (with --api: whose secret to use).")
    ] = Path("worker.toml"),
    upload_only: Annotated[
        bool,
        typer.Option(
            "--upload-only", help="Measure nothing: upload SOURCE, a reproduction bundle, to --api."
        ),
    ] = False,
) -> None:
    """Re-run a bundle's job on this machine from the bundle alone: the commits it measured,
    its flags, recipes, seed, rounds and contexts, its model and prompts (digests checked).
    Writes a bundle naming the evidence it reproduces (reproduces.json), then prints the
    hosts' agreement as `coldbench compare` does. Exits 2, with every reason, where the job
    cannot be had here (a commit missing, a model digest that differs, ...)."""
    import logging

    from rich.console import Console

    from coldbench.evidence.bundles.compare import (
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
    agent = _reproduction_agent(api, config, upload_only)  # before measuring: the secret
    if upload_only:
        _upload_reproduction(agent, Path(source), api)
        return
    try:
        original = load_source(source)
        plan = plan_reproduction(
            original, state_dir=state_dir, repo=repo, model=model, corpus=corpus
        )
    except (CompareError, ReproductionRefused) as error:
        fail_all([f"cannot reproduce: {line}" for line in str(error).splitlines()])
    run_id = f"local-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    out = out or Path(f"reproduction-{plan.evidence_id[:12]}-{run_id.removeprefix('local-')}")
    refuse_used_out(out)
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
    outcome = measure(
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
        print_outcome(outcome, out)
    finally:
        for line in lines:
            typer.echo(line)
    if agent is not None:
        _upload_reproduction(agent, out, api)


def _reproduction_agent(api: str | None, config: Path, upload_only: bool) -> Any:
    """The host's agent for `reproduce --api` (its secret loaded), or None without --api."""
    if api is None:
        if upload_only:
            fail("--upload-only: give --api URL, the server to upload to")
        return None
    if not re.fullmatch(r"https?://[^\s]+", api):
        fail(f"--api {api!r}: give an http:// or https:// URL")
    from coldbench.worker.agent import Agent, AgentError
    from coldbench.worker.config import ConfigError, load_host_config

    try:
        agent = Agent(api, load_host_config(config))
        agent.load_secret()
    except (ConfigError, AgentError) as error:
        fail(str(error))
    return agent


def _upload_reproduction(agent: Any, bundle: Path, api: str | None) -> None:
    """Upload a reproduction bundle; on failure it stays where it is, with the command that
    sends it again."""
    from coldbench.worker.agent import AgentError
    from coldbench.worker.reproduce import ReproductionRefused, upload_bundle

    try:
        accepted = upload_bundle(agent, bundle)
    except (AgentError, ReproductionRefused) as error:
        fail_all(
            [
                f"not uploaded: {error}",
                f"the bundle is kept: send it again with `coldbench reproduce {bundle} "
                f"--api {api} --upload-only`",
            ],
            code=1,
        )
    typer.echo(
        f"uploaded to {api}/e/{accepted.evidence_id} as host {accepted.host}'s reproduction "
        f"{accepted.reproduction_id}"
    )


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

    from coldbench.evidence.analysis.stats import too_few_rounds
    from coldbench.evidence.spec.job_options import JobOptionsError, problem_lines
    from coldbench.worker.calibrate import calibration_spec, run_calibration
    from coldbench.worker.fingerprint import host_fingerprint, host_labels
    from coldbench.worker.run import RunRefused

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    if out.exists() and out.is_dir():
        fail(f"--out {out}: is a folder; give a file name")
    if bundles is not None and bundles.exists() and any(bundles.iterdir()) and not force:
        fail(
            f"--bundles {bundles}: folder exists and is not empty; choose a new one (or "
            "--force to replace it)"
        )
    if api is not None and not re.fullmatch(r"https?://[^\s]+", api):
        fail(f"--api {api!r}: give an http:// or https:// URL")
    agent = None
    if api is not None:  # before hours of measuring: the secret must be there
        from coldbench.worker.agent import Agent, AgentError
        from coldbench.worker.config import ConfigError, load_host_config

        try:
            agent = Agent(api, load_host_config(config))
            agent.load_secret()
        except (ConfigError, AgentError) as error:
            fail(str(error))
    if merge:
        from pydantic import ValidationError

        from coldbench.evidence.contract.calibration import HostCalibration, merge_calibrations

        loaded = []
        for path in merge:
            try:
                loaded.append(HostCalibration.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError) as error:
                detail = " ".join(str(error).split())[:200]
                fail(f"--merge {path}: not a calibration result ({detail})")
        try:
            result = merge_calibrations(loaded)
        except ValueError as error:
            fail(str(error))
        _finish_calibration(result, out, agent, api)
        return
    if planted_step is None:
        fail("--planted-step: give the planted variant's chunk width (or --merge FILES)")
    try:
        model_name, models = local_model(given["model"])
    except ValueError as error:
        fail(str(error))
    base_flags = {} if base_step is None else {"prefill_step_size": base_step}
    try:  # every job's spec is this one's but for its seed: its problems, all at once
        first = calibration_spec(
            **{**given, "model": model_name},
            base_flags=base_flags,
            planted_flags={"prefill_step_size": planted_step},
            variants=variants,
        )
    except JobOptionsError as error:
        fail_all(problem_lines(error))
    warning = too_few_rounds(first)
    if warning:  # said before any timing: such a calibration still measures the host's noise
        console.print(
            f"warning: {warning}; no A/A or planted job of this calibration can be called "
            "either way: it gives the host's noise only",
            highlight=False,
        )
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
        fail(str(error).splitlines()[0])
    if not any(c.n for job in result.jobs for c in job.comparisons):
        # nothing a merge or `coldbench run --calibration` could take for this host's noise
        failed = [job for job in result.jobs if job.status != "succeeded"]
        why = f": {failed[0].reason}" if failed and failed[0].reason else ""
        fail(
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
            fail(f"result written, but not reported: {error}", code=1)
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
        fail(f"--api {api!r}: give an http:// or https:// URL")
    try:
        host_config = load_host_config(config)
    except ConfigError as error:
        fail(str(error))
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
                fail("--enroll: not an enrollment token (they look like cbe_...)")
            secret = agent.enroll(enroll)
            typer.echo(
                f"enrolled as {secret['worker_id']}; secret kept in {host_config.secret_path}",
                err=True,
            )
        else:
            agent.load_secret()
        code = agent.run_forever()
    except AgentError as error:
        fail(str(error), code=1)
    raise typer.Exit(code)
