"""Synthetic model presets: real mlx-lm architectures with the dimensions of a named model.

`micro`, `tiny`, `tiny-moe` (qwen3_moe) and `tiny-deepseek-v3` are for tests and the demo on a
CPU; the `*-shape` presets carry a real model's dimensions (several GB of random weights) and
are written only on benchmark hosts.

`*-long` presets are the same architectures declared as long-context checkpoints declare it:
Llama 3.1's `rope_scaling` (`rope_type` llama3: low and high frequency factors 1 and 4 over the
base model's original window) with the factor raised so that `max_position_embeddings` reaches
`LONG_CONTEXT` (262,144 positions). mlx-lm's llama builds its `Llama3RoPE` from exactly these
keys, so a 256K cell runs the code path of a real long-context checkpoint. The base presets'
configs are left byte for byte as they were (their checkpoints' digests do not move).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: dict[str, Any]
    default_dtype: str
    tokenizer_vocab: int
    # True when config.json's vocab_size is the trained tokenizer's size (tiny presets); the
    # shaped presets keep the real model's (larger) embedding so the lm_head costs what it does.
    vocab_from_tokenizer: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        description="llama, 4 layers, width 256: tests and the demo",
        config={
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "intermediate_size": 704,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        },
        default_dtype="float32",
        tokenizer_vocab=2048,
        vocab_from_tokenizer=True,
    ),
    # The demo's model: on a 2-core CPU a 256-token prefill takes a twentieth of `tiny`'s (about
    # 0.1 s against 2 s; docs/PERFORMANCE.md, "`coldbench demo` on a 2-core CPU"), so the demo's
    # 150 cells and 75 process starts fit in about a minute.
    "micro": Preset(
        name="micro",
        description="llama, 2 layers, width 64: the demo and end-to-end tests",
        config={
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 176,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        },
        default_dtype="float32",
        tokenizer_vocab=2048,
        vocab_from_tokenizer=True,
    ),
    "tiny-moe": Preset(
        name="tiny-moe",
        description="qwen3_moe, 2 layers, width 256, 8 experts (top 2)",
        config={
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 2,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
        },
        default_dtype="float32",
        tokenizer_vocab=2048,
        vocab_from_tokenizer=True,
    ),
    # DeepSeek-V3's architecture as mlx-lm ships it (multi-head latent attention: the KV cache
    # holds one 64-wide latent per position instead of keys and values per head; a dense first
    # layer, then routed experts beside a shared one), small enough for a CPU test of its
    # memory estimate.
    "tiny-deepseek-v3": Preset(
        name="tiny-deepseek-v3",
        description="deepseek_v3, 2 layers (1 dense), width 256, 8 experts (top 2) + 1 shared",
        config={
            "model_type": "deepseek_v3",
            "architectures": ["DeepseekV3ForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 2,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "kv_lora_rank": 64,
            "q_lora_rank": 96,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
            "attention_bias": False,
        },
        default_dtype="float32",
        tokenizer_vocab=2048,
        vocab_from_tokenizer=True,
    ),
    "llama-8b-shape": Preset(
        name="llama-8b-shape",
        description="Llama-3.1-8B dimensions, random weights (about 16 GB in bf16)",
        config={
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "max_position_embeddings": 131072,
            "vocab_size": 128256,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        },
        default_dtype="bfloat16",
        tokenizer_vocab=8192,
        tags=("gpu-host-only",),
    ),
    "qwen3-30b-a3b-shape": Preset(
        name="qwen3-30b-a3b-shape",
        description="Qwen3-30B-A3B dimensions (128 experts, top 8), random weights (about 61 GB)",
        config={
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 40960,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        default_dtype="bfloat16",
        tokenizer_vocab=8192,
        tags=("gpu-host-only",),
    ),
}

# The GPU check of a run in turns (docs/PERFORMANCE.md): Qwen3-30B-A3B's decoder layer (128
# routed experts, top 8, width 2,048) in 36 of its 48 layers, so that one process holds more
# than half of an 80 GB GPU (about 46 GB of weights) and two cannot be resident together, on a
# GPU machine's 64 GiB disk beside everything else.
PRESETS["qwen3-moe-45g-shape"] = Preset(
    name="qwen3-moe-45g-shape",
    description="qwen3_moe, Qwen3-30B-A3B's layers (128 experts, top 8), 36 of them, random "
    "weights (about 46 GB in bf16): one process > half of an 80 GB GPU",
    config={**PRESETS["qwen3-30b-a3b-shape"].config, "num_hidden_layers": 36},
    default_dtype="bfloat16",
    tokenizer_vocab=8192,
    tags=("gpu-host-only",),
)


LONG_CONTEXT = 262_144


def long_context(preset: Preset, *, original: int, description: str) -> Preset:
    """`preset` with llama3 RoPE scaling from `original` positions to LONG_CONTEXT."""
    config = dict(preset.config)
    config["rope_scaling"] = {
        "factor": float(LONG_CONTEXT // original),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
        "rope_type": "llama3",
    }
    config["max_position_embeddings"] = LONG_CONTEXT
    return Preset(
        name=f"{preset.name}-long",
        description=description,
        config=config,
        default_dtype=preset.default_dtype,
        tokenizer_vocab=preset.tokenizer_vocab,
        vocab_from_tokenizer=preset.vocab_from_tokenizer,
        tags=preset.tags,
    )


PRESETS["tiny-long"] = long_context(
    PRESETS["tiny"],
    original=8192,
    description="tiny with llama3 RoPE scaling (factor 32) to 262,144 positions",
)
PRESETS["llama-8b-shape-long"] = long_context(
    PRESETS["llama-8b-shape"],
    original=8192,
    description="Llama-3.1-8B dimensions with llama3 RoPE scaling (factor 32) to 262,144 "
    "positions, random weights (about 16 GB in bf16)",
)


def get_preset(name: str) -> Preset:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}"
        ) from None
