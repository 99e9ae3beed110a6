"""`coldbench model create|inspect`: synthetic checkpoints (engine/checkpoints.py) and their
digests. The command lives here so that engine/ stays free of typer and rich."""

from __future__ import annotations

import json
from pathlib import Path

import typer

model_app = typer.Typer(
    help="Write synthetic checkpoints and show a checkpoint's digests.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@model_app.command("create")
def create(
    preset: str = typer.Option(..., "--preset", help="tiny, tiny-moe, llama-8b-shape, ..."),
    out: Path | None = typer.Option(
        None, "--out", help="directory to write (default: the model cache, see COLDBENCH_MODEL_DIR)"
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="float16, bfloat16 or float32"),
    quantize: int | None = typer.Option(None, "--quantize", help="bits (mlx-lm quantization)"),
    seed: int = typer.Option(0, "--seed", help="weights seed (same seed, same bytes)"),
    shard_mb: int | None = typer.Option(None, "--shard-mb", help="largest shard in MiB"),
    layout: str = typer.Option(
        "hf",
        "--layout",
        help="expert weights per expert as Hugging Face stores them (hf), or stacked as "
        "mlx_lm.convert saves them (mlx); the same for models without experts",
    ),
) -> None:
    """Write a Hugging Face-layout checkpoint of a preset with seeded random weights."""
    import logging

    from coldbench.engine import checkpoints, presets

    logging.basicConfig(level=logging.WARNING)
    try:
        spec = presets.get_preset(preset)
        target = out or checkpoints.preset_path(spec.name, seed=seed, dtype=dtype)
        if quantize is not None and out is None:
            target = target.with_name(f"{target.name}-q{quantize}")
        shard_bytes = shard_mb << 20 if shard_mb else checkpoints.DEFAULT_SHARD_BYTES
        path = checkpoints.create_checkpoint(
            spec.name,
            target,
            dtype=dtype,
            quantize_bits=quantize,
            seed=seed,
            shard_bytes=shard_bytes,
            layout=layout,
        )
    except ValueError as error:  # CheckpointError included
        _fail(str(error))
        return
    typer.echo(str(path))


@model_app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., help="checkpoint directory"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Print architecture, parameter count and config/weights/tokenizer sha256 digests."""
    from coldbench.engine import checkpoints

    try:
        info = checkpoints.inspect_checkpoint(path)
    except ValueError as error:
        _fail(str(error))
        return
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key in ("path", "architecture", "parameters", "dtype", "quantization", "preset"):
        value = info[key]
        table.add_row(key, f"{value:,}" if key == "parameters" else str(value))
    for key in ("config_sha256", "weights_sha256", "tokenizer_sha256"):
        table.add_row(key, str(info[key]))
    Console(width=200).print(table)
