"""Synthetic checkpoints in Hugging Face layout, their digests, and model name resolution.

A checkpoint written here is loaded by `mlx_lm.utils.load` exactly like a user's: config.json,
model.safetensors (or shards with model.safetensors.index.json), and the files of a byte-level
BPE tokenizer trained locally on the corpus of `coldbench.engine.corpus`. Weights are random but
deterministic: each tensor is drawn from its own PCG64 stream keyed by (seed, tensor name) and
rounded to the target dtype with numpy's IEEE arithmetic, so two hosts writing the same preset
and seed produce the same bytes and digests (quantized checkpoints are quantized on the CPU
stream for the same reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import logging
import math
import os
import shutil
import struct
import tempfile
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from coldbench.engine import corpus
from coldbench.engine.cache import models_root
from coldbench.engine.presets import DTYPES, PRESETS, Preset, get_preset
from coldbench.engine.record import one_line

if TYPE_CHECKING:  # at run time numpy is imported where weights are written, not by a
    import numpy as np  # variant process that only loads them

log = logging.getLogger(__name__)

WEIGHTS_VERSION = "coldbench-weights/1"
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")
DEFAULT_SHARD_BYTES = 5 << 30
DIGEST_CACHE_NAME = ".coldbench-digests.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "uint32": "U32",
    "int32": "I32",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
}
_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "U16": 2}


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or cannot be loaded; the message is one line."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "ones", "zeros", "embedding", "linear"
    fan_in: int = 1
    zero_rows: int = 0  # leading rows set to zero (special tokens in the lm_head)


# ---------------------------------------------------------------------------------------------
# model cache and name resolution


def preset_path(preset: str, *, seed: int = 0, dtype: str | None = None) -> Path:
    spec = get_preset(preset)
    return models_root() / f"{spec.name}-{seed}-{dtype or spec.default_dtype}"


def resolve_model(name: str, models: dict[str, str]) -> Path:
    """`preset:NAME` -> the cached synthetic checkpoint (written on first use); a name of the
    host's `models` table -> its path. Anything else is a ValueError listing the known names."""
    if name.startswith("preset:"):
        preset = name.removeprefix("preset:")
        if preset not in PRESETS:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(_known(models))}")
        path = preset_path(preset)
        if not (path / "config.json").is_file():
            try:
                create_checkpoint(preset, path)
            except (OSError, ValueError):
                # another process wrote the same preset meanwhile: same seed, same bytes
                if not (path / "config.json").is_file():
                    raise
        return path
    if name in models:
        path = Path(models[name]).expanduser()
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model {name!r} maps to {path}, which has no config.json")
        return path
    raise ValueError(f"unknown model {name!r}; known: {', '.join(_known(models))}")


def _known(models: dict[str, str]) -> list[str]:
    return [f"preset:{p}" for p in sorted(PRESETS)] + sorted(models)


# ---------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on the corpus (deterministic, about a second)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus.paragraphs()), trainer)
    return tokenizer


def _write_tokenizer(out: Path, tokenizer: Any, max_length: int) -> None:
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    bos, eos, pad = SPECIAL_TOKENS
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json", {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    )


# ---------------------------------------------------------------------------------------------
# weights


def build_config(preset: Preset, dtype: str, tokenizer_vocab: int, seed: int) -> dict[str, Any]:
    config = dict(preset.config)
    if preset.vocab_from_tokenizer:
        config["vocab_size"] = tokenizer_vocab
    config["torch_dtype"] = dtype
    config["bos_token_id"] = 0
    config["eos_token_id"] = 1
    config["pad_token_id"] = 2
    config["coldbench"] = {"preset": preset.name, "seed": seed, "generator": WEIGHTS_VERSION}
    return config


def _model_class(config: dict[str, Any]) -> tuple[Any, Any]:
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return module.Model, module.ModelArgs


LAYOUTS = ("hf", "mlx")


def check_layout(layout: str) -> str:
    """`layout` if it is one of LAYOUTS; ValueError naming them otherwise."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return layout


def weight_specs(config: dict[str, Any], *, layout: str = "hf") -> list[TensorSpec]:
    """Every tensor of the checkpoint, in the model's order.

    The names come from mlx-lm's own model class (built lazily: nothing is computed). With
    layout "hf", stacked expert weights (`switch_mlp`) are written per expert (`experts.E`) as a
    Hugging Face checkpoint has them, which the model's `sanitize` stacks again at load time (a
    copy of every expert's weights, and one tensor per expert to read); with "mlx" they are
    written stacked, as `mlx_lm.convert` saves them and MLX checkpoints hold them, so the load
    reads each as it is. Models without experts are the same in both.
    """
    per_expert = check_layout(layout) == "hf"
    from mlx.utils import tree_flatten

    model_class, args_class = _model_class(config)
    model = model_class(args_class.from_dict(config))
    specials = len(SPECIAL_TOKENS)
    specs: list[TensorSpec] = []
    flat = cast(list[tuple[str, Any]], tree_flatten(model.parameters()))
    for name, array in flat:
        shape = tuple(int(d) for d in array.shape)
        if ".switch_mlp." in name and per_expert:
            experts, rest = shape[0], shape[1:]
            prefix, _, proj = name.partition(".switch_mlp.")
            for e in range(experts):
                specs.append(TensorSpec(f"{prefix}.experts.{e}.{proj}", rest, "linear", rest[-1]))
        elif name.endswith(".bias"):
            specs.append(TensorSpec(name, shape, "zeros"))
        elif len(shape) == 1:
            specs.append(TensorSpec(name, shape, "ones"))  # norm scales
        elif name.endswith("embed_tokens.weight"):
            specs.append(TensorSpec(name, shape, "embedding"))
        elif name == "lm_head.weight":
            # Special tokens never win the argmax: their logits are exactly 0 while the
            # maximum over thousands of random logits is positive. Decoding then never hits
            # EOS, whatever a server or generate loop does with it.
            specs.append(TensorSpec(name, shape, "linear", shape[-1], zero_rows=specials))
        else:
            specs.append(TensorSpec(name, shape, "linear", shape[-1]))
    return specs


def _tensor_float32(spec: TensorSpec, seed: int) -> np.ndarray:
    import numpy as np

    if spec.init == "ones":
        return np.ones(spec.shape, dtype=np.float32)
    if spec.init == "zeros":
        return np.zeros(spec.shape, dtype=np.float32)
    key = hashlib.sha256(f"{WEIGHTS_VERSION}:{seed}:{spec.name}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(key[:16], "little")))
    values = rng.random(spec.shape, dtype=np.float32)
    # uniform on [-bound, bound): unit variance for embeddings, 1/sqrt(fan_in) scale for
    # linear layers (mlx's own nn.Linear initialisation)
    bound = np.float32(math.sqrt(3.0) if spec.init == "embedding" else 1.0 / math.sqrt(spec.fan_in))
    values *= np.float32(2.0)
    values -= np.float32(1.0)
    values *= bound
    if spec.zero_rows:
        values[: spec.zero_rows] = 0.0
    return values


def _to_dtype_bytes(values: np.ndarray, dtype: str) -> bytes:
    import numpy as np

    if dtype == "float32":
        return values.astype("<f4", copy=False).tobytes()
    if dtype == "float16":
        return values.astype("<f2").tobytes()
    # bfloat16: round to nearest even on the upper 16 bits (the values are finite); in place,
    # since `values` is a throwaway and an 8B model has tensors of half a billion elements
    bits = values.view(np.uint32)
    odd = bits >> 16
    odd &= np.uint32(1)
    bits += np.uint32(0x7FFF)
    bits += odd
    bits >>= 16
    return bits.astype("<u2").tobytes()


def _write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]], blobs) -> None:
    """Write a safetensors file from (name, st_dtype, shape) headers and an iterator of bytes
    in the same order (one tensor in memory at a time). Keys sorted: deterministic bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, st_dtype, shape in tensors:
        size = math.prod(shape) * _DTYPE_BYTES[st_dtype]
        header[name] = {
            "dtype": st_dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)))
        fh.write(encoded)
        for (name, st_dtype, shape), blob in zip(tensors, blobs, strict=True):
            expected = math.prod(shape) * _DTYPE_BYTES[st_dtype]
            if len(blob) != expected:
                raise RuntimeError(f"tensor {name}: {len(blob)} bytes, expected {expected}")
            fh.write(blob)


def _shards(sizes: list[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = []
    current = 0
    for name, size in sizes:
        if not shards or (current + size > shard_bytes and shards[-1]):
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    return shards


def _in_order(make: Any, names: list[str], workers: int | None = None) -> Iterable[bytes]:
    """make(name) for each name, in order, computed on up to `workers` threads (numpy's random
    generator and arithmetic release the GIL) with at most that many tensors in memory at once:
    the bytes do not depend on the threads, an 8B checkpoint is written several times faster."""
    workers = workers or min(8, os.cpu_count() or 1)
    if workers < 2:
        yield from (make(name) for name in names)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque[Future[bytes]] = deque()
        for name in names:
            pending.append(pool.submit(make, name))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _write_weights(
    out: Path,
    entries: dict[str, tuple[str, tuple[int, ...]]],
    blob_of,
    shard_bytes: int,
) -> None:
    """entries: name -> (st_dtype, shape) in model order; blob_of(name) -> bytes."""
    sizes = [(n, math.prod(s) * _DTYPE_BYTES[d]) for n, (d, s) in entries.items()]
    shards = _shards(sizes, shard_bytes)
    count = len(shards)
    weight_map: dict[str, str] = {}
    for i, names in enumerate(shards):
        file_name = (
            "model.safetensors" if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        )
        ordered = sorted(names)
        headers = [(n, *entries[n]) for n in ordered]
        _write_safetensors(out / file_name, headers, _in_order(blob_of, ordered))
        weight_map.update({n: file_name for n in names})
    if count > 1:
        total = sum(size for _, size in sizes)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        _write_json(out / "model.safetensors.index.json", index)


def _quantized_entries(
    config: dict[str, Any], specs: list[TensorSpec], seed: int, dtype: str, bits: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Quantize through mlx-lm's own `quantize_model` on the CPU stream; mlx naming."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    mx_dtype = getattr(mx, dtype)
    model_class, args_class = _model_class(config)
    with mx.stream(mx.cpu):
        model = model_class(args_class.from_dict(config))
        weights = {s.name: mx.array(_tensor_float32(s, seed)).astype(mx_dtype) for s in specs}
        if hasattr(model, "sanitize"):
            weights = model.sanitize(weights)
        model.load_weights(list(weights.items()), strict=True)
        mx.eval(model.parameters())
        # quantize_model reports with print(); keep it off stdout (the runner's channel)
        with contextlib.redirect_stdout(io.StringIO()) as said:
            model, qconfig = quantize_model(model, config, group_size=64, bits=bits)
        log.info("%s", said.getvalue().strip())
        params = dict(tree_flatten(model.parameters()))
        mx.eval(list(params.values()))
    arrays: dict[str, Any] = {}
    for name, array in params.items():
        st_dtype = _SAFETENSORS_DTYPES[str(array.dtype).removeprefix("mlx.core.")]
        if array.dtype == mx.bfloat16:
            array = array.view(mx.uint16)
        arrays[name] = (st_dtype, np.array(array))
    return qconfig, arrays


def create_checkpoint(
    preset: str,
    out: Path,
    *,
    dtype: str | None = None,
    quantize_bits: int | None = None,
    seed: int = 0,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    layout: str = "hf",
) -> Path:
    """Write preset `preset` to `out` (which must not exist or be empty); return `out`.
    `layout`: how expert weights are stored (`weight_specs`).

    Written into a temporary sibling and renamed at the end, so a crash never leaves a
    half-written checkpoint under the final name.
    """
    spec = get_preset(preset)
    dtype = dtype or spec.default_dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    check_layout(layout)  # before anything is written
    if quantize_bits is not None and quantize_bits not in (2, 3, 4, 5, 6, 8):
        raise ValueError(f"--quantize {quantize_bits}: mlx quantizes to 2, 3, 4, 5, 6 or 8 bits")
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not empty; remove it or choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer = train_tokenizer(spec.tokenizer_vocab)
        config = build_config(spec, dtype, tokenizer.get_vocab_size(), seed)
        specs = weight_specs(config, layout=layout)
        if quantize_bits is None:
            by_name = {s.name: s for s in specs}
            entries = {s.name: (_SAFETENSORS_DTYPES[dtype], s.shape) for s in specs}
            _write_weights(
                work,
                entries,
                lambda n: _to_dtype_bytes(_tensor_float32(by_name[n], seed), dtype),
                shard_bytes,
            )
        else:
            config, arrays = _quantized_entries(config, specs, seed, dtype, quantize_bits)
            entries = {n: (d, tuple(a.shape)) for n, (d, a) in arrays.items()}
            _write_weights(work, entries, lambda n: arrays[n][1].tobytes(), shard_bytes)
        _write_json(work / "config.json", dict(sorted(config.items())))
        _write_tokenizer(work, tokenizer, int(config.get("max_position_embeddings") or 1 << 20))
        if out.exists():
            out.rmdir()
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("wrote %s (preset %s, seed %d, %s)", out, preset, seed, dtype)
    return out


# ---------------------------------------------------------------------------------------------
# loading, digests, inspection


def load_model(path: Path | str) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config) through `mlx_lm.utils.load`, as a user's checkpoint loads;
    the weights read by `fill_weights`."""
    from mlx_lm.utils import load

    path = Path(path)
    _check_layout(path)
    try:
        model, tokenizer, config = load(str(path), lazy=True, return_config=True)  # type: ignore[misc]
        fill_weights(model, path, config)
    except Exception as error:  # noqa: BLE001 - any load failure becomes one clear line
        raise CheckpointError(f"cannot load checkpoint {path}: {one_line(error)}") from error
    return model, tokenizer, config


# MLX reads a tensor on CUDA by reading the file into fresh host memory, then copying it to the
# device from that pageable memory, one tensor after the other: one thread leaves the bus idle
# while it reads and the page cache idle while it copies (an 8B bf16 checkpoint took 6.3 s
# alone on an H100, and two processes loading side by side took 5.5 s each). Every thread has
# its own default stream in MLX, so several threads each reading their share overlap the two.
LOAD_THREADS = 16

# mlx-lm rewrites these checkpoints' weights before it quantizes the model (its
# `_transform_awq_weights`); the sanitized file tensors are not the model's parameters.
_REWRITTEN_QUANTIZATIONS = ("awq", "gptq")


def load_threads() -> int:
    """Threads that read a checkpoint's weights: `LOAD_THREADS` on CUDA, at most one a core; one
    elsewhere (MLX's CPU and Metal loads read straight into the array's memory, with no copy to
    overlap)."""
    from coldbench.engine.backend import detect_backend

    if detect_backend() != "cuda":
        return 1
    return max(1, min(LOAD_THREADS, os.cpu_count() or 1))


def read_weights(path: Path, *, threads: int | None = None) -> dict[str, Any]:
    """Every tensor of the checkpoint's weight files, evaluated. The tensors are dealt out by size
    (largest first, each to the thread with the fewest bytes so far), and each of `threads`
    threads (default `load_threads()`) loads and evaluates its share on its own default stream."""
    import mlx.core as mx

    tensors: list[tuple[int, Path, str]] = []
    for file in weight_files(path):
        header = safetensors_layout(file)[0]
        header.pop("__metadata__", None)
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            tensors.append((end - begin, file, name))
    count = max(1, min(threads or load_threads(), len(tensors)))
    shares: list[dict[Path, list[str]]] = [{} for _ in range(count)]
    loaded = [0] * count
    for size, file, name in sorted(tensors, key=lambda tensor: -tensor[0]):
        least = loaded.index(min(loaded))
        shares[least].setdefault(file, []).append(name)
        loaded[least] += size

    def load_share(share: dict[Path, list[str]]) -> dict[str, Any]:
        arrays: dict[str, Any] = {}
        for file, names in share.items():
            # lazy: only `names` are read, by this thread's eval
            everything = cast(dict[str, Any], mx.load(str(file)))
            arrays.update((name, everything[name]) for name in names)
        mx.eval(list(arrays.values()))
        return arrays

    if count == 1:
        return load_share(shares[0])
    weights: dict[str, Any] = {}
    with ThreadPoolExecutor(count, thread_name_prefix="coldbench-load") as pool:
        for part in pool.map(load_share, shares):
            weights.update(part)
    return weights


def fill_weights(
    model: Any, path: Path, config: dict[str, Any], *, threads: int | None = None
) -> None:
    """Give `model`, built by mlx-lm with `lazy=True` (its class, sanitize and quantization; no
    tensor read), the checkpoint's weights read by `read_weights`, sanitized and strictly checked
    as mlx-lm's `load_model` does. A checkpoint whose weights mlx-lm rewrites before quantizing
    keeps mlx-lm's own reading of them, as does a load by one thread."""
    import mlx.core as mx

    threads = threads or load_threads()
    quantization = config.get("quantization_config")
    rewritten = isinstance(quantization, dict) and (
        quantization.get("quant_method") in _REWRITTEN_QUANTIZATIONS
    )
    if threads == 1 or rewritten:
        mx.eval(model.parameters())  # mlx-lm's lazy arrays: what its eager load evaluates
        return
    weights = read_weights(path, threads=threads)
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())


def _check_layout(path: Path) -> None:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint {path} has no config.json")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / 'config.json'} is not valid JSON: {error}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointError(f"{path / 'config.json'} has no model_type")
    files = weight_files(path)
    if not files:
        raise CheckpointError(f"checkpoint {path} has no model*.safetensors")
    for file in files:
        safetensors_layout(file)  # raises CheckpointError where the header is unreadable


def weight_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("model*.safetensors") if p.is_file())


def tokenizer_files(path: Path) -> list[Path]:
    return [path / n for n in TOKENIZER_FILES if (path / n).is_file()]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digests(path: Path, files: Iterable[Path]) -> dict[str, str]:
    """sha256 per file, cached in DIGEST_CACHE_NAME keyed by (size, mtime_ns): an 8B checkpoint
    is hashed once, not on every run."""
    cache_file = path / DIGEST_CACHE_NAME
    try:
        cache = json.loads(cache_file.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        cache = {}
    digests: dict[str, str] = {}
    changed = False
    for file in files:
        stat = file.stat()
        entry = cache.get(file.name)
        if (
            entry
            and entry.get("bytes") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
        ):
            digests[file.name] = entry["sha256"]
            continue
        digests[file.name] = _sha256_file(file)
        cache[file.name] = {
            "bytes": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": digests[file.name],
        }
        changed = True
    if changed:
        with contextlib.suppress(OSError):  # a read-only checkpoint is simply not cached
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"format": 1, "files": cache}, indent=1, sort_keys=True))
            os.replace(tmp, cache_file)
    return digests


def _combined(digests: dict[str, str]) -> str:
    """One digest for a set of files: sha256 over sorted `name  sha256` lines."""
    lines = "".join(f"{name}  {sha}\n" for name, sha in sorted(digests.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def safetensors_layout(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (tensor name -> dtype, shape and `data_offsets`, which count
    from the data's start) and the file offset where its data starts (after the 8-byte length
    and the header)."""
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100 << 20:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(fh.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        return header, 8 + length
    except (OSError, ValueError, struct.error) as error:
        raise CheckpointError(f"corrupt safetensors file {path}: {one_line(error)}") from None


def count_parameters(path: Path, config: dict[str, Any]) -> int:
    """Parameters as stored, counting a quantized weight by its unpacked size."""
    tensors: dict[str, dict[str, Any]] = {}
    for file in weight_files(path):
        header = safetensors_layout(file)[0]
        header.pop("__metadata__", None)
        tensors.update(header)
    quantization = config.get("quantization") or {}
    group_size = int(quantization.get("group_size", 64)) if isinstance(quantization, dict) else 64
    total = 0
    for name, info in tensors.items():
        shape = info["shape"]
        stem = name.rsplit(".", 1)[0]
        packed = tensors.get(f"{stem}.weight", {}).get("dtype") == "U32"
        if name.endswith((".scales", ".biases")) and packed:
            continue
        if info["dtype"] == "U32" and f"{stem}.scales" in tensors:
            scales = tensors[f"{stem}.scales"]["shape"]
            total += math.prod(shape[:-1]) * scales[-1] * group_size
            continue
        total += math.prod(shape)
    return total


def inspect_checkpoint(path: Path | str) -> dict[str, Any]:
    """Architecture, parameter count and the config/weights/tokenizer digests of `path`."""
    path = Path(path).expanduser().resolve()
    _check_layout(path)
    config = json.loads((path / "config.json").read_text())
    weights = weight_files(path)
    index = path / "model.safetensors.index.json"
    config_digest = file_digests(path, [path / "config.json"])["config.json"]
    weight_digests = file_digests(path, weights + ([index] if index.is_file() else []))
    tok_files = tokenizer_files(path)
    tokenizer_digests = file_digests(path, tok_files)
    return {
        "path": str(path),
        "architecture": config.get("model_type"),
        "architectures": config.get("architectures"),
        "parameters": count_parameters(path, config),
        "dtype": config.get("torch_dtype"),
        "quantization": config.get("quantization"),
        "preset": (config.get("coldbench") or {}).get("preset"),
        "config_sha256": config_digest,
        "weights_sha256": _combined(weight_digests),
        "tokenizer_sha256": _combined(tokenizer_digests) if tokenizer_digests else None,
        "files": {**{"config.json": config_digest}, **weight_digests, **tokenizer_digests},
    }


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n", encoding="utf-8")
