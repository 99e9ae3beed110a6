"""evidence: the shared data contract and everything computed from raw records.

Owns the versioned schemas (record, manifest, provenance, job spec, with every cross-field rule
in JobSpec's validator), the worker protocol (`protocol.py`: every message between agent and
API, the API prefix and long-poll bound, job and run states), the one parser of what people type
for a spec (`spec_text.py`: variants, contexts with K/M, flags, features), the flags each
adapter's engine takes (`engine_flags.py`, checked at submit), the one builder from a
job's options to a spec (`job_options.py`: the options every front end offers, their defaults
per mode, every problem in one pass), host-declared server
options (`options.py`: the declaration, value validation, argv/env rendering), canonical JSON and
digests, evidence bundles (one assembly; write, read, verify; folder and zip), statistics,
ablation, parity, drift, reproductions, and rendering (summary.json, summary.md, report.html).

Inside, the statistics are layered (an import-linter `layers` contract): `summary_schema` (the
typed summary.json) < `stats` (primitives) < the sections (`ablation`, `bisect`, `drift`,
`history`, `parity`, `reproduction`; none imports another, and `agreement`, the test of
several hosts' difference, sits below them) < `summary` (the one assembly) < `markdown` <
`report` < `bundle` < `compare` (one job's bundles from several hosts) < `cli`, with
`calibration`, `protocol`, `job_options` and `resolution` placed among them by what they
read; the foundations (`schemas`, `spec_text`, `variant`, `records`, `canonical`, `options`,
`escaping`, `engine_flags`) import none of those. Nothing imports upward, so nothing needs a
lazy import to dodge a cycle.

May import: pydantic, scipy, numpy, jinja2, plotly, typer (its `verify` and `compare`
commands, the spec options' declarations), httpx (`compare` fetching an evidence URL's zip)
and the standard library. Never `api/`, `worker/`, `web/`, `engine/`,
`kernels/` or `coldbench/`: both sides of the worker protocol import this package, so it must
stay free of either (import-linter contracts in pyproject.toml enforce it).
"""
