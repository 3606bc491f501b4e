"""Qwen3-style building blocks of the draft: RMSNorm, RoPE, SwiGLU MLP, attention, decoder layer.

The decoder layer is the unit that FSDP wraps and `apply_compile` compiles in place, so its
forward is static-shape in, static-shape out: no host syncs, no branching on tensor values (the
only branch is on the Python type of the mask, which is fixed for a run).

Layer forward signature, shared by every draft family:

    layer(hidden [B, T, H], context [B, S, H], rotary: RotaryTables, mask) -> [B, T, H]

- `hidden`: the draft tokens, T = num_anchors * block_size, block-major.
- `context`: the projected target features (fc + norm), injected as extra keys and values in
  front of the draft tokens' own keys and values.
- `rotary`: cos/sin tables of the draft positions [B, T, D] and the context positions [1, S, D]
  ([B, S, D] for a packed batch, whose positions restart at every document).
- `mask`: a dense bool tensor [B, 1, T, S + T] (SDPA) or a flex_attention BlockMask.

An attention-sink layer (`model.attention_sink_bias`) adds one learned logit per head to every
query's softmax, with a zero value (gpt-oss's sinks; vLLM's `attention_sink_bias`, llama.cpp's
`attn_sinks`): the weights over the real keys then sum to sigmoid(lse - sink) instead of 1, so a
query can attend to (almost) nothing. The dense path scores it as one more column; flex scales
its output by sigmoid(lse - sink) from the log-sum-exp it returns, the same number.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention)


def _flex(query: Tensor, key: Tensor, value: Tensor, block_mask: BlockMask, **aux: Any) -> Any:
    """flex_attention: fused via torch.compile on CUDA; eager on CPU (forward only in 2.13).

    Inside an already compiled block the plain function is traced into the block's graph.
    `aux` (return_aux=AuxRequest(lse=True)) asks for the log-sum-exp too.
    """
    if query.device.type == "cuda" and not torch.compiler.is_compiling():
        # Eager flex materialises the whole score matrix; the compiled kernel does not.
        return _compiled_flex_attention()(
            query, key, value, block_mask=block_mask, enable_gqa=True, **aux
        )
    return flex_attention(query, key, value, block_mask=block_mask, enable_gqa=True, **aux)


def attend_with_sink(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | BlockMask, sink: Tensor
) -> Tensor:
    """Attention [B, H, T, D] whose softmax also holds a per-head sink logit `sink` [H] with a
    zero value (see the module docstring)."""
    if isinstance(mask, BlockMask):
        out, aux = _flex(query, key, value, mask, return_aux=AuxRequest(lse=True))
        # sum_j p_j v_j over the keys alone, scaled by exp(lse) / (exp(lse) + exp(sink)).
        kept = torch.sigmoid(aux.lse.float() - sink.float()[None, :, None])
        return out * kept.unsqueeze(-1).to(out.dtype)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = (query @ key.transpose(-1, -2)).float() * query.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    sink_column = sink.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    return weights.to(value.dtype) @ value


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, scaled by a learned weight (Qwen3 convention)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last dim."""
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryTables(NamedTuple):
    """cos/sin tables of the draft positions [B, T, D] and the context positions [1 or B, S, D]."""

    draft_cos: Tensor
    draft_sin: Tensor
    context_cos: Tensor
    context_sin: Tensor


def _cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    inv_freq = 1.0 / (
        theta
        ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_tables(
    draft_positions: Tensor,
    context_len: int,
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    context_positions: Tensor | None = None,
) -> RotaryTables:
    """RoPE tables for draft positions [B, T] and context positions 0..context_len-1.

    A packed batch passes its per-row `context_positions` [B, S] (positions restart at every
    document); the context tables are then [B, S, D] instead of [1, S, D].
    """
    if context_positions is None:
        context_positions = torch.arange(context_len, device=draft_positions.device)[None]
    draft_cos, draft_sin = _cos_sin(draft_positions, head_dim, theta, dtype)
    context_cos, context_sin = _cos_sin(context_positions, head_dim, theta, dtype)
    return RotaryTables(draft_cos, draft_sin, context_cos, context_sin)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, T, heads, D] by tables [B or 1, T, D] (neox layout, as HF Qwen3)."""
    cos = cos.unsqueeze(2)
    sin = sin.unsqueeze(2)
    return x * cos + _rotate_half(x) * sin


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftAttention(nn.Module):
    """GQA attention with per-head q/k RMSNorm; context features add keys/values, not queries."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        sink: bool = False,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
                f"({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        # The per-head sink logit (the engines' tensor name); 0 at start: the sink weighs as
        # much as one key scored 0.
        self.attention_sink_bias = nn.Parameter(torch.zeros(num_heads)) if sink else None

    def _keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        batch, length, _ = x.shape
        key = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim))
        value = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        return apply_rotary(key, cos, sin), value

    def forward(
        self, hidden: Tensor, context: Tensor, rotary: RotaryTables, mask: Tensor | BlockMask
    ) -> Tensor:
        """Attend from the draft tokens to [context | draft tokens]; see the module docstring."""
        batch, length, _ = hidden.shape
        query = self.q_norm(self.q_proj(hidden).view(batch, length, self.num_heads, self.head_dim))
        query = apply_rotary(query, rotary.draft_cos, rotary.draft_sin)
        context_key, context_value = self._keys_values(
            context, rotary.context_cos, rotary.context_sin
        )
        draft_key, draft_value = self._keys_values(hidden, rotary.draft_cos, rotary.draft_sin)
        query = query.transpose(1, 2)
        key = torch.cat([context_key, draft_key], dim=1).transpose(1, 2)
        value = torch.cat([context_value, draft_value], dim=1).transpose(1, 2)
        if self.attention_sink_bias is not None:
            out = attend_with_sink(query, key, value, mask, self.attention_sink_bias)
        elif isinstance(mask, BlockMask):
            out = _flex(query, key, value, mask)
        else:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.o_proj(out)


class DFlashDecoderLayer(nn.Module):
    """Pre-norm decoder layer: h + attn(norm(h)), then h + mlp(norm(h))."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        sink: bool = False,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.self_attn = DraftAttention(hidden_size, num_heads, num_kv_heads, head_dim, eps, sink)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLUMLP(hidden_size, intermediate_size)

    def forward(
        self, hidden: Tensor, context: Tensor, rotary: RotaryTables, mask: Tensor | BlockMask
    ) -> Tensor:
        """One draft layer; see the module docstring for the signature."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), context, rotary, mask)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def plain_layer(config: Any) -> DFlashDecoderLayer:
    """A DFlash decoder layer of a draft config's shape (no in-block convolution)."""
    return DFlashDecoderLayer(
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.rms_norm_eps,
        bool(getattr(config, "attention_sink_bias", False)),
    )
