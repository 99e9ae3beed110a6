"""Synthetic model presets: real mlx-lm architectures with the dimensions of a named model.

`micro`, `tiny` and `tiny-moe` are for tests and the demo on a CPU; the `*-shape` presets carry
a real model's dimensions (several GB of random weights) and are written only on benchmark
hosts.

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
    # 0.1 s against 2 s; docs/PERFORMANCE.md, "coldbench demo on this CPU"), so the demo's 150
    # cells and 75 process starts fit in about a minute.
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
