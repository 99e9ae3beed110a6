"""worker: the benchmark host's agent and the single-machine `coldbench run`.

Owns registration, heartbeat, the lease loop, the host fingerprint, checkouts and isolated
builds, scheduling cells into balanced rounds, driving the engine's variant processes,
spooling records and uploading artifacts with checksums. The bundle itself is assembled by
`coldbench.evidence.bundles.bundle.build_run_bundle` (the one assembly the service also uses), and
every message to the server is a model of `coldbench.evidence.contract.protocol`.

May import: `engine/`, `evidence/`, httpx and the standard library. Never `api/`: the worker
speaks to the server only over HTTP, through the contract in `evidence/`.
"""
