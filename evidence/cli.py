"""`coldbench verify [--expect ID] PATH`: recompute every digest of a bundle (folder or zip)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(add_completion=False)


@app.command()
def verify(
    path: Path = typer.Argument(..., help="An evidence bundle: its folder or its zip."),
    recompute: bool = typer.Option(
        False, "--recompute", help="Also recompute the statistics from the records and compare."
    ),
    expect: str | None = typer.Option(
        None,
        "--expect",
        help="The evidence id you were given: fail unless the bundle is that evidence.",
    ),
) -> None:
    """Check an evidence bundle: every file's sha256, every record, the provenance.

    Exits 0 and prints `intact: <evidence_id>, N files` when nothing was altered; otherwise
    exits 1 with one line per missing, extra or altered file (and per invalid record).
    `--recompute` also checks that summary.json follows from records.jsonl; `--expect ID`
    that the bundle's evidence id is ID (a bundle swapped for another intact one fails).
    """
    from evidence.bundle import verify_bundle

    result = verify_bundle(path, recompute=recompute, expect=expect)
    if result.is_intact:
        typer.echo(f"intact: {result.evidence_id}, {result.file_count} files")
        return
    for problem in result.problems:
        typer.echo(problem)
    raise typer.Exit(1)
