"""Causal draft layers (`model.causal_layers`): a causal layer's token never reading its block's
later tokens, and the causality travelling in the draft config as the engines read it. (The
mask against its brute-force rule is test_sliding_window.py's hypothesis test.)"""

from __future__ import annotations

import pytest
import torch

from specdraft.trainer.models import build_draft, dense_block_mask, load_target_config
from specdraft.trainer.models.layers import DFlashDecoderLayer, rotary_tables

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

MIXED = ["sliding_attention", "full_attention"]


@pytest.mark.parametrize("causal", [False, True])
def test_a_causal_layer_s_token_never_reads_its_block_s_later_tokens(causal):
    torch.manual_seed(0)
    layer = DFlashDecoderLayer(32, 48, num_heads=4, num_kv_heads=2, head_dim=8, eps=1e-6)
    anchors, keep = torch.tensor([[3, 9]]), torch.tensor([[True, True]])
    positions = (anchors[:, :, None] + torch.arange(4)).flatten(1)
    rotary = rotary_tables(positions, 12, 8, 10000.0, torch.float32)
    hidden, context = torch.randn(1, 8, 32), torch.randn(1, 12, 32)
    mask = dense_block_mask(anchors, keep, 12, 4, causal=causal)
    changed = hidden.clone()
    changed[0, 6] += 1.0  # slot 2 of the second block
    with torch.no_grad():
        before, after = layer(hidden, context, rotary, mask), layer(changed, context, rotary, mask)
    # The first block never sees the second; slots 0-1 of the second see slot 2 only both ways.
    assert torch.equal(before[0, :4], after[0, :4])
    assert torch.equal(before[0, 4:6], after[0, 4:6]) == causal
    assert not torch.equal(before[0, 6:], after[0, 6:])


@pytest.mark.parametrize(
    ("attention", "is_causal", "per_layer"),
    [
        ({}, False, (False, False)),
        ({"causal_layers": "all"}, True, (True, True)),
        ({"causal_layers": "sliding", "sliding_window": 64}, True, (True, True)),
        (
            {"causal_layers": "sliding", "sliding_window": 64, "layer_types": MIXED},
            None,
            (True, False),
        ),
        ({"causal_layers": "sliding"}, False, (False, False)),
    ],
)
def test_the_causality_travels_in_the_draft_config_as_the_engines_read_it(
    attention, is_causal, per_layer, draft_model_config, tmp_path
):
    cfg = draft_model_config("dflash", **attention)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    # is_causal: the draft's one causality; null when only its sliding layers are causal.
    assert draft.config.is_causal is is_causal
    assert draft.config.layer_causal() == per_layer
    draft.save_pretrained(tmp_path)
    again = type(draft).from_pretrained(tmp_path)
    assert again.config.is_causal is is_causal
    assert again.config.layer_causal() == per_layer
