"""Draft building blocks: the in-block convolution and RoPE as the serving stack computes it."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

from specdraft.trainer.models.dflash2.conv import BlockDepthwiseConv
from specdraft.trainer.models.layers import apply_rotary, rotary_tables


def _random_conv(hidden, block_size, taps, group_size, seed):
    torch.manual_seed(seed)
    conv = BlockDepthwiseConv(hidden, block_size, taps, group_size).double()
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    return conv


def _naive_convolve(x, delta, base, block_size, group_size):
    """y[t, c] = sum_j (base[j, c] + delta[t, j, c // g]) * x[t - j, c], same block only."""
    batch, length, hidden = x.shape
    out = torch.zeros_like(x)
    for b in range(batch):
        for t in range(length):
            for j in range(base.shape[0]):
                if t % block_size - j < 0:
                    continue  # would cross into the previous block
                for c in range(hidden):
                    coefficient = base[j, c] + delta[b, t, j, c // group_size]
                    out[b, t, c] += coefficient * x[b, t - j, c]
    return out


@settings(max_examples=15, deadline=None)
@given(
    block_size=st.integers(1, 4),
    num_blocks=st.integers(1, 3),
    taps=st.integers(1, 3),
    group_size=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 1000),
)
def test_conv_matches_the_formula_and_never_crosses_a_block(
    block_size, num_blocks, taps, group_size, seed
):
    hidden = 4
    conv = _random_conv(hidden, block_size, taps, group_size, seed)
    x = torch.randn(2, num_blocks * block_size, hidden, dtype=torch.float64)
    prepared, finish = conv.prepare(x)
    delta = conv.kernel_projection(x).view(2, -1, 2, taps, hidden // group_size)
    expected = _naive_convolve(x, delta[:, :, 0], conv.base_kernel[0], block_size, group_size)
    torch.testing.assert_close(prepared, expected)
    finished = conv.finish(x, finish)
    expected = _naive_convolve(x, delta[:, :, 1], conv.base_kernel[1], block_size, group_size)
    torch.testing.assert_close(finished, expected)


def test_changing_one_block_leaves_the_other_blocks_untouched():
    conv = _random_conv(8, block_size=4, taps=2, group_size=4, seed=0)
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    changed = x.clone()
    changed[0, 4:8] += 1.0  # block 1 only
    before, after = conv.prepare(x)[0], conv.prepare(changed)[0]
    assert torch.equal(before[0, :4], after[0, :4])
    assert torch.equal(before[0, 8:], after[0, 8:])
    assert not torch.equal(before[0, 4:8], after[0, 4:8])


def test_a_fresh_conv_is_the_identity():
    conv = BlockDepthwiseConv(8, block_size=4, taps=2, group_size=4)
    x = torch.randn(2, 8, 8)
    prepared, finish = conv.prepare(x)
    assert torch.equal(prepared, x)
    assert torch.equal(conv.finish(x, finish), x)


def test_rope_matches_hf_qwen3():
    config = Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16)
    config.rope_parameters = {"rope_theta": 1e6, "rope_type": "default"}
    positions = torch.tensor([[0, 5, 6, 7, 300], [9, 10, 11, 12, 2047]])
    hf_cos, hf_sin = Qwen3RotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions)
    tables = rotary_tables(positions, 6, 16, 1e6, torch.float32)
    torch.testing.assert_close(tables.draft_cos, hf_cos)
    torch.testing.assert_close(tables.draft_sin, hf_sin)
    context_cos, _ = Qwen3RotaryEmbedding(config)(torch.zeros(1), torch.arange(6)[None])
    torch.testing.assert_close(tables.context_cos, context_cos)
    q = torch.randn(2, 5, 4, 16)  # [B, T, heads, D]
    hf_q, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), hf_cos, hf_sin)
    torch.testing.assert_close(
        apply_rotary(q, tables.draft_cos, tables.draft_sin), hf_q.transpose(1, 2)
    )
