"""How near its floor is a variant process's weight load? (not a test)

Writes a llama checkpoint of a few hundred MB (synthetic config, seeded weights, one shard per
file) to a scratch folder, reads it once so the page cache holds it, then in a fresh interpreter
per method (its imports done before the clock starts) times, with the page cache warm:
- `read_chunks`: every weight file read through one 16 MiB buffer (benchmarks/load_gate_probe.py's
  floor: the bytes copied out of the page cache, into memory that stays hot);
- `read_fresh`: every file read into a fresh buffer of its size (the page cache's copy into new
  anonymous memory, not zero-filled, page faults included: the floor of any load that copies;
  backed by pages as glibc's malloc backs them, not with numpy's own huge page advice);
- `mmap_touch`: every file mapped and one byte of each page read (no copy at all);
- `mx_load`: `mlx.core.load` of every file and `mx.eval` of its arrays (MLX's own read);
- `mlx_lm_load`: mlx-lm's own `load_model` (model built, sanitized, weights set and evaluated
  on one thread);
- `engine_load`: the embedded engine's model load on a synthetic checkpoint
  (coldbench.engine.lean.load: the model built by mlx-lm's `load_model`, its weights read by
  `checkpoints.LOAD_THREADS` threads at once, coldbench.engine.checkpoints.read_weights);
- `engine_load_N` (N a number): the same read by N threads (`engine_load_1` is mlx-lm's read);
- `runner_load`: the whole of what a variant process's `load_s` times (the embedded adapter's
  `load`: the memory guard, the model load, the prompt source, the checkpoint's digests);
- `read_tensors_N` (N a number): every tensor read into a fresh buffer of its size by N threads,
  largest first (what MLX's CUDA load does on the host before its copies: the host side's floor
  of a load by N threads);
- `device_alloc`: a device array of every tensor's size, evaluated (the device's share of a load
  in a fresh process: allocation and one write, no bytes from the host).
A method may end in modifiers of its process, which change how the kernel backs fresh host
memory (MLX's CUDA load mallocs every tensor anew): `+hugetlb` (glibc madvises its mmapped
chunks for transparent huge pages, `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) and `+nothp` (the
process asks for no transparent huge pages, `prctl(PR_SET_THP_DISABLE)`), e.g.
`engine_load+hugetlb`. The line's `host` names the kernel's huge page settings, glibc and the
memory available before and after the runs.
One JSON line: each method's median seconds over `--repeats` and its ratio to `read_chunks`
(the page cache's read, the floor docs/PERFORMANCE.md states a block boundary against), and
each method's seconds in the order they ran (`runs_s`: whether loads one after the other, each
in a fresh process as turns run them, grow slower).
`--model PATH` times a checkpoint folder that is already written (a GPU host's 46 GB preset)
instead of writing one.

With `--preset NAME --layouts hf,mlx` the checkpoint is that preset, written once per layout of
its expert weights (coldbench.engine.checkpoints.weight_specs: per expert as Hugging Face stores
them, or stacked as mlx_lm.convert saves them), the layouts timed in turns, and the line holds
each layout's medians and the ratio of each method's median to the first layout's.

    PYTHONPATH=. python benchmarks/load_floor.py --hidden 1024 --layers 8 --repeats 3
    PYTHONPATH=. python benchmarks/load_floor.py --preset tiny-moe --layouts hf,mlx \
        --methods read_chunks,mx_load,engine_load,runner_load --repeats 5
    PYTHONPATH=. python benchmarks/load_floor.py --model <checkpoint folder> \
        --methods read_chunks,mlx_lm_load,engine_load_1,engine_load --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

METHODS = (
    "read_chunks",
    "read_fresh",
    "mmap_touch",
    "mx_load",
    "mlx_lm_load",
    "engine_load",
    "runner_load",
)
THREADED = re.compile(r"(engine_load|read_tensors)_[1-9][0-9]*")
MORE_METHODS = ("device_alloc",)
# a modifier: (environment for the child, whether the child disables transparent huge pages)
MODIFIERS: dict[str, tuple[dict[str, str], bool]] = {
    "hugetlb": ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, False),
    "nothp": ({}, True),
}

# Run in a fresh interpreter: imports first, then the clock; prints the seconds.
_CHILD = r"""
import mmap, sys, time
from pathlib import Path
folder, method, no_thp = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if no_thp:
    import ctypes
    PR_SET_THP_DISABLE = 41
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")
files = sorted(folder.glob("model*.safetensors"))
import os
import numpy
# numpy madvises its large buffers for huge pages where glibc's malloc (which MLX's load uses)
# does not: the fresh buffers below are backed as MLX's are, unless +hugetlb asks glibc to as well
numpy._core.multiarray._set_madvise_hugepage("hugetlb=1" in os.environ.get("GLIBC_TUNABLES", ""))
if method.startswith("read_tensors_") or method == "device_alloc":
    from concurrent.futures import ThreadPoolExecutor
    from coldbench.engine.checkpoints import safetensors_layout
    tensors = []  # (bytes, file, offset in the file)
    for path in files:
        header, data_start = safetensors_layout(path)
        header.pop("__metadata__", None)
        for entry in header.values():
            begin, end = entry["data_offsets"]
            tensors.append((end - begin, path, data_start + begin))
    tensors.sort(key=lambda tensor: -tensor[0])
uses_mlx = ("mx_load", "mlx_lm_load", "runner_load", "device_alloc")
if method in uses_mlx or method.startswith("engine_load"):
    import mlx.core as mx
    from coldbench.engine import lean
    lean.install()
    with lean._no_hub():
        import mlx_lm.utils  # noqa: F401
if method == "runner_load":
    from coldbench.engine.adapters.embedded import EmbeddedAdapter
    from coldbench.engine.plan import Plan
    plan = Plan.from_json({"run_id": "load-floor", "variant": "a", "adapter": "embedded",
                           "model": str(folder), "records_path": str(folder / "records.jsonl")})
    adapter = EmbeddedAdapter(plan)
started = time.perf_counter()
if method == "read_chunks":
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(1 << 24):
                pass
elif method == "read_fresh":
    kept = []
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            buffer = numpy.empty(path.stat().st_size, dtype=numpy.uint8)  # not zero-filled
            handle.readinto(memoryview(buffer))
            kept.append(buffer)
elif method == "mmap_touch":
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            total += sum(view[i] for i in range(0, len(view), mmap.PAGESIZE))
elif method == "mx_load":
    arrays = {}
    for path in files:
        arrays.update(mx.load(str(path)))
    mx.eval(list(arrays.values()))
elif method == "mlx_lm_load":
    with lean._no_hub():
        model, _config = mlx_lm.utils.load_model(folder)
elif method == "engine_load":
    model, _tokenizer, _config = lean.load(folder)
elif method.startswith("engine_load_"):
    from coldbench.engine.checkpoints import fill_weights
    with lean._no_hub():
        model, config = mlx_lm.utils.load_model(folder, lazy=True)
    fill_weights(model, folder, config, threads=int(method.removeprefix("engine_load_")))
elif method == "runner_load":
    adapter.load()  # what the runner's `load_s` times: the guard, the load, prompts, digests
elif method.startswith("read_tensors_"):
    def read(tensor):
        size, path, offset = tensor
        buffer = numpy.empty(size, dtype=numpy.uint8)  # fresh, as MLX mallocs each tensor
        with open(path, "rb", buffering=0) as handle:
            done = 0
            while done < size:
                done += os.preadv(handle.fileno(), [memoryview(buffer)[done:]], offset + done)
        return buffer
    with ThreadPoolExecutor(int(method.removeprefix("read_tensors_"))) as pool:
        kept = list(pool.map(read, tensors))
elif method == "device_alloc":
    arrays = [mx.full((size,), 1, dtype=mx.uint8) for size, _, _ in tensors]
    mx.eval(arrays)
print(time.perf_counter() - started)
"""


def write_checkpoint(folder: Path, *, hidden: int, layers: int) -> None:
    """A llama checkpoint (config.json, model.safetensors, the tiny preset's tokenizer.json) of
    `layers` layers of width `hidden`, float32."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from coldbench.engine.checkpoints import create_checkpoint
    from coldbench.engine.lean import install

    install()
    from mlx_lm.models import llama

    tiny = create_checkpoint("tiny", folder.parent / "tiny")  # for its tokenizer.json
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 11 // 4,
        "num_attention_heads": max(hidden // 64, 1),
        "num_key_value_heads": max(hidden // 256, 1),
        "rms_norm_eps": 1e-5,
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "coldbench": {"benchmark": "load_floor"},
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(list(weights.values()))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_bytes((tiny / "tokenizer.json").read_bytes())


def split_method(method: str) -> tuple[str, list[str]]:
    """`engine_load+hugetlb` -> ("engine_load", ["hugetlb"])."""
    base, *modifiers = method.split("+")
    return base, modifiers


def known_method(method: str) -> bool:
    base, modifiers = split_method(method)
    named = base in METHODS + MORE_METHODS or THREADED.fullmatch(base) is not None
    return named and set(modifiers) <= set(MODIFIERS)


def timed(folder: Path, method: str) -> float:
    base, modifiers = split_method(method)
    env, no_thp = dict(os.environ), False
    for modifier in modifiers:
        extra, disables = MODIFIERS[modifier]
        env.update(extra)
        no_thp = no_thp or disables
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), base, "1" if no_thp else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{method} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def host_facts() -> dict[str, object]:
    """What decides how fresh host memory is backed, and how much of it there is now."""

    def setting(name: str) -> str | None:
        try:  # "always [madvise] never": the bracketed word is the one in force
            text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
        except OSError:
            return None
        chosen = re.search(r"\[(\w[\w+]*)\]", text)
        return chosen.group(1) if chosen else text.strip()

    facts: dict[str, object] = {
        "thp_enabled": setting("enabled"),
        "thp_defrag": setting("defrag"),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None,
    }
    try:
        meminfo = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()
        )
        for key in ("MemTotal", "MemAvailable", "Cached", "AnonHugePages"):
            facts[f"{key}_gib"] = round(int(meminfo[key].split()[0]) / 2**20, 1)
    except (OSError, KeyError, ValueError):
        pass
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--preset", help="a coldbench preset instead of the llama of --hidden")
    parser.add_argument(
        "--layouts", default="hf", help="with --preset: layouts of its expert weights, e.g. hf,mlx"
    )
    parser.add_argument("--model", type=Path, help="time this checkpoint folder, already written")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(m for m in methods if not known_method(m))
    if unknown:
        parser.error(
            f"unknown methods {', '.join(unknown)}: give {', '.join(METHODS + MORE_METHODS)},"
            f" engine_load_N or read_tensors_N, each with modifiers"
            f" {', '.join('+' + m for m in MODIFIERS)} if wanted"
        )
    from coldbench.engine.checkpoints import LAYOUTS, create_checkpoint
    from coldbench.engine.memory import weights_bytes

    layouts = [layout for layout in args.layouts.split(",") if layout]
    if not layouts or set(layouts) - set(LAYOUTS):
        parser.error(f"--layouts {args.layouts!r}: give some of {', '.join(LAYOUTS)}")
    if args.preset is None and layouts != ["hf"]:
        parser.error("--layouts needs --preset (the llama of --hidden has no experts)")
    if args.model is not None and (args.preset is not None or layouts != ["hf"]):
        parser.error("--model times that checkpoint: give no --preset or --layouts with it")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there")
    host_before = host_facts()
    with tempfile.TemporaryDirectory(prefix="load-floor-") as scratch:
        folders: dict[str, Path] = {}
        sizes: dict[str, int] = {}
        for layout in layouts:
            if args.model is not None:
                folder = args.model.resolve()
            else:
                folder = Path(scratch) / f"checkpoint-{layout}"
                if args.preset is None:
                    write_checkpoint(folder, hidden=args.hidden, layers=args.layers)
                else:
                    create_checkpoint(args.preset, folder, layout=layout)
            sizes[layout] = weights_bytes(folder)
            folders[layout] = folder
            timed(folder, "read_chunks")  # the page cache holds the files from here on
        # interleaved, so a drift in the machine's load falls on every method and layout alike
        seconds = {layout: {m: [] for m in methods} for layout in layouts}
        for _ in range(args.repeats):
            for layout in layouts:
                for method in methods:
                    seconds[layout][method].append(timed(folders[layout], method))
    results = {}
    for layout in layouts:
        medians = {m: round(statistics.median(s), 4) for m, s in seconds[layout].items()}
        floor = medians.get("read_chunks")
        results[layout] = {
            "weights_bytes": sizes[layout],
            "median_s": medians,
            # in the order they ran: whether back-to-back loads drift (each in a fresh process)
            "runs_s": {m: [round(x, 4) for x in s] for m, s in seconds[layout].items()},
            "ratio_to_read_chunks": {m: round(v / floor, 2) for m, v in medians.items()}
            if floor
            else None,
        }
    if args.preset is None:
        result: dict[str, object] = {"repeats": args.repeats, **results["hf"]}
        if args.model is not None:
            result["model"] = str(args.model)
    else:
        first = results[layouts[0]]["median_s"]
        result = {
            "preset": args.preset,
            "repeats": args.repeats,
            "layouts": results,
            f"ratio_to_{layouts[0]}": {
                layout: {m: round(v / first[m], 2) for m, v in results[layout]["median_s"].items()}
                for layout in layouts[1:]
            },
        }
    result["host"] = {**host_before, "MemAvailable_after_gib": host_facts().get("MemAvailable_gib")}
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
