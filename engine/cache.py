"""Where the engine caches what it writes once per host: the models root.

Synthetic checkpoints (`coldbench.engine.checkpoints`) and the built-in corpus's text
(`coldbench.engine.corpus`) both live under it; a leaf of its own, so neither of those two
modules imports the other for it. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path


def models_root() -> Path:
    """Where presets are written once and cached: $COLDBENCH_MODEL_DIR or ~/.cache/..."""
    configured = os.environ.get("COLDBENCH_MODEL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "coldbench" / "models"
