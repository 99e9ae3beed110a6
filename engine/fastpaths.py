"""The layer step of the fast-path flags (`fused_swiglu`, `fused_add_rms_norm`).

`KernelForward` runs the backbone of mlx-lm's llama, qwen3 and qwen3_moe models layer by layer,
as their own `__call__` does (embed, one causal mask, each block's attention then MLP half,
final norm), with the requested kernels of `kernels/` in place of the ops they replace:

- `fused_add_rms_norm`: the block's `h = x + attn` and `post_attention_layernorm(h)` become one
  call, and so do `out = h + mlp` and the next block's `input_layernorm(out)` (the model's final
  norm after the last block). Only the first block's input norm stays a plain RMSNorm.
- `fused_swiglu`: a dense MLP (mlx-lm's `MLP` of these three modules: gate, up, down
  projections) computes `down(swiglu(gate(x), up(x)))` with the kernel; a qwen3_moe sparse
  block's `SwitchGLU` gets the kernel as its activation while this forward runs (the attribute
  is put back afterwards, so the model object is left as loaded).

Each call goes through the kernel's gate, which counts a dispatch or a fallback with its reason
(`coldbench.kernels.COUNTERS`); a model the step cannot drive (another architecture, sliding-window
layers, an unknown MLP or norm class) runs the model's own forward and says why in `reason`,
which the cell records as every requested fast path's fallback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen3, qwen3_moe
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.switch_layers import SwiGLU, SwitchGLU

from coldbench.kernels.add_rms_norm import add_rms_norm
from coldbench.kernels.swiglu import swiglu

# The dense MLP classes whose __call__ is exactly down(swiglu(gate(x), up(x))).
_DENSE_MLPS = (llama.MLP, qwen3.MLP, qwen3_moe.MLP)


class FusedSwiGLU:
    """A SwitchGLU activation (called as `activation(x_up, x_gate)`) through the kernel."""

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        return swiglu(gate, x)


def layer_problem(layer: Any, model_type: str) -> str | None:
    """Why the fused step cannot drive this block, or None."""
    if getattr(layer, "use_sliding", False):
        return f"layers of {model_type} use sliding-window attention"
    for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"):
        if not hasattr(layer, name):
            return f"layers of {model_type} have no {name}"
    for name in ("input_layernorm", "post_attention_layernorm"):
        if type(getattr(layer, name)) is not nn.RMSNorm:
            return f"{name} of {model_type} is {type(getattr(layer, name)).__name__}, not RMSNorm"
    mlp = layer.mlp
    if not isinstance(mlp, _DENSE_MLPS) and not _switch_glu(mlp):
        return f"mlp of {model_type} is {type(mlp).__name__}, not a SwiGLU MLP the step knows"
    return None


def _switch_glu(mlp: Any) -> SwitchGLU | None:
    switch = getattr(mlp, "switch_mlp", None)
    if isinstance(mlp, qwen3_moe.Qwen3MoeSparseMoeBlock) and isinstance(switch, SwitchGLU):
        return switch if isinstance(switch.activation, SwiGLU | FusedSwiGLU) else None
    return None


class KernelSteps:
    """The requested fast paths applied to a model's backbone (see the module docstring)."""

    def __init__(self, inner: Any, model_type: str, *, fused_swiglu: bool, fused_norm: bool):
        self.inner = inner
        self.fused_swiglu = fused_swiglu
        self.fused_norm = fused_norm
        self.reason: str | None = None
        layers = list(getattr(inner, "layers", []) or [])
        if not layers:
            self.reason = f"architecture {model_type} has no layers the step can drive"
        else:
            self.reason = next(
                (p for p in (layer_problem(layer, model_type) for layer in layers) if p), None
            )
        if self.reason is None and type(inner.norm) is not nn.RMSNorm:
            self.reason = f"the final norm of {model_type} is not RMSNorm"
        self.switches = [s for s in (_switch_glu(layer.mlp) for layer in layers) if s]

    @contextmanager
    def _moe_activation(self) -> Iterator[None]:
        if not (self.fused_swiglu and self.switches):
            yield
            return
        saved = [switch.activation for switch in self.switches]
        fused = FusedSwiGLU()
        for switch in self.switches:
            switch.activation = fused
        try:
            yield
        finally:
            for switch, activation in zip(self.switches, saved, strict=True):
                switch.activation = activation

    def mlp(self, mlp: Any, y: mx.array) -> mx.array:
        if self.fused_swiglu and isinstance(mlp, _DENSE_MLPS):
            return mlp.down_proj(swiglu(mlp.gate_proj(y), mlp.up_proj(y)))
        return mlp(y)

    def backbone(self, tokens: mx.array, prompt_cache: list[Any]) -> mx.array:
        inner = self.inner
        h = inner.embed_tokens(tokens)
        mask = create_attention_mask(h, prompt_cache[0])
        layers = inner.layers
        with self._moe_activation():
            y = layers[0].input_layernorm(h)
            for index, (layer, cache) in enumerate(zip(layers, prompt_cache, strict=True)):
                if index > 0 and not self.fused_norm:
                    y = layer.input_layernorm(h)
                r = layer.self_attn(y, mask, cache)
                post = layer.post_attention_layernorm
                if self.fused_norm:
                    h, y = add_rms_norm(h, r, post.weight, post.eps)
                else:
                    h = h + r
                    y = post(h)
                r = self.mlp(layer.mlp, y)
                if self.fused_norm:
                    following = (
                        layers[index + 1].input_layernorm if index + 1 < len(layers) else inner.norm
                    )
                    h, y = add_rms_norm(h, r, following.weight, following.eps)
                else:
                    h = h + r
        return y if self.fused_norm else inner.norm(h)
