"""Import mlx-lm's model code without its package `__init__`, which pulls in transformers.

`import mlx_lm` (and so `import mlx_lm.models.llama`) runs the package's `__init__`, which
imports `mlx_lm.generate` and `mlx_lm.tokenizer_utils`, and with them transformers: most of a
variant process's start (docs/PERFORMANCE.md, "`coldbench demo` on a 2-core CPU"). The embedded
engine needs only the model classes, the KV cache and `mlx_lm.utils.load_model`; a synthetic
checkpoint's tokenizer is a plain `tokenizer.json` that the `tokenizers` library reads by itself,
with the same ids (the prompts call the same backend tokenizer either way:
coldbench.engine.prompts.batch_encoder).

`install()` registers `mlx_lm` as a bare package (its real `__path__`, `__file__` and
`__version__`, no `__init__` run) and `mlx_lm.tokenizer_utils` as a stand-in whose loader says
why it cannot load a tokenizer. `load()` imports `mlx_lm.utils` with a stand-in for
`huggingface_hub` (whose `snapshot_download` that module binds at import, pulling in the hub
client and its HTTP stack: more than the rest of a tiny model's load on a CPU), removed again
afterwards: a local checkpoint is never downloaded. `install()` must run before anything
imports mlx_lm, and only in a process that never needs mlx-lm's own tokenizer or generate
loop: the runner decides from the plan before its imports (`is_lean_plan`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGE = "mlx_lm"
_TOKENIZER_UTILS = f"{PACKAGE}.tokenizer_utils"


class LeanImportError(RuntimeError):
    """mlx-lm's tokenizer or generate loop was asked for in a lean process."""


def is_synthetic_checkpoint(path: Path | str) -> bool:
    """A checkpoint written by `coldbench model create` (config.json says so) with a
    `tokenizer.json`: its tokenizer is a plain byte-level BPE that needs no transformers."""
    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(config, dict)
        and isinstance(config.get("coldbench"), dict)
        and (folder / "tokenizer.json").is_file()
    )


def is_lean_plan(adapter: str, model: str) -> bool:
    """The embedded engine on a synthetic checkpoint (a folder or `preset:NAME` already
    written): nothing in that process needs transformers."""
    if adapter != "embedded":
        return False
    if model.startswith("preset:"):
        from coldbench.engine.checkpoints import preset_path

        try:
            return is_synthetic_checkpoint(preset_path(model.removeprefix("preset:")))
        except ValueError:
            return False
    return is_synthetic_checkpoint(model)


def is_installed() -> bool:
    return getattr(sys.modules.get(PACKAGE), "__coldbench_lean__", False) is True


def install() -> bool:
    """Register the bare package (module docstring); False when mlx_lm was already imported
    for real (then nothing changes) or is not installed."""
    if is_installed():
        return True
    if PACKAGE in sys.modules:
        return False
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return False
    package = types.ModuleType(PACKAGE, "mlx-lm's model code, imported without its __init__")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__package__ = PACKAGE
    package.__spec__ = spec
    package.__coldbench_lean__ = True  # type: ignore[attr-defined]
    sys.modules[PACKAGE] = package
    stand_in = types.ModuleType(_TOKENIZER_UTILS, "stand-in: no transformers in this process")
    stand_in.TokenizerWrapper = _NoTokenizer  # type: ignore[attr-defined]
    stand_in.load = _no_tokenizer  # type: ignore[attr-defined]
    sys.modules[_TOKENIZER_UTILS] = stand_in
    package.tokenizer_utils = stand_in  # type: ignore[attr-defined]
    version = importlib.import_module(f"{PACKAGE}._version")
    package.__version__ = getattr(version, "__version__", None)  # type: ignore[attr-defined]
    return True


class _NoTokenizer:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_tokenizer()


def _no_tokenizer(*args: Any, **kwargs: Any) -> Any:
    raise LeanImportError(
        "mlx-lm's tokenizer is not loaded in this process (coldbench.engine.lean: the embedded "
        "engine on a synthetic checkpoint reads tokenizer.json with the tokenizers library)"
    )


_HUB = "huggingface_hub"


@contextlib.contextmanager
def _no_hub() -> Iterator[None]:
    """`huggingface_hub` as a stand-in while mlx_lm.utils imports, unless it is loaded already;
    a later import in this process gets the real package."""
    if _HUB in sys.modules:
        yield
        return
    stand_in = types.ModuleType(_HUB, "stand-in: a lean process loads local checkpoints only")
    stand_in.snapshot_download = _no_download  # type: ignore[attr-defined]
    sys.modules[_HUB] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_HUB) is stand_in:
            del sys.modules[_HUB]


def _no_download(*args: Any, **kwargs: Any) -> Any:
    raise LeanImportError("a lean process loads local checkpoints only; nothing is downloaded")


def load(path: Path | str) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config) of a synthetic checkpoint: mlx-lm's `load_model` (the same
    model classes, sanitize and quantization as `mlx_lm.utils.load`), the weights read by
    `checkpoints.fill_weights`, and the checkpoint's tokenizer.json through the tokenizers
    library."""
    from tokenizers import Tokenizer

    with _no_hub():
        from mlx_lm.utils import load_model

    from coldbench.engine.checkpoints import fill_weights

    folder = Path(path)
    model, config = load_model(folder, lazy=True)
    fill_weights(model, folder, config)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return model, tokenizer, config
