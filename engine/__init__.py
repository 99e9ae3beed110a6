"""engine: the embedded inference engine under test and the cold-prefill cell.

Owns model loading (Hugging Face layout from a local path), synthetic checkpoints, the prompt
corpora and prompt windows, the memory estimate that refuses a context before it runs, the
cold-prefill cell with its counters, engine flags, backend detection, the adapters that drive
other targets (`mlx-lm` checkouts, `openai-server` commands) and the variant process
(`python -m coldbench.engine.runner`).

May import: mlx, mlx-lm, numpy, the standard library and `kernels/`. Nothing of HTTP, pydantic,
the database, `evidence/`, `worker/` or `api/`: the GPU hosts run it with mlx, mlx-lm and numpy
alone. A record is made in one place, `coldbench.engine.record` (standard-library dataclasses), and
leaves this package as the JSON object of DESIGN.md's record.
"""
