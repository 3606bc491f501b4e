"""Draft attention masks: the rule, dense == flex, and forbidden keys get exactly zero weight."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.models import dense_block_mask, flex_block_mask
from specdraft.trainer.models.layers import DFlashDecoderLayer, rotary_tables

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _naive_mask(anchors, keep, context_len, block_size):
    """The rule, one (query, key) pair at a time."""
    batch, num_anchors = anchors.shape
    queries = num_anchors * block_size
    mask = torch.zeros(batch, 1, queries, context_len + queries, dtype=torch.bool)
    for b in range(batch):
        for q in range(queries):
            block = q // block_size
            for k in range(context_len + queries):
                if not keep[b, block]:
                    allowed = k == context_len + q
                elif k < context_len:
                    allowed = k < anchors[b, block]
                else:
                    allowed = (k - context_len) // block_size == block
                mask[b, 0, q, k] = allowed
    return mask


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    context_len=st.integers(1, 9),
    num_anchors=st.integers(1, 3),
    block_size=st.integers(1, 3),
)
def test_dense_mask_follows_the_rule(data, context_len, num_anchors, block_size):
    anchors = torch.tensor(
        [
            data.draw(
                st.lists(
                    st.integers(0, context_len - 1), min_size=num_anchors, max_size=num_anchors
                )
            )
        ]
    )
    keep = torch.tensor(
        [data.draw(st.lists(st.booleans(), min_size=num_anchors, max_size=num_anchors))]
    )
    got = dense_block_mask(anchors, keep, context_len, block_size)
    assert torch.equal(got, _naive_mask(anchors, keep, context_len, block_size))


def _layer_inputs(batch=2, context_len=20, num_anchors=5, block_size=4, hidden=32):
    torch.manual_seed(0)
    layer = DFlashDecoderLayer(hidden, 48, num_heads=4, num_kv_heads=2, head_dim=8, eps=1e-6)
    anchors = torch.tensor([[0, 3, 7, 12, 0], [2, 5, 9, 18, 0]])
    keep = torch.tensor([[True, True, True, True, False], [True, True, False, True, False]])
    positions = (anchors[:, :, None] + torch.arange(block_size)).flatten(1)
    rotary = rotary_tables(positions, context_len, 8, 10000.0, torch.float32)
    hidden_states = torch.randn(batch, num_anchors * block_size, hidden)
    context = torch.randn(batch, context_len, hidden)
    return layer, anchors, keep, rotary, hidden_states, context


def test_dense_and_flex_masks_give_the_same_layer_output():
    layer, anchors, keep, rotary, hidden, context = _layer_inputs()
    dense = dense_block_mask(anchors, keep, context.shape[1], 4)
    flex = flex_block_mask(anchors, keep, context.shape[1], 4)
    with torch.no_grad():
        out_dense = layer(hidden, context, rotary, dense)
        out_flex = layer(hidden, context, rotary, flex)
    torch.testing.assert_close(out_dense, out_flex, rtol=1e-5, atol=1e-5)


def test_forbidden_context_and_other_blocks_get_exactly_zero_weight():
    layer, anchors, keep, rotary, hidden, context = _layer_inputs()
    block_size, context_len = 4, context.shape[1]
    mask = dense_block_mask(anchors, keep, context_len, block_size)
    context = context.clone().requires_grad_(True)
    hidden = hidden.clone().requires_grad_(True)
    out = layer(hidden, context, rotary, mask)
    # Query block 1 of row 0 (anchor 3): only context 0..2 and its own block may matter.
    target = out[0, block_size : 2 * block_size].sum()
    grad_context, grad_hidden = torch.autograd.grad(target, (context, hidden))
    assert grad_context[0, :3].abs().sum() > 0
    assert torch.equal(grad_context[0, 3:], torch.zeros_like(grad_context[0, 3:]))
    assert torch.equal(grad_context[1], torch.zeros_like(grad_context[1]))
    own = slice(block_size, 2 * block_size)
    assert grad_hidden[0, own].abs().sum() > 0
    others = torch.ones(hidden.shape[1], dtype=torch.bool)
    others[own] = False
    assert torch.equal(grad_hidden[0, others], torch.zeros_like(grad_hidden[0, others]))


def test_perturbing_forbidden_keys_leaves_allowed_outputs_bit_identical():
    layer, anchors, keep, rotary, hidden, context = _layer_inputs()
    mask = dense_block_mask(anchors, keep, context.shape[1], 4)
    with torch.no_grad():
        before = layer(hidden, context, rotary, mask)
        noisy = context.clone()
        noisy[0, 12:] += 100.0 * torch.randn_like(noisy[0, 12:])  # >= every anchor of row 0
        after = layer(hidden, noisy, rotary, mask)
    assert torch.equal(before[0], after[0])


def test_blocks_that_are_not_kept_stay_finite_in_forward_and_backward():
    layer, anchors, keep, rotary, hidden, context = _layer_inputs()
    mask = dense_block_mask(anchors, keep, context.shape[1], 4)
    hidden = hidden.clone().requires_grad_(True)
    out = layer(hidden, context, rotary, mask)
    assert torch.isfinite(out).all()
    # Weight the dropped blocks by zero, as the losses do: their gradient must be exactly zero
    # and nothing may turn NaN.
    block_keep = keep.repeat_interleave(4, dim=1)[..., None].float()
    (out * block_keep).sum().backward()
    assert torch.isfinite(hidden.grad).all()
    dropped = hidden.grad[~keep.repeat_interleave(4, dim=1)]
    assert dropped.shape[0] == 3 * 4
    assert torch.equal(dropped, torch.zeros_like(dropped))
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
