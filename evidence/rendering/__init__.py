"""evidence.rendering: a summary made readable, summary.md and report.html.

Owns escaping of text from hosts and submitters (`escaping`), a report's first screen beside
its answer (`headline`), summary.md (`markdown`) and report.html with its template
(`report`, `templates/`).

May import: evidence.contract, evidence.analysis, jinja2, plotly and the standard library;
never the spec or bundles rooms.
"""
