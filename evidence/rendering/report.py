"""report.html: one self-contained file that works offline (jinja2 + plotly).

Every number is in an HTML table that reads without JavaScript; the charts are plotly figures
drawn by plotly.js, inlined from the installed plotly package, or loaded from `plotly_js_src`
when a server serves it as a static file. Nothing is fetched from another site.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from plotly import colors as plotly_colors

from coldbench.evidence.analysis.drift import as_utc
from coldbench.evidence.analysis.history import short
from coldbench.evidence.analysis.peak import fastest_lines
from coldbench.evidence.analysis.telemetry import telemetry_lines
from coldbench.evidence.contract.schemas import Provenance, Record
from coldbench.evidence.contract.spec_text import flags_text
from coldbench.evidence.contract.summary_schema import (
    Commits,
    Comparison,
    ContextDrift,
    History,
    Quantiles,
    Summary,
    Verdict,
)
from coldbench.evidence.rendering.headline import caveats, compared_lines
from coldbench.evidence.rendering.markdown import (
    ComparisonKey,
    answer_sentences,
    canary_lines,
    drift_rate_text,
    evidence_id_line,
    fmt_interval,
    fmt_p,
    fmt_pct,
    fmt_tps,
    fmt_verdict,
    host_line,
    how_to_read,
    inert_lines,
    noise_floor_text,
    reproduction_machines,
    software_line,
    time_spent_lines,
    variant_software_text,
    verdict_rows,
    verify_command,
)

TEMPLATES = Path(__file__).parent / "templates"
_MAX_ROWS = 500
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@functools.cache
def plotly_js() -> str:
    """plotly.js from the installed plotly package (about 4.8 MB), for inlining or serving."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@functools.cache
def _plotly_js_inline() -> str:
    """plotly.js safe inside a <script> element (made once: it is 4.8 MB to scan)."""
    return plotly_js().replace("</script", "<\\/script")


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def prepare() -> None:
    """Build now what every report reuses (plotly's template, plotly.js ready to inline, the
    templates' environment): about 0.6 s of CPU, most of it importing plotly's graph objects,
    that a long-lived process (a Celery worker) pays at start instead of in its first report."""
    _template()
    _plotly_js_inline()
    _environment()


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no `</script>`, no HTML comment openers."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_CSS: dict[str, str] = {
    Verdict.FASTER: "faster",
    Verdict.SLOWER: "slower",
    Verdict.INCONCLUSIVE: "inconclusive",
    Verdict.NO_VALID_PAIRS: "flag",
}


def _css(verdict: str) -> str:
    return _CSS.get(verdict, "")


def _comparison_rows(summary: Summary, key: ComparisonKey) -> list[dict[str, Any]]:
    return [{**row, "css": _css(row["verdict_code"])} for row in verdict_rows(summary, key)]


def _iqr(stats: Quantiles | None) -> str:
    return "n/a" if not stats else f"{fmt_tps(stats.q1)} .. {fmt_tps(stats.q3)}"


def _full_range(stats: Quantiles | None) -> str:
    return "n/a" if not stats else f"{fmt_tps(stats.min)} .. {fmt_tps(stats.max)}"


def _descriptive_rows(summary: Summary) -> list[dict[str, Any]]:
    rows = []
    for row in summary.descriptive:
        prefill, decode, memory = row.prefill_tps, row.decode_tps, row.peak_memory_bytes
        rows.append(
            {
                "context": row.context_tokens,
                "variant": row.variant,
                "n": row.n,
                "prefill_median": fmt_tps(prefill.median if prefill else None),
                "prefill_iqr": _iqr(prefill),
                "prefill_range": _full_range(prefill),
                "decode_median": fmt_tps(decode.median if decode else None),
                "decode_iqr": _iqr(decode),
                "memory": f"{memory.max / 2**20:,.1f} MiB" if memory else "n/a",
            }
        )
    return rows


def provenance_digests(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Every sha256 in a provenance document, by its dotted path."""
    found: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            found += provenance_digests(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            found += provenance_digests(item, f"{prefix}[{position}]")
    elif isinstance(value, str) and _SHA256.match(value):
        found.append((prefix, value))
    return found


def _provenance_view(provenance: Provenance) -> dict[str, Any]:
    document = provenance.model_dump(mode="json", by_alias=True)
    host = {k: v for k, v in document["host"].items() if v is not None}
    software = {k: v for k, v in document["software"].items() if v is not None}
    model = {k: v for k, v in document["model"].items() if v is not None and "sha256" not in k}
    corpus = {k: v for k, v in (document.get("corpus") or {}).items() if k != "sha256" and v}
    facts = [
        ("created", document["created_at"]),
        *((f"host.{k}", v) for k, v in host.items()),
        *((f"software.{k}", v) for k, v in software.items() if "sha256" not in k),
        *((f"model.{k}", v) for k, v in model.items()),
        # which prompt corpus ran (its digest is listed with the other digests)
        *((f"corpus.{k}", v) for k, v in corpus.items()),
    ]
    return {
        "run_id": provenance.run_id,
        "host_line": host_line(provenance),
        "software_line": software_line(provenance),
        "facts": facts,
        "targets": [
            {
                **target,
                "flags": flags_text(target["flags"], empty="defaults"),
                "software_text": variant_software_text(target.get("software")).replace("`", ""),
            }
            for target in document["targets"]
        ],
        "digests": provenance_digests(document),
        "command": provenance.command,
    }


def _layout(title_x: str, title_y: str, **extra: Any) -> dict[str, Any]:
    return {
        "template": _template(),
        "xaxis": {"title": {"text": title_x}},
        "yaxis": {"title": {"text": title_y}},
        "margin": {"t": 30},
        "legend": {"orientation": "h"},
        **extra,
    }


@functools.cache
def _template() -> Any:
    """plotly's `plotly_white` template as the JSON that plotly.js draws with (the Python
    package expands a named template into every figure; plotly.js knows no names)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    return json.loads(pio.to_json(go.Figure(layout={"template": "plotly_white"})))["layout"][
        "template"
    ]


# Figures are plotly's JSON built as plain dicts, the shape `plotly.io.to_json` gives for the
# same go.Figure: plotly's graph objects validate and copy every value on assignment, which
# for the ten thousand points of a large job cost more than its statistics.


def _figure(layout: dict[str, Any]) -> dict[str, Any]:
    return {"data": [], "layout": layout}


def _hline(figure: dict[str, Any], y: float, dash: str, color: str) -> None:
    """`go.Figure.add_hline`: a line across the plot at `y`."""
    figure["layout"].setdefault("shapes", []).append(
        {
            "line": {"color": color, "dash": dash},
            "type": "line",
            "x0": 0,
            "x1": 1,
            "xref": "x domain",
            "y0": y,
            "y1": y,
            "yref": "y",
        }
    )


def _vline(figure: dict[str, Any], x: float, dash: str, color: str) -> None:
    """`go.Figure.add_vline`: a line across the plot at `x`."""
    figure["layout"].setdefault("shapes", []).append(
        {
            "line": {"color": color, "dash": dash},
            "type": "line",
            "x0": x,
            "x1": x,
            "xref": "x",
            "y0": 0,
            "y1": 1,
            "yref": "y domain",
        }
    )


def _error_y(high: list[float], low: list[float]) -> dict[str, Any]:
    return {"array": high, "arrayminus": low, "symmetric": False, "type": "data"}


def _interval_bars(rows: Sequence[tuple[float, float | None, float | None]]) -> dict[str, Any]:
    """Error bars of (median, low, high) intervals; a missing bound draws no bar."""
    return _error_y(
        [(high or median) - median for median, _, high in rows],
        [median - (low or median) for median, low, _ in rows],
    )


def history_figure(history: History) -> dict[str, Any]:
    """The paired ratio of each commit to the reference, in commit order, with its interval;
    one line per context; each step (neighbouring intervals apart) marked."""
    labels = [short(c.commit, c.variant) for c in history.commits]
    figure = _figure(_layout("commit (oldest first)", "ratio to the reference (95% CI)"))
    for series in history.series:
        measured = [
            (label, p.ratio_median, p.ci_low, p.ci_high)
            for label, p in zip(labels, series.points, strict=True)
            if p.ratio_median is not None
        ]
        figure["data"].append(
            {
                "error_y": _interval_bars([(m, low, high) for _, m, low, high in measured]),
                "mode": "lines+markers",
                "name": f"{series.context_tokens} tokens",
                "x": [label for label, *_ in measured],
                "y": [m for _, m, *_ in measured],
                "type": "scatter",
            }
        )
    for step in history.steps:
        _vline(
            figure,
            labels.index(short(step.to_commit, step.to_variant)) - 0.5,
            "dot",
            "#b3261e",
        )
    _hline(figure, 1.0, "dash", "#888")
    figure["layout"]["xaxis"].update(type="category", categoryorder="array", categoryarray=labels)
    return figure


def _history_view(history: History) -> dict[str, Any]:
    commits = {c.variant: c for c in history.commits}
    rows = []
    for series in history.series:
        for point in series.points:
            commit = commits[point.variant]
            rows.append(
                {
                    "context": series.context_tokens,
                    "commit": short(commit.commit, commit.variant),
                    "subject": commit.subject or "",
                    "interval": "did not build" if commit.skipped else fmt_interval(point),
                    "n": point.n,
                    "verdict": "skipped" if commit.skipped else fmt_verdict(point),
                    "css": _css(point.verdict or ""),
                }
            )
    return {
        "reference": short(history.reference.commit, history.reference.variant),
        "range": history.range,
        "rule": history.rule,
        "rows": rows,
        "steps": [
            {
                "context": step.context_tokens,
                "from": short(step.from_commit, step.from_variant),
                "to": short(step.to_commit, step.to_variant),
                "subject": step.subject or "",
                "ratios": f"{step.from_ratio:.3f} to {step.to_ratio:.3f}",
                "direction": step.direction,
            }
            for step in history.steps
        ],
        "change_points": [
            {
                "context": cut.context_tokens,
                "at": short(cut.commit, cut.variant),
                "over": f"{cut.first_variant} .. {cut.last_variant}",
                "levels": f"{cut.level_before:.3f} to {cut.level_after:.3f}",
                "kind": cut.kind,
            }
            for cut in history.change_points or []
        ],
        "change_point_rule": history.change_point_rule,
        "skipped": [
            {"commit": short(c.commit, c.variant), "reason": c.skipped}
            for c in history.commits
            if c.skipped
        ],
    }


def _commits_view(commits: Commits) -> dict[str, Any]:
    """The commits section as display strings: one row per (context, commit), the sums, and
    each tree the host made with its provenance (and, where it failed, the log's tail)."""
    alone = {(a.context_tokens, a.position): a for a in commits.alone}
    marginals = {(m.context_tokens, m.position): m for m in commits.marginals}
    contexts = [a.context_tokens for a in commits.additivity]
    rows = []
    for context in contexts:
        for entry in commits.commits:
            m = marginals.get((context, entry.position))
            only = alone.get((context, entry.position))
            parity = entry.parity
            rows.append(
                {
                    "context": context,
                    "position": entry.position,
                    "commit": entry.commit[:10],
                    "subject": entry.subject or "",
                    "interval": fmt_interval(m) if m else "not separable",
                    "p": fmt_p(m.p_adjusted) if m else "",
                    "n": m.n if m else 0,
                    "verdict": fmt_verdict(m) if m else entry.not_separable or "",
                    "css": _css(m.verdict) if m else "flag",
                    "alone": (f"{fmt_interval(only)} {only.verdict}" if only else "n/a")
                    if entry.alone
                    else None,
                    "parity": f"{parity.exact} exact, {parity.accepted} accepted, "
                    f"{parity.diverged} diverged",
                }
            )
    trees = []
    for entry in commits.commits:
        for name, tree, why in (
            (entry.without, entry.tree, entry.not_separable),
            (entry.alone, entry.alone_tree, entry.alone_not_separable),
        ):
            if not name or tree is None:
                continue
            trees.append(
                {
                    "variant": name,
                    "change": "reverted from" if tree.change == "revert" else "picked onto",
                    "onto": tree.onto,
                    "commit": tree.commit,
                    "position": entry.position,
                    "tree": tree.tree or "",
                    "conflicts": tree.conflicts,
                    "why": why or "",
                    "tail": tree.failure_tail or "",
                }
            )
    return {
        "base": (commits.base.commit or "")[:10],
        "head": (commits.head.commit or "")[:10],
        "rows": rows,
        "has_alone": any(e.alone for e in commits.commits),
        "sums": [
            {
                "context": a.context_tokens,
                "total": fmt_pct(a.total_pct),
                "sum": fmt_pct(a.sum_of_marginals_pct),
                "interaction": fmt_pct(a.interaction_pct),
                "measured": f"{a.marginals} of {a.commits}",
                "alone": fmt_pct(a.sum_alone_pct) if a.sum_alone_pct is not None else None,
            }
            for a in commits.additivity
        ],
        "trees": trees,
        "note": commits.note,
    }


def commits_figure(commits: Commits) -> dict[str, Any]:
    """Each commit's marginal (head / head without it - 1) with its interval, per context."""
    figure = _figure(_layout("commit", "head / head without it (95% CI)"))
    labels = [f"c{e.position} {e.commit[:7]}" for e in commits.commits]
    for context in [a.context_tokens for a in commits.additivity]:
        entries = [
            (f"c{m.position} {m.commit[:7]}", m.ratio_median, m.ci_low, m.ci_high)
            for m in commits.marginals
            if m.context_tokens == context and m.ratio_median is not None
        ]
        figure["data"].append(_leave_one_out_bars(context, entries))
    figure["layout"]["xaxis"].update(type="category", categoryorder="array", categoryarray=labels)
    return figure


def _leave_one_out_bars(
    context: int, entries: Sequence[tuple[str, float, float | None, float | None]]
) -> dict[str, Any]:
    """One context's bars of (label, median ratio, low, high), each ratio of a whole to the
    whole without one part (an ablation's feature, a PR's commit): drawn from 1, with its
    interval."""
    return {
        "base": 1,
        "error_y": _interval_bars([(m, low, high) for _, m, low, high in entries]),
        "name": f"{context} tokens",
        "x": [label for label, *_ in entries],
        "y": [m - 1 for _, m, *_ in entries],
        "type": "bar",
    }


def build_figures(summary: Summary, records: Iterable[Record]) -> list[dict[str, Any]]:
    """The report's plotly figures as {id, title, spec} (spec = plotly's JSON)."""
    palette = plotly_colors.qualitative.Plotly
    # One colour per variant in every chart.
    color = {v: palette[i % len(palette)] for i, v in enumerate(summary.variants)}
    figures = []
    tps = _figure(_layout("context tokens", "prefill tok/s (median, bars: quartiles)"))
    for variant in summary.variants:
        quartiles = [
            (r.context_tokens, r.prefill_tps)
            for r in summary.descriptive
            if r.variant == variant and r.prefill_tps is not None
        ]
        tps["data"].append(
            {
                "error_y": _error_y(
                    [q.q3 - q.median for _, q in quartiles if q],
                    [q.median - q.q1 for _, q in quartiles if q],
                ),
                "line": {"color": color[variant]},
                "marker": {"color": color[variant]},
                "mode": "lines+markers",
                "name": variant,
                "x": [context for context, _ in quartiles],
                "y": [q.median for _, q in quartiles if q],
                "type": "scatter",
            }
        )
    tps["layout"]["xaxis"]["type"] = "log"
    figures.append({"id": "fig-tps", "title": "Prefill tok/s against context", "spec": tps})

    ratio = _figure(_layout("context tokens", "paired ratio to the baseline (95% CI)"))
    strips = _figure(_layout("variant @ context", "per-round paired ratio"))
    by_variant: dict[str, list[Comparison]] = defaultdict(list)
    for c in summary.comparisons:
        by_variant[c.variant].append(c)
        strips["data"].append(
            {
                "boxpoints": "all",
                "fillcolor": "rgba(0,0,0,0)",
                "jitter": 0.4,
                "line": {"color": color.get(c.variant, "#444"), "width": 1},
                "marker": {"color": color.get(c.variant, "#444")},
                "name": f"{c.variant} @ {c.context_tokens}",
                "pointpos": 0,
                "showlegend": False,
                "text": [f"run {r.run_id} round {r.round}" for r in c.ratios],
                "y": [r.ratio for r in c.ratios],
                "type": "box",
            }
        )
    for variant, comparisons in by_variant.items():
        points = [
            (c.context_tokens, c.ratio_median, c.ci_low, c.ci_high)
            for c in comparisons
            if c.ratio_median is not None
        ]
        ratio["data"].append(
            {
                "error_y": _interval_bars([(m, low, high) for _, m, low, high in points]),
                "line": {"color": color[variant]},
                "marker": {"color": color[variant]},
                "mode": "lines+markers",
                "name": variant,
                "x": [context for context, *_ in points],
                "y": [m for _, m, *_ in points],
                "type": "scatter",
            }
        )
    for figure in (ratio, strips):
        _hline(figure, 1.0, "dash", "#888")
    ratio["layout"]["xaxis"]["type"] = "log"
    figures.append({"id": "fig-ratio", "title": "Paired ratio against context", "spec": ratio})
    figures.append({"id": "fig-strips", "title": "Per-round ratios", "spec": strips})

    timeline = _figure(
        _layout("wall time (UTC)", "prefill tok/s / baseline median at that context")
    )
    measured = sorted(
        (r for r in records if r.status == "ok" and r.round >= 0 and r.prefill_tps),
        key=lambda r: as_utc(r.started_at),
    )
    reference: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in measured:
        if record.variant == summary.baseline:
            reference[(record.run_id, record.context_tokens)].append(record.prefill_tps or 0.0)
    medians = {key: sorted(values)[len(values) // 2] for key, values in reference.items()}
    by_variant_points: dict[str, list[Record]] = defaultdict(list)
    for record in measured:
        if (record.run_id, record.context_tokens) in medians:
            by_variant_points[record.variant].append(record)
    for variant in summary.variants:
        cells = by_variant_points.get(variant)
        if not cells:
            continue
        timeline["data"].append(
            {
                "line": {"color": color[variant]},
                "marker": {"color": color[variant]},
                "mode": "lines+markers" if variant == summary.baseline else "markers",
                "name": variant,
                "text": [f"{r.run_id} round {r.round} ctx {r.context_tokens}" for r in cells],
                "x": [r.started_at.isoformat() for r in cells],
                "y": [
                    (r.prefill_tps or 0.0) / medians[(r.run_id, r.context_tokens)] for r in cells
                ],
                "type": "scatter",
            }
        )
    figures.append({"id": "fig-drift", "title": "Drift timeline", "spec": timeline})

    if summary.history:
        figures.append(
            {
                "id": "fig-history",
                "title": "Ratio to the reference along the history",
                "spec": history_figure(summary.history),
            }
        )

    if summary.commits:
        figures.append(
            {
                "id": "fig-commits",
                "title": "Each commit left out of head",
                "spec": commits_figure(summary.commits),
            }
        )

    ablation = summary.ablation
    if ablation:
        bars = _figure(_layout("feature", "all / all-minus-feature (95% CI)"))
        for context in summary.contexts:
            entries = [
                (e.feature, e.ratio_median, e.ci_low, e.ci_high)
                for e in ablation.entries
                if e.context_tokens == context and e.ratio_median is not None
            ]
            bars["data"].append(_leave_one_out_bars(context, entries))
        figures.append({"id": "fig-ablation", "title": "Ablation", "spec": bars})
    return figures


def render_report_html(
    summary: Summary,
    records: Sequence[Record],
    provenance_list: Sequence[Provenance],
    evidence_id: str | None,
    *,
    plotly_js_src: str | None = None,
    file_digests: Mapping[str, str] | None = None,
    page_header_html: str | None = None,
    page_script_src: str | None = None,
) -> str:
    """report.html for a summary. With `plotly_js_src` the page loads plotly.js from that URL
    (a server's static file) instead of inlining it; `file_digests` lists bundle files.

    A server showing the report as a page adds `page_header_html` (trusted markup rendered
    first in the body: its buttons) and `page_script_src` (one more script of its own)."""
    figures = build_figures(summary, records)
    reproductions = summary.reproductions
    reproduction_rows = []
    reproduction_hosts: list[str] = []
    if reproductions:
        reproduction_hosts = [r.host or r.run_id for r in reproductions.comparisons[0].runs]
        reproduction_rows = [
            {
                "context": row.context_tokens,
                "variant": row.variant,
                "cells": [f"{fmt_interval(r)} {r.verdict}" for r in row.runs],
                "agree": row.agree,
                "statement": row.statement
                or ("intervals overlap" if row.agree else "intervals apart"),
                "detail": row.test.detail if row.test else "-",
            }
            for row in reproductions.comparisons
        ]
    ablation = summary.ablation
    context = {
        "summary": summary,
        "evidence_id": evidence_id,
        "evidence_line": evidence_id_line(evidence_id).replace("`", ""),
        "verify_command": verify_command(evidence_id),
        "variants": [v for v in summary.variants if v != summary.baseline],
        "provenances": [_provenance_view(p) for p in provenance_list],
        "how_to_read": how_to_read(summary.settings),
        "headline": answer_sentences(summary, compact=len(summary.variants) > 6),
        "compared": compared_lines(summary, provenance_list),
        "caveats": caveats(summary),
        "bisect": summary.bisect,
        "history": _history_view(summary.history) if summary.history else None,
        "commits": _commits_view(summary.commits) if summary.commits else None,
        "prefill_rows": _comparison_rows(summary, "comparisons"),
        "decode_rows": _comparison_rows(summary, "decode_comparisons"),
        "descriptive_rows": _descriptive_rows(summary),
        "inert_lines": inert_lines(summary),
        "ablation": ablation,
        "ablation_rows": [
            {
                "context": e.context_tokens,
                "feature": e.feature,
                "interval": fmt_interval(e),
                "p": fmt_p(e.p_adjusted),
                "n": e.n,
                "verdict": fmt_verdict(e),
                "css": _css(e.verdict),
            }
            for e in (ablation.entries if ablation else [])
        ],
        "noise_floor": noise_floor_text(summary),
        "time_spent": time_spent_lines(summary),
        "drift_rows": [
            {
                "run_id": run.run_id
                + (f" @ {line.context_tokens}" if isinstance(line, ContextDrift) else ""),
                "n": line.n,
                "slope": drift_rate_text(line),
                "across": fmt_pct(line.drift_pct_across_run),
                "threshold": f"{summary.drift.threshold_pct:.2f}%",
                "flagged": line.flagged,
            }
            for run in summary.drift.runs
            for line in [run, *(run.by_context or [])]
        ],
        "bracketing_rows": [
            {
                "context": row.context_tokens,
                "variant": row.variant,
                "n": row.n,
                "interval": fmt_interval(row),
            }
            for row in summary.drift.bracketing
        ],
        "reproduction_rows": reproduction_rows,
        "reproduction_hosts": reproduction_hosts,
        "reproduction_rule": reproductions.rule if reproductions else None,
        "reproduction_machines": reproduction_machines(provenance_list) if reproductions else [],
        "parity_rows": [c for c in summary.parity.cells if c.result != "exact"][:_MAX_ROWS],
        "invalid_cells": summary.invalid.cells[:_MAX_ROWS],
        "canary_lines": canary_lines(summary.canary) if summary.canary else [],
        "peak": summary.peak,
        "telemetry_lines": telemetry_lines(summary.telemetry) if summary.telemetry else [],
        "peak_lines": fastest_lines(summary.peak) if summary.peak else [],
        "file_digests": sorted((file_digests or {}).items()),
        "figures": figures,
        "figures_json": _script_json(figures),
        "plotly_js_src": plotly_js_src,
        "page_header_html": page_header_html,
        "page_script_src": page_script_src,
        "plotly_js_inline": "" if plotly_js_src else _plotly_js_inline(),
    }
    return _environment().get_template("report.html.j2").render(**context)
