"""The `coldbench` command: mounts each package's typer app.

Each package keeps its commands in its own `cli.py` and imports heavy modules (mlx, the
database) inside the command functions, so `coldbench --help` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="coldbench",
    help="Cold-prefill benchmarks and checksummed evidence for MLX inference engines.",
    no_args_is_help=True,
    add_completion=False,
)

# (module, attribute, name): a sub-app mounted as `coldbench NAME ...`, or a single command
# when NAME is None (the module's app then holds exactly the commands to add at top level).
_MOUNTS: list[tuple[str, str, str | None]] = [
    ("coldbench.model", "model_app", "model"),
    ("evidence.cli", "app", None),
    ("worker.cli", "app", None),
    ("api.cli", "app", None),
    ("coldbench.submit", "app", None),
    ("coldbench.demo", "app", None),
]


def _mount() -> None:
    for module_name, attribute, name in _MOUNTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # A package still being built in this checkout; its commands are simply absent.
            if error.name and module_name.startswith(error.name):
                continue
            raise
        sub_app = getattr(module, attribute)
        if name is not None:
            app.add_typer(sub_app, name=name)
        else:
            for command in sub_app.registered_commands:
                app.registered_commands.append(command)
            for group in sub_app.registered_groups:
                app.registered_groups.append(group)


@app.callback()
def _root() -> None:
    """Cold-prefill benchmarks and checksummed evidence for MLX inference engines."""


_mount()


@app.command()
def version() -> None:
    """Print coldbench's version."""
    from coldbench import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
