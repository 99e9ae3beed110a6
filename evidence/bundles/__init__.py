"""evidence.bundles: evidence bundles and the commands on them.

Owns a bundle's one assembly, write, read and verify, folder and zip (`bundle`), one job's
bundles from several hosts (`compare`) and `coldbench verify` / `coldbench compare` (`cli`).

May import: every other room of evidence/, typer, httpx (`compare` fetching an evidence URL's
zip) and the standard library.
"""
