"""The MLX build this process really loaded: version, where it came from, and the digests of its
native files.

A version string does not name a build: a packaged MLX 0.32.0 shipped without its fast GEMM
kernels and halved users' speed with no visible change of version. So each variant process
fingerprints what it loaded itself:

- the native libraries mapped into this process (Linux: /proc/self/maps; macOS: dyld's image
  list) that belong to MLX: the `mlx.core` extension module, `libmlx` beside it and any library
  loaded from a vendored-library folder beside the package (`mlx_cpu.libs`, a CUDA build's
  backend libraries); each with its sha256 and size. Where the process cannot list its
  images, the extension module and the libraries in `mlx/lib` are hashed instead, and
  `libraries_from` says so;
- on Metal, `mlx.metallib` (the compiled kernels) beside libmlx;
- other GPU libraries loaded (cuBLAS, cuDNN, the CUDA runtime) by path and size, not hashed
  (they are hundreds of MB; their file names carry their versions);
- `origin`: `wheel` (installed by pip/uv from an index or a wheel file), `source` (a local
  directory or VCS install, per PEP 610's direct_url.json), `package` (installed by something
  else: a system or Homebrew-style package) or `unknown` (no installed distribution owns the
  loaded extension module, e.g. a build tree on PYTHONPATH); and whether the loaded extension
  module's bytes equal its distribution's RECORD entry;
- `kernel_count`: None with the reason (MLX exposes no count of the kernels it registers);
- `digest`: one sha256 over the names and digests above, what provenance compares between
  variants (evidence/analysis/builds.py: "variants ran different MLX builds").
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

KERNEL_COUNT_WHY = "MLX exposes no count of the kernels it registers"
# Loaded libraries of the GPU stack beside MLX's own, listed by path and size.
_GPU_LIBRARY_PREFIXES = ("libcublas", "libcudnn", "libcudart", "libnvrtc", "libnccl", "libcuda.")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def loaded_images() -> list[Path] | None:
    """Files mapped into this process as executable images (None: the OS does not say)."""
    maps = Path("/proc/self/maps")
    if maps.exists():
        found: dict[str, None] = {}
        for line in maps.read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                found[parts[5].strip()] = None
        return [Path(p) for p in found]
    if sys.platform == "darwin":
        try:
            dyld = ctypes.CDLL(None)
            dyld._dyld_image_count.restype = ctypes.c_uint32
            dyld._dyld_get_image_name.restype = ctypes.c_char_p
            dyld._dyld_get_image_name.argtypes = [ctypes.c_uint32]
            names = (dyld._dyld_get_image_name(i) for i in range(dyld._dyld_image_count()))
            return [Path(n.decode()) for n in names if n]
        except (OSError, AttributeError):
            return None
    return None


def _owner(core_file: Path) -> tuple[metadata.Distribution, Any] | None:
    """The installed distribution whose RECORD lists `core_file`, with that entry."""
    for distribution in metadata.distributions():
        for entry in distribution.files or ():
            if entry.name != core_file.name:
                continue
            try:
                located = Path(str(distribution.locate_file(entry))).resolve()
            except OSError:
                continue
            if located == core_file:
                return distribution, entry
    return None


def _origin(distribution: metadata.Distribution | None, core_file: Path) -> tuple[str, str]:
    """(origin, what says so): module docstring."""
    if distribution is None:
        return "unknown", f"no installed distribution owns {core_file}"
    name = f"{distribution.metadata['Name']} {distribution.version}"
    direct = distribution.read_text("direct_url.json")
    if direct:
        try:
            value = json.loads(direct)
        except ValueError:
            value = {}
        url = str(value.get("url", ""))
        if "dir_info" in value or "vcs_info" in value:
            editable = (value.get("dir_info") or {}).get("editable")
            return "source", f"{name} from {url}" + (" (editable)" if editable else "")
        return "wheel", f"{name} from {url}"
    installer = (distribution.read_text("INSTALLER") or "").strip()
    packaged = "/Cellar/" in str(core_file) or "/dist-packages/" in str(core_file)
    if installer in ("pip", "uv", "poetry", "pdm", "pipenv") and not packaged:
        wheel = (distribution.read_text("WHEEL") or "").split("\n")
        tags = [line.split(":", 1)[1].strip() for line in wheel if line.startswith("Tag:")]
        return "wheel", f"{name} installed by {installer}" + (f" ({tags[0]})" if tags else "")
    return "package", f"{name} installed by {installer or 'an unnamed installer'}"


def _record_matches(entry: Any, digest: str) -> bool | None:
    """Whether a RECORD entry's sha256 equals `digest` (None: RECORD holds no hash for it)."""
    recorded = getattr(entry, "hash", None)
    if recorded is None or recorded.mode != "sha256":
        return None
    raw = base64.urlsafe_b64decode(recorded.value + "=" * (-len(recorded.value) % 4))
    return raw.hex() == digest


def mlx_build() -> dict[str, Any]:
    """This process's MLX build (module docstring); importing mlx.core first."""
    import mlx.core as mx

    core_file = Path(mx.__file__ or "").resolve()
    package = core_file.parent
    owner = _owner(core_file)
    distribution, entry = owner if owner else (None, None)
    origin, origin_detail = _origin(distribution, core_file)
    # MLX's own folder and the vendored libraries of its wheels (auditwheel's `mlx_cpu.libs`,
    # a CUDA build's `mlx_cuda.libs`), which sit beside it.
    owned_dirs = {package, *(d.resolve() for d in package.parent.glob("mlx*.libs") if d.is_dir())}
    images = loaded_images()
    if images is not None:
        resolved = [p.resolve() for p in images if p.exists()]
        libraries_from = "loaded images"
    else:
        resolved = [core_file, *sorted((package / "lib").glob("libmlx*"))]
        libraries_from = "mlx/lib (this OS does not list a process's images)"
    mine = [p for p in resolved if any(p.is_relative_to(d) for d in owned_dirs)]
    if core_file not in mine:
        mine.insert(0, core_file)
    digests = {p: _sha256(p) for p in mine}
    libraries = [{"path": str(p), "sha256": digests[p], "bytes": p.stat().st_size} for p in mine]
    gpu_libraries = [
        {"path": str(p), "bytes": p.stat().st_size}
        for p in resolved
        if p.name.startswith(_GPU_LIBRARY_PREFIXES) and p not in mine
    ]
    metallib = None
    for candidate in (package / "lib" / "mlx.metallib", package / "mlx.metallib"):
        if candidate.is_file():
            metallib = {"path": str(candidate), "sha256": _sha256(candidate)}
            break
    parts = sorted(f"{p.name} {digest}" for p, digest in digests.items())
    if metallib:
        parts.append(f"mlx.metallib {metallib['sha256']}")
    return {
        "version": getattr(mx, "__version__", None),
        "origin": origin,
        "origin_detail": origin_detail,
        "core_module": str(core_file),
        "record_matches": _record_matches(entry, digests[core_file]) if entry else None,
        "libraries": libraries,
        "libraries_from": libraries_from,
        "gpu_libraries": gpu_libraries,
        "metallib": metallib,
        "kernel_count": None,
        "kernel_count_why": KERNEL_COUNT_WHY,
        "digest": hashlib.sha256("\n".join(parts).encode()).hexdigest(),
    }
