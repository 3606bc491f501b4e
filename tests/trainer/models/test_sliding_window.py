"""Sliding-window draft layers: the windowed (and causal, `model.causal_layers`) mask against a
brute-force rule (dense and flex's mask_mod, unpacked and packed), the window where it must and
must not change the draft, and evaluation on the same mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from specdraft.trainer.models import (
    build_draft,
    dense_block_mask,
    flex_block_mask,
    load_target_config,
    load_target_head,
    sample_anchors,
)
from specdraft.trainer.models.layers import DFlashDecoderLayer, rotary_tables
from specdraft.trainer.models.masks import block_mask_mod

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _reference(anchors, keep, context_len, block_size, window, document_ids=None, causal=False):
    """The rule one (query, key) pair at a time: the unwindowed rule, and p - j < window; a
    causal layer's query at slot k sees its block's slots <= k."""
    batch, num_anchors = anchors.shape
    queries = num_anchors * block_size
    mask = torch.zeros(batch, 1, queries, context_len + queries, dtype=torch.bool)
    for b in range(batch):
        for q in range(queries):
            block, slot = divmod(q, block_size)
            anchor = int(anchors[b, block])
            for k in range(context_len + queries):
                if not keep[b, block]:
                    allowed = k == context_len + q
                elif k < context_len:
                    allowed = k < anchor and (window is None or anchor + slot - k < window)
                    if document_ids is not None:
                        allowed = allowed and bool(document_ids[b, k] == document_ids[b, anchor])
                else:
                    key_block, key_slot = divmod(k - context_len, block_size)
                    allowed = key_block == block and (not causal or key_slot <= slot)
                mask[b, 0, q, k] = allowed
    return mask


@st.composite
def _mask_case(draw):
    """Anchors, keep flags, a window (or none), maybe a packed row's document ids, causal or
    not."""
    context_len = draw(st.integers(2, 12))
    num_anchors = draw(st.integers(1, 3))
    block_size = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 2))
    anchors = [
        draw(st.lists(st.integers(0, context_len - 1), min_size=num_anchors, max_size=num_anchors))
        for _ in range(batch)
    ]
    keep = [
        draw(st.lists(st.booleans(), min_size=num_anchors, max_size=num_anchors))
        for _ in range(batch)
    ]
    window = draw(st.one_of(st.none(), st.integers(block_size, context_len + block_size)))
    document_ids = None
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(1, context_len - 1), max_size=3)))
        row = torch.zeros(context_len, dtype=torch.long)
        for cut in cuts:
            row[cut:] += 1
        document_ids = row.expand(batch, context_len).clone()
    return (
        torch.tensor(anchors),
        torch.tensor(keep),
        context_len,
        block_size,
        window,
        document_ids,
        draw(st.booleans()),
    )


@settings(max_examples=80, deadline=None)
@given(case=_mask_case())
def test_the_windowed_and_causal_dense_mask_and_flex_mask_mod_follow_the_rule(case):
    anchors, keep, context_len, block_size, window, document_ids, causal = case
    want = _reference(anchors, keep, context_len, block_size, window, document_ids, causal)
    dense = dense_block_mask(anchors, keep, context_len, block_size, document_ids, window, causal)
    assert torch.equal(dense, want)
    # flex's mask_mod, evaluated at every (query, key) pair on the CPU.
    mod = block_mask_mod(anchors, keep, context_len, block_size, document_ids, window, causal)
    queries = anchors.shape[1] * block_size
    flex = create_mask(mod, anchors.shape[0], 1, queries, context_len + queries, device="cpu")
    assert torch.equal(flex, want)


def test_a_window_cuts_only_context_keys_at_least_window_positions_back():
    anchors, keep = torch.tensor([[10]]), torch.tensor([[True]])
    mask = dense_block_mask(anchors, keep, 12, 4, window=6)[0, 0]
    # Slot k sits at position 10 + k and sees context 10 + k - 5 .. 9, and its whole block.
    for slot in range(4):
        seen = mask[slot, :12].nonzero().flatten().tolist()
        assert seen == list(range(10 + slot - 5, 10))
        assert mask[slot, 12:].all()


def test_dense_and_flex_give_the_same_windowed_layer_output():
    torch.manual_seed(0)
    layer = DFlashDecoderLayer(32, 48, num_heads=4, num_kv_heads=2, head_dim=8, eps=1e-6)
    anchors = torch.tensor([[0, 3, 7, 12, 0], [2, 5, 9, 18, 0]])
    keep = torch.tensor([[True, True, True, True, False], [True, True, False, True, False]])
    positions = (anchors[:, :, None] + torch.arange(4)).flatten(1)
    rotary = rotary_tables(positions, 20, 8, 10000.0, torch.float32)
    hidden, context = torch.randn(2, 20, 32), torch.randn(2, 20, 32)
    dense = dense_block_mask(anchors, keep, 20, 4, window=6)
    flex = flex_block_mask(anchors, keep, 20, 4, window=6)
    with torch.no_grad():
        out_dense = layer(hidden, context, rotary, dense)
        out_flex = layer(hidden, context, rotary, flex)
    torch.testing.assert_close(out_dense, out_flex, rtol=1e-5, atol=1e-5)


def _drafts(draft_model_config, algorithm, window, layer_types=None):
    """A full-attention draft and the same weights with a window (fp32)."""
    torch.manual_seed(0)
    full_cfg = draft_model_config(algorithm)
    target = load_target_config(full_cfg.target)
    full = build_draft(full_cfg, target, dtype=torch.float32)
    windowed_cfg = draft_model_config(algorithm, sliding_window=window, layer_types=layer_types)
    windowed = build_draft(windowed_cfg, target, dtype=torch.float32)
    windowed.load_state_dict(full.state_dict())
    head = load_target_head(full_cfg.target, torch.float32)
    return full, windowed, head


def _hidden(draft, batch, anchors, keep, head):
    with torch.no_grad():
        return draft.run_backbone(
            batch["input_ids"], batch["hidden_states"], anchors, keep, head, "sdpa"
        )


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_a_window_at_least_the_context_is_exactly_full_attention(
    algorithm, draft_model_config, make_draft_batch, random_samples
):
    full, windowed, head = _drafts(draft_model_config, algorithm, window=24)
    assert windowed.config.layer_windows() == (24, 24)
    batch = make_draft_batch(random_samples([20, 9], seed=3), 20)
    anchors, keep = sample_anchors(batch["loss_mask"], batch["sample_id"], 5, seed=0)
    # Query positions reach 19 + 3 = 22 < 24: the window cuts nothing, fp32 bit for bit.
    assert torch.equal(
        _hidden(full, batch, anchors, keep, head), _hidden(windowed, batch, anchors, keep, head)
    )


@pytest.mark.parametrize("layer_types", [None, ["full_attention", "sliding_attention"]])
def test_a_window_changes_exactly_the_blocks_that_reach_past_it(
    layer_types, draft_model_config, make_draft_batch, random_samples
):
    window = 6
    full, windowed, head = _drafts(draft_model_config, "dflash", window, layer_types)
    batch = make_draft_batch(random_samples([20, 20], seed=4), 20)
    anchors = torch.tensor([[0, 2, 9, 15], [1, 3, 12, 18]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    got_full = _hidden(full, batch, anchors, keep, head)
    got_windowed = _hidden(windowed, batch, anchors, keep, head)
    # A block at anchor a sees context 0 .. a-1 from positions a .. a+3: cut iff a + 3 >= 6.
    reaches = anchors + 3 >= window
    for b in range(2):
        for n in range(4):
            same = torch.equal(got_full[b, n], got_windowed[b, n])
            assert same != bool(reaches[b, n]), (b, n, anchors[b, n])


def test_evaluation_uses_the_windowed_mask(draft_model_config, make_draft_batch, random_samples):
    full, windowed, head = _drafts(draft_model_config, "dflash", window=4)
    batch = make_draft_batch(random_samples([20], seed=6), 20)
    anchors = torch.tensor([[15]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    hidden = _hidden(windowed, batch, anchors, keep, head)
    tokens = windowed.predict_blocks(
        batch["input_ids"], batch["hidden_states"], anchors, keep, head
    )
    with torch.no_grad():
        want = head.logits(hidden[:, :, 1:]).argmax(-1)
    assert torch.equal(tokens, want)
    assert not torch.equal(hidden, _hidden(full, batch, anchors, keep, head))


def test_the_window_travels_in_the_draft_config(draft_model_config, tmp_path):
    _, windowed, _ = _drafts(
        draft_model_config, "dflash", window=64, layer_types=["sliding_attention", "full_attention"]
    )
    config = windowed.config
    assert (config.use_sliding_window, config.sliding_window) == (True, 64)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.is_causal is False
    assert config.layer_windows() == (64, None)
    windowed.save_pretrained(tmp_path)
    again = type(windowed).from_pretrained(tmp_path)
    assert again.config.layer_windows() == (64, None)
