"""Document masks of packed rows: the rule, dense == flex (as booleans and as forwards)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from specdraft.trainer.models import (
    DraftTrainSpec,
    both_block_masks,
    build_draft,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.models.layers import DFlashDecoderLayer, rotary_tables

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _document_ids(doc_lengths: list[int], length: int) -> list[int]:
    """A row's document index per token, -1 on the padding after its documents."""
    ids = [doc for doc, size in enumerate(doc_lengths) for _ in range(size)]
    return ids + [-1] * (length - len(ids))


def _naive_mask(anchors, keep, document_ids, block_size):
    """The packed rule, one (query, key) pair at a time."""
    batch, num_anchors = anchors.shape
    context_len = document_ids.shape[1]
    queries = num_anchors * block_size
    mask = torch.zeros(batch, 1, queries, context_len + queries, dtype=torch.bool)
    for b in range(batch):
        for q in range(queries):
            block = q // block_size
            anchor = int(anchors[b, block])
            for k in range(context_len + queries):
                if not keep[b, block]:
                    allowed = k == context_len + q
                elif k < context_len:
                    allowed = k < anchor and document_ids[b, k] == document_ids[b, anchor]
                else:
                    allowed = (k - context_len) // block_size == block
                mask[b, 0, q, k] = allowed
    return mask


@st.composite
def packed_rows(draw):
    """(document_ids [B, S], anchors [B, N], keep [B, N], block_size) of random packed rows."""
    batch = draw(st.integers(1, 2))
    rows = [draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)) for _ in range(batch)]
    length = max(sum(row) for row in rows) + draw(st.integers(0, 3))
    num_anchors = draw(st.integers(1, 3))
    block_size = draw(st.integers(1, 3))
    positions = st.lists(st.integers(0, length - 1), min_size=num_anchors, max_size=num_anchors)
    flags = st.lists(st.booleans(), min_size=num_anchors, max_size=num_anchors)
    document_ids = torch.tensor([_document_ids(row, length) for row in rows])
    anchors = torch.tensor([draw(positions) for _ in range(batch)])
    keep = torch.tensor([draw(flags) for _ in range(batch)])
    return document_ids, anchors, keep, block_size


@settings(max_examples=30, deadline=None)
@given(case=packed_rows())
def test_dense_and_flex_masks_follow_the_document_rule(case):
    document_ids, anchors, keep, block_size = case
    context_len = document_ids.shape[1]
    dense, flex = both_block_masks(anchors, keep, context_len, block_size, document_ids)
    assert torch.equal(dense, _naive_mask(anchors, keep, document_ids, block_size))
    queries = anchors.shape[1] * block_size
    from_flex = create_mask(flex.mask_mod, anchors.shape[0], 1, queries, context_len + queries)
    assert torch.equal(from_flex, dense)


def test_a_single_document_row_gets_the_unpacked_mask():
    anchors = torch.tensor([[0, 3, 7, 12, 0]])
    keep = torch.tensor([[True, True, True, True, False]])
    document_ids = torch.tensor([_document_ids([16], 20)])
    packed = both_block_masks(anchors, keep, 20, 4, document_ids)
    unpacked = both_block_masks(anchors, keep, 20, 4)
    assert torch.equal(packed[0], unpacked[0])


def _packed_layer_inputs(block_size=4, hidden=32):
    torch.manual_seed(0)
    layer = DFlashDecoderLayer(hidden, 48, num_heads=4, num_kv_heads=2, head_dim=8, eps=1e-6)
    # Row 0: documents of 7, 6 and 5 tokens, 2 padding; row 1: 12 and 8 tokens.
    doc_lengths = [[7, 6, 5], [12, 8]]
    document_ids = torch.tensor([_document_ids(row, 20) for row in doc_lengths])
    position_ids = torch.stack(
        [
            torch.cat([torch.arange(n) for n in row] + [torch.zeros(20 - sum(row))])
            for row in doc_lengths
        ]
    ).long()
    anchors = torch.tensor([[1, 8, 10, 14, 0], [2, 9, 12, 15, 0]])
    keep = torch.tensor([[True, True, True, True, False], [True, True, False, True, False]])
    draft_positions = position_ids.gather(1, anchors)[:, :, None] + torch.arange(block_size)
    rotary = rotary_tables(draft_positions.flatten(1), 20, 8, 10000.0, torch.float32, position_ids)
    hidden_states = torch.randn(2, anchors.shape[1] * block_size, hidden)
    context = torch.randn(2, 20, hidden)
    return layer, anchors, keep, document_ids, rotary, hidden_states, context


def test_dense_and_flex_masks_give_the_same_layer_output_on_packed_rows():
    layer, anchors, keep, document_ids, rotary, hidden, context = _packed_layer_inputs()
    dense, flex = both_block_masks(anchors, keep, 20, 4, document_ids)
    with torch.no_grad():
        out_dense = layer(hidden, context, rotary, dense)
        out_flex = layer(hidden, context, rotary, flex)
    torch.testing.assert_close(out_dense, out_flex, rtol=1e-5, atol=1e-5)


def test_other_documents_of_the_row_get_exactly_zero_weight():
    layer, anchors, keep, document_ids, rotary, hidden, context = _packed_layer_inputs()
    dense, _ = both_block_masks(anchors, keep, 20, 4, document_ids)
    context = context.clone().requires_grad_(True)
    out = layer(hidden, context, rotary, dense)
    # Block 2 of row 0 is anchored at 10, in the second document (positions 7..12).
    (grad,) = torch.autograd.grad(out[0, 8:12].sum(), context)
    assert grad[0, 7:10].abs().sum() > 0
    outside = torch.ones(20, dtype=torch.bool)
    outside[7:10] = False
    assert torch.equal(grad[0, outside], torch.zeros_like(grad[0, outside]))


@pytest.mark.parametrize(
    ("algorithm", "overrides"),
    [("dflash2", {"dflash2": {"selector_gold_policy": "insert"}}), ("dspark", {})],
)
def test_flex_and_sdpa_drafts_agree_on_a_packed_batch(
    algorithm, overrides, draft_model_config, make_packed_batch, random_samples
):
    torch.manual_seed(0)
    cfg = draft_model_config(algorithm, **overrides)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    head = load_target_head(cfg.target, torch.float32)
    samples = random_samples([14, 9, 11, 20], seed=6)
    batch = make_packed_batch(samples, [[0, 1, 2], [3]], 40)
    outs = {}
    for backend in ("sdpa", "flex"):
        spec = DraftTrainSpec(num_anchors=6, loss_decay_gamma=4.0, attention_backend=backend)
        with torch.no_grad():  # flex has no CPU backward
            outs[backend] = draft(batch, head, spec)
    assert outs["sdpa"].denominator > 0
    torch.testing.assert_close(outs["flex"].numerator, outs["sdpa"].numerator, rtol=1e-5, atol=1e-5)
    assert torch.equal(outs["flex"].denominator, outs["sdpa"].denominator)
