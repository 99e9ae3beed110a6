"""evidence.contract: what both sides of the service import, and every bundle's files.

Owns what crosses a boundary (`boundary`: the values a message or file may hold), the versioned
schemas (`schemas`: record, manifest, provenance, host info, `JobRequest` with its cross-field
rules and the `JobSpec` that runs), the text a person types for a spec's fields (`spec_text`,
which the schemas validate with), the job's variants and baseline (`variant`), canonical JSON
and digests (`canonical`), records.jsonl (`records`), the typed summary.json
(`summary_schema`), timeline.json (`timeline`), a host's calibration (`calibration`, carried by
the protocol) and the worker protocol (`protocol`: every message between agent and API).

May import: pydantic, numpy, scipy (calibration's F test, on first use) and the standard
library. None of the other rooms of evidence/: every one of them builds on this one.
"""
