"""The `coldbench` command: dispatches each subcommand to the package that owns it.

Each package keeps its commands in its own typer app (`worker/cli.py`, `api/cli.py`,
`evidence/bundles/cli.py`, `coldbench/submit.py`, ...). This module imports none of them until a
subcommand is named, and then only that one's module (as mlx-lm's command line does), so
`coldbench --help` loads neither numpy nor the server stack, and a host with only
`coldbench[worker]` installed runs `coldbench run` and `coldbench worker` without the server's
packages. The list below is the one place a subcommand is named with its one-line help.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, NamedTuple


class Subcommand(NamedTuple):
    module: str
    attribute: str  # the module's typer app
    help: str


COMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand(
        "coldbench.demo",
        "app",
        "Run the whole loop locally: server, Celery, one agent, an A/B job and an ablation.",
    ),
    "run": Subcommand(
        "coldbench.worker.cli",
        "app",
        "Run the cold-prefill matrix on this machine and write a checksummed evidence bundle.",
    ),
    "calibrate": Subcommand(
        "coldbench.worker.cli", "app", "Calibrate this host: how small an effect it resolves."
    ),
    "verify": Subcommand(
        "coldbench.evidence.bundles.cli",
        "app",
        "Check an evidence bundle: every file's sha256, every record, the provenance.",
    ),
    "compare": Subcommand(
        "coldbench.evidence.bundles.cli",
        "app",
        "Set one job's bundles from several hosts side by side: do the hosts agree?",
    ),
    "reproduce": Subcommand(
        "coldbench.worker.cli",
        "app",
        "Re-run a bundle's (or an evidence URL's) job on this machine, from the bundle alone.",
    ),
    "submit": Subcommand(
        "coldbench.submit", "app", "Submit a job to the central API (and wait for its evidence)."
    ),
    "worker": Subcommand(
        "coldbench.worker.cli",
        "app",
        "Run this host's agent: lease jobs from the server, measure them, upload the evidence.",
    ),
    "server": Subcommand(
        "coldbench.api.cli", "app", "Serve the API, the evidence pages, /healthz and /metrics."
    ),
    "db": Subcommand("coldbench.api.cli", "app", "Database schema: Alembic migrations."),
    "admin": Subcommand(
        "coldbench.api.cli", "app", "Enrollment tokens, API keys, host labels and revocation."
    ),
    "celery": Subcommand(
        "coldbench.api.cli", "app", "Celery worker and beat of the central service."
    ),
    "model": Subcommand(
        "coldbench.model",
        "model_app",
        "Write synthetic checkpoints and show a checkpoint's digests.",
    ),
    "version": Subcommand("coldbench", "__version__", "Print coldbench's version."),
}
# The packages of each install (pyproject.toml's extras): a subcommand whose module needs one
# that is missing says which extra to install.
_EXTRA_OF_PACKAGE = {
    "fastapi": "server",
    "sqlalchemy": "server",
    "celery": "server",
    "alembic": "server",
    "uvicorn": "server",
    "jinja2": "server",
    "plotly": "server",
    "mlx": "worker",
    "mlx_lm": "worker",
}


USAGE = "Usage: coldbench COMMAND [ARGS]...  (coldbench COMMAND --help for its options)"


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        USAGE,
        "",
        "Cold-prefill benchmarks and checksummed evidence for MLX inference engines.",
        "",
        "Commands:",
    ]
    lines += [f"  {name.ljust(width)}  {entry.help}" for name, entry in COMMANDS.items()]
    return "\n".join(lines)


def _load(name: str) -> Any:
    """The typer app of subcommand `name`'s module, or exit naming the extra it needs."""
    entry = COMMANDS[name]
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        extra = _EXTRA_OF_PACKAGE.get(missing)
        if extra is None:
            raise
        sys.stderr.write(
            f"error: `coldbench {name}` needs {missing}, which this install lacks: "
            f"pip install 'coldbench[{extra}]'\n"
        )
        raise SystemExit(2) from None
    return getattr(module, entry.attribute)


def main(args: list[str] | None = None) -> Any:
    """`coldbench COMMAND ...`: the subcommand's own typer app runs the rest of the line."""
    argv = list(sys.argv[1:] if args is None else args)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return None if argv else sys.exit(2)
    name, rest = argv[0], argv[1:]
    if name == "version":
        from coldbench import __version__

        print(__version__)
        return None
    if name not in COMMANDS:
        sys.stderr.write(f"{USAGE}\nerror: no command {name!r}; commands: {', '.join(COMMANDS)}\n")
        sys.exit(2)
    import typer.main

    command = typer.main.get_command(_load(name))
    if name in getattr(command, "commands", {}):
        # A module app holding several top-level commands (`run`, `calibrate`, `worker`).
        return command.main(args=[name, *rest], prog_name="coldbench")
    return command.main(args=rest, prog_name=f"coldbench {name}")


if __name__ == "__main__":
    main()
