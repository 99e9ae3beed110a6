"""evidence: the shared data contract and everything computed from raw records.

Owns the versioned schemas (record, manifest, provenance, job spec), host-declared server
options (`options.py`: the declaration, value validation, argv/env rendering), canonical JSON and
digests, evidence bundles (write, read, verify; folder and zip), statistics, ablation, parity,
drift, reproductions, and rendering (summary.json, summary.md, report.html).

May import: pydantic, scipy, numpy, jinja2, plotly and the standard library. Never `api/`,
`worker/`, `web/` or `engine/`: both sides of the worker protocol import this package, so it
must stay free of either.
"""
