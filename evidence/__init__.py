"""evidence: the shared data contract and everything computed from raw records, in five rooms.

- `contract`: what both sides import: schemas (record, manifest, provenance, `JobRequest` and
  the `JobSpec` it resolves to), the
  text of a spec's fields, variants, canonical JSON, records.jsonl, the typed summary,
  timeline.json, a host's calibration and the worker protocol.
- `analysis`: the paired statistics, the verdict rules, the sections and the one assembly of
  summary.json.
- `spec`: the job options, the one builder of a `JobRequest` and the one resolver to a
  `JobSpec`, the adapters' engine flags,
  host-declared server options, the specs a host resolves.
- `rendering`: escaping, the headline, summary.md and report.html.
- `bundles`: bundles (assembly, write, read, verify), compare, and the `verify` and `compare`
  commands.

Layered, lowest first (one import-linter `layers` contract in pyproject.toml): contract <
analysis < spec | rendering < bundles; spec and rendering import none of each other. Nothing
imports upward, so nothing needs a lazy import to dodge a cycle.

May import: pydantic, scipy, numpy, ruptures, jinja2, plotly, typer, httpx and the standard
library. Never `api/`, `worker/`, `web/`, `engine/`, `kernels/` or `coldbench/`: both sides of
the worker protocol import this package, so it must stay free of either (import-linter
contracts in pyproject.toml enforce it).
"""
