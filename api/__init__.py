"""api: the central service.

Owns the FastAPI app, SQLAlchemy models and services (one module per domain concept: hosts,
jobs, runs, artifacts, evidence, auth), the lease protocol, the content-addressed artifact
store, the Celery app and tasks, and the page routes that render `web/` templates.

May import: `evidence/` and third-party libraries. Never `worker/`, `engine/`, `kernels/` or
`coldbench/` (import-linter contracts in pyproject.toml).
"""
