"""`coldbench verify [--expect ID] PATH`: recompute every digest of a bundle (folder or zip);
`coldbench compare A B [C...]`: one job's bundles from several hosts, and whether they agree."""

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
    from coldbench.evidence.bundles.bundle import verify_bundle

    result = verify_bundle(path, recompute=recompute, expect=expect)
    if result.is_intact:
        typer.echo(f"intact: {result.evidence_id}, {result.file_count} files")
        return
    for problem in result.problems:
        typer.echo(problem)
    raise typer.Exit(1)


@app.command()
def compare(
    sources: list[str] = typer.Argument(
        ...,
        help="Bundles (folders or zips) or evidence URLs (https://HOST/e/<id>) of one job on "
        "several hosts; a bundle of several runs counts each run.",
    ),
) -> None:
    """Set one job's hosts side by side: each host's ratio and interval per comparison, and
    whether the hosts agree (a test of their difference: ratio of their ratios, Cochran's Q).

    Exits 0 when the hosts agree wherever tested, 1 when they disagree somewhere, 2 when the
    sources cannot be compared (unreadable, altered, or different jobs: what differs is said).
    """
    from coldbench.evidence.bundles.compare import (
        CompareError,
        compare_hosts,
        comparison_lines,
        host_runs,
        load_source,
    )

    try:
        hosts = [host for source in sources for host in host_runs(load_source(source))]
        comparison = compare_hosts(hosts)
    except CompareError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    for line in comparison_lines(comparison):
        typer.echo(line)
    if comparison.disagreements:
        raise typer.Exit(1)
