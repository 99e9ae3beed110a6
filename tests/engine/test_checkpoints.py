from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from typer.testing import CliRunner

from coldbench.engine import checkpoints, corpus
from coldbench.model import model_app as app

# Pinned: the corpus must be the same bytes on every host (a changed generator changes every
# prompt and every tokenizer digest, so it must be a deliberate, versioned change).
CORPUS_SHA256 = "c4a0185d3de2139451f4daa52bd691bbf097052f663403423218972dca2441a1"


def test_corpus_is_pinned() -> None:
    assert corpus.corpus_sha256() == CORPUS_SHA256 == corpus.BUILTIN_SHA256
    assert len(corpus.paragraphs()) == corpus.PARAGRAPHS


@pytest.fixture
def fresh_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty model cache, and paragraphs() not yet computed in this process."""
    monkeypatch.setenv("COLDBENCH_MODEL_DIR", str(tmp_path / "models"))
    corpus.paragraphs.cache_clear()
    yield corpus._cache_file()
    corpus.paragraphs.cache_clear()


def test_the_corpus_is_kept_in_the_model_cache_and_read_back(fresh_corpus: Path) -> None:
    generated = tuple(corpus.paragraph(i) + "\n\n" for i in range(corpus.PARAGRAPHS))
    assert corpus.paragraphs() == generated
    assert fresh_corpus.read_text(encoding="utf-8") == "".join(generated)
    corpus.paragraphs.cache_clear()
    assert corpus.paragraphs() == generated  # read back from the file this time
    assert [p.name for p in fresh_corpus.parent.iterdir()] == [fresh_corpus.name]


def test_a_cached_corpus_that_is_not_the_pinned_one_is_ignored(fresh_corpus: Path) -> None:
    fresh_corpus.parent.mkdir(parents=True)
    fresh_corpus.write_text("Forged paragraph.\n\n", encoding="utf-8")
    assert corpus.corpus_sha256() == CORPUS_SHA256
    assert len(corpus.paragraphs()) == corpus.PARAGRAPHS
    assert corpus.paragraphs()[0] == corpus.paragraph(0) + "\n\n"


def test_an_unwritable_model_cache_still_gives_the_corpus(fresh_corpus: Path) -> None:
    fresh_corpus.parent.write_text("a file where the cache folder would be")
    assert corpus.corpus_sha256() == CORPUS_SHA256


def test_tiny_loads_through_mlx_lm(tiny_model_dir: Path) -> None:
    from mlx_lm.utils import load

    model, tokenizer = load(str(tiny_model_dir))
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["hidden_size"] <= 256
    ids = tokenizer.encode(corpus.paragraph(0), add_special_tokens=False)
    assert 10 < len(ids) < len(corpus.paragraph(0))
    assert tokenizer.decode(ids) == corpus.paragraph(0)
    logits = model(mx.array([ids[:16]]))
    assert logits.shape == (1, 16, config["vocab_size"])
    # specials have zero lm_head rows: never the greedy choice
    top = mx.argmax(logits[0], axis=-1).tolist()
    assert min(top) >= len(checkpoints.SPECIAL_TOKENS)
    assert len(set(top)) > 1  # a random model that does not just repeat one token


def test_same_seed_same_digests_other_seed_differs(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = checkpoints.create_checkpoint("tiny", tmp_path / "again")
    other = checkpoints.create_checkpoint("tiny", tmp_path / "other", seed=1, shard_bytes=4 << 20)
    first = checkpoints.inspect_checkpoint(tiny_model_dir)
    second = checkpoints.inspect_checkpoint(again)
    third = checkpoints.inspect_checkpoint(other)
    for key in ("config_sha256", "weights_sha256", "tokenizer_sha256", "parameters"):
        assert first[key] == second[key], key
    assert third["weights_sha256"] != first["weights_sha256"]
    assert third["tokenizer_sha256"] == first["tokenizer_sha256"]
    assert third["parameters"] == first["parameters"] == 4_000_000
    # the seed-1 copy is sharded with an index, and still loads through mlx-lm
    index = json.loads((other / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model, _, _ = checkpoints.load_model(other)
    assert model(mx.array([[5, 6, 7]])).shape[-1] == 2048


def test_digest_cache_follows_file_changes(tmp_path: Path) -> None:
    path = checkpoints.create_checkpoint("tiny", tmp_path / "m")
    before = checkpoints.inspect_checkpoint(path)
    assert (path / checkpoints.DIGEST_CACHE_NAME).is_file()
    config = json.loads((path / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (path / "config.json").write_text(json.dumps(config))
    after = checkpoints.inspect_checkpoint(path)
    assert after["config_sha256"] != before["config_sha256"]
    assert after["weights_sha256"] == before["weights_sha256"]


def test_moe_and_quantized_presets_load(tmp_path: Path) -> None:
    moe = checkpoints.create_checkpoint("tiny-moe", tmp_path / "moe")
    info = checkpoints.inspect_checkpoint(moe)
    assert info["architecture"] == "qwen3_moe"
    model, _, config = checkpoints.load_model(moe)
    assert config["num_experts"] == 8
    assert model(mx.array([[5, 6, 7]])).shape == (1, 3, config["vocab_size"])
    quantized = checkpoints.create_checkpoint("tiny", tmp_path / "q4", quantize_bits=4)
    model, _, config = checkpoints.load_model(quantized)
    assert config["quantization"]["bits"] == 4
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    assert checkpoints.inspect_checkpoint(quantized)["parameters"] == 4_000_000


def test_the_mlx_layout_stores_experts_stacked_and_loads_the_same_model(tmp_path: Path) -> None:
    """`--layout mlx` writes what mlx_lm.convert saves (one stacked tensor per projection and
    layer), which the load reads as it is, where the Hugging Face layout's experts are read one
    by one and stacked again by the model's sanitize."""
    from safetensors import safe_open

    def names(folder: Path) -> set[str]:
        found: set[str] = set()
        for shard in folder.glob("model*.safetensors"):
            with safe_open(str(shard), framework="numpy") as handle:
                found.update(handle.keys())
        return found

    hf = checkpoints.create_checkpoint("tiny-moe", tmp_path / "hf")
    stacked = checkpoints.create_checkpoint("tiny-moe", tmp_path / "mlx", layout="mlx")
    hf_names, mlx_names = names(hf), names(stacked)
    assert any(".mlp.experts.0.up_proj." in n for n in hf_names)
    assert not any(".experts." in n for n in mlx_names)
    layers = json.loads((stacked / "config.json").read_text())["num_hidden_layers"]
    assert sum(".switch_mlp." in n for n in mlx_names) == 3 * layers
    assert len(hf_names) - len(mlx_names) == 3 * layers * (8 - 1)  # 8 experts a layer
    models = [checkpoints.load_model(folder)[0] for folder in (hf, stacked)]
    from mlx.utils import tree_flatten

    shapes = [{k: v.shape for k, v in tree_flatten(m.parameters())} for m in models]
    assert shapes[0] == shapes[1]
    for model in models:
        logits = model(mx.array([[5, 6, 7]]))
        assert logits.shape[:2] == (1, 3) and bool(mx.isfinite(logits).all())
    # a model without experts is the same in both layouts, byte for byte
    plain = [
        checkpoints.create_checkpoint("micro", tmp_path / f"micro-{layout}", layout=layout)
        for layout in ("hf", "mlx")
    ]
    digests = [checkpoints.inspect_checkpoint(folder)["weights_sha256"] for folder in plain]
    assert digests[0] == digests[1]
    with pytest.raises(ValueError, match="unknown layout 'gguf'; choose one of hf, mlx"):
        checkpoints.create_checkpoint("tiny-moe", tmp_path / "bad", layout="gguf")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("threads", [2, 5])
def test_weights_read_by_several_threads_are_mlx_lms_own(tmp_path: Path, threads: int) -> None:
    """CUDA hosts read a checkpoint's tensors on several threads at once (fill_weights); the
    model must come out as mlx-lm's one-thread load makes it: experts stacked by sanitize from
    the Hugging Face layout (qwen3_moe, and deepseek_v3 with its shared expert and latent
    attention), quantized layers with their scales, every tensor bit for bit."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    for folder in (
        checkpoints.create_checkpoint("tiny-moe", tmp_path / "moe"),
        checkpoints.create_checkpoint("tiny-deepseek-v3", tmp_path / "mla"),
        checkpoints.create_checkpoint("tiny", tmp_path / "q4", quantize_bits=4),
    ):
        reference = dict(tree_flatten(load_model(folder)[0].parameters()))
        model, config = load_model(folder, lazy=True)
        checkpoints.fill_weights(model, folder, config, threads=threads)
        filled = dict(tree_flatten(model.parameters()))
        assert filled.keys() == reference.keys()
        for name, array in reference.items():
            assert filled[name].dtype == array.dtype, name
            assert bool(mx.array_equal(filled[name], array)), name
    read = checkpoints.read_weights(tmp_path / "moe", threads=threads)
    header_names = set()
    for file in checkpoints.weight_files(tmp_path / "moe"):
        with open(file, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header_names |= set(json.loads(handle.read(length))) - {"__metadata__"}
    assert set(read) == header_names


def test_resolve_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert checkpoints.resolve_model("preset:tiny", {}) == tiny_model_dir
    assert checkpoints.resolve_model("mine", {"mine": str(tiny_model_dir)}) == tiny_model_dir
    with pytest.raises(ValueError, match=r"unknown model 'llama-3b'; known: preset:llama-8b-shape"):
        checkpoints.resolve_model("llama-3b", {"mine": str(tiny_model_dir)})
    with pytest.raises(ValueError, match="unknown model 'preset:huge'"):
        checkpoints.resolve_model("preset:huge", {})
    with pytest.raises(checkpoints.CheckpointError, match="no config.json"):
        checkpoints.resolve_model("gone", {"gone": str(tmp_path)})


def test_inspect_cli(tiny_model_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", str(tiny_model_dir)])
    assert result.exit_code == 0, result.output
    info = checkpoints.inspect_checkpoint(tiny_model_dir)
    for key in ("config_sha256", "weights_sha256", "tokenizer_sha256"):
        assert info[key] in result.output
    assert "llama" in result.output and "4,000,000" in result.output
    as_json = runner.invoke(app, ["inspect", str(tiny_model_dir), "--json"])
    assert json.loads(as_json.output)["weights_sha256"] == info["weights_sha256"]


def test_create_cli_writes_and_refuses_to_overwrite(tmp_path: Path, coldbench_cmd) -> None:
    out = tmp_path / "cli-tiny"
    done = subprocess.run(
        [*coldbench_cmd, "model", "create", "--preset", "tiny", "--out", str(out), "--seed", "3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["coldbench"]["seed"] == 3
    again = CliRunner().invoke(app, ["create", "--preset", "tiny", "--out", str(out)])
    assert again.exit_code == 2
    assert "already exists" in again.output


def _corrupt(tmp_path: Path, tiny_model_dir: Path, how: str) -> Path:
    import shutil

    path = tmp_path / how
    shutil.copytree(tiny_model_dir, path)
    if how == "truncated":
        (path / "model.safetensors").write_bytes(b"\x10\x00\x00")
    elif how == "badconfig":
        (path / "config.json").write_text("{not json")
    elif how == "noweights":
        (path / "model.safetensors").unlink()
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--preset", "nope"], "unknown preset 'nope'; known presets:"),
        (["create", "--preset", "tiny", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["create", "--preset", "tiny", "--quantize", "7"], "--quantize 7"),
        (["create", "--preset", "tiny-moe", "--layout", "gguf"], "unknown layout 'gguf'"),
        (["inspect", "/nonexistent/ckpt"], "does not exist"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    if "create" in args:
        args = [*args, "--out", str(tmp_path / "x")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", "corrupt safetensors file"),
        ("badconfig", "is not valid JSON"),
        ("noweights", "has no model*.safetensors"),
    ],
)
def test_corrupt_checkpoint_is_one_line(
    tmp_path: Path, tiny_model_dir: Path, how: str, message: str
) -> None:
    path = _corrupt(tmp_path, tiny_model_dir, how)
    result = CliRunner().invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(checkpoints.CheckpointError, match=message.replace("*", r"\*")):
        checkpoints.load_model(path)


def test_bfloat16_rounding_matches_mlx_and_loads(tmp_path: Path) -> None:
    import numpy as np

    values = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 3
    ours = checkpoints._to_dtype_bytes(values.copy(), "bfloat16")
    theirs = np.array(mx.array(values).astype(mx.bfloat16).view(mx.uint16)).tobytes()
    assert ours == theirs
    path = checkpoints.create_checkpoint("tiny", tmp_path / "bf16", dtype="bfloat16")
    model, _, config = checkpoints.load_model(path)
    assert config["torch_dtype"] == "bfloat16"
    assert model.model.layers[0].mlp.up_proj.weight.dtype == mx.bfloat16


# The base presets' configs as they were before the long-context forms existed: their
# checkpoints' bytes (and so every digest recorded with them) must never move.
BASE_CONFIG_SHA256 = {
    "tiny": "5cf9fb8e9e4dae84e591a4a1f81ed301adb1bdde8a309ca04f9a2c9e7869bcdf",
    "llama-8b-shape": "bf9cc340b2cd900c8aebc0c1c3536ced4b171acc9e384118946233b98b60176f",
}


def _config_sha256(config: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def test_base_presets_are_unchanged() -> None:
    from coldbench.engine.presets import PRESETS

    for name, digest in BASE_CONFIG_SHA256.items():
        assert _config_sha256(PRESETS[name].config) == digest, name


def test_long_context_preset_runs_at_positions_past_the_base_window(tmp_path: Path) -> None:
    from mlx_lm.models.rope_utils import Llama3RoPE

    from coldbench.engine.presets import LONG_CONTEXT, PRESETS

    long_8b = PRESETS["llama-8b-shape-long"].config
    assert long_8b["max_position_embeddings"] == LONG_CONTEXT == 262_144
    assert long_8b["rope_scaling"]["rope_type"] == "llama3"
    assert {
        k: v for k, v in long_8b.items() if k not in ("rope_scaling", "max_position_embeddings")
    } == {
        k: v
        for k, v in PRESETS["llama-8b-shape"].config.items()
        if k not in ("rope_scaling", "max_position_embeddings")
    }
    path = checkpoints.create_checkpoint("tiny-long", tmp_path / "tiny-long")
    model, tokenizer, config = checkpoints.load_model(path)
    assert config["max_position_embeddings"] == 262_144
    assert isinstance(model.model.layers[0].self_attn.rope, Llama3RoPE)
    # the same tokenizer as tiny (only model_max_length in tokenizer_config.json differs)
    tiny_dir = checkpoints.resolve_model("preset:tiny", {})
    assert (path / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    logits = model(mx.array([[5, 6, 7]]))
    assert logits.shape == (1, 3, config["vocab_size"])
    # RoPE at positions far past tiny's 8,192, scaled as the config declares (low frequencies
    # stretched by the factor): finite, and not the unscaled rotation
    rope = model.model.layers[0].self_attn.rope
    x = mx.ones((1, 2, 3, 64))
    scaled = rope(x, offset=200_000)
    plain = mx.fast.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=200_000)
    assert bool(mx.all(mx.isfinite(scaled))) and not bool(mx.allclose(scaled, plain))


def test_tensors_made_on_threads_come_out_in_order_few_at_a_time() -> None:
    import threading
    import time

    from coldbench.engine.checkpoints import _in_order

    lock = threading.Lock()
    alive = peak = 0

    def make(name: str) -> bytes:
        nonlocal alive, peak
        with lock:
            alive += 1
            peak = max(peak, alive)
        time.sleep(0.01 * (int(name) % 3))
        with lock:
            alive -= 1
        return name.encode()

    names = [str(i) for i in range(20)]
    assert list(_in_order(make, names, workers=4)) == [n.encode() for n in names]
    assert 1 < peak <= 4
    assert list(_in_order(make, names, workers=1)) == [n.encode() for n in names]
