"""coldbench: the command line that ties the packages together.

Owns the `coldbench` CLI (one typer app mounting each package's commands), the version, and
the two commands that span every package: `demo` (the whole loop on the embedded default) and
`submit` (a submitter's HTTP client), and `model` (synthetic checkpoints). May import every
package; no package imports it (import-linter, pyproject.toml).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("coldbench")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.1.0"
