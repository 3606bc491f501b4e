"""The learned attention sink (`model.attention_sink_bias`): the dense and flex paths compute the
same attention, a sink far below every score is plain attention and a high one silences the
layer, it learns, and it travels in the draft config, the checkpoint and the exports under the
names the engines load."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specdraft.trainer.export import ExportRefused
from specdraft.trainer.export.options import ExportOptions
from specdraft.trainer.export.speculators import write_speculators
from specdraft.trainer.export.vllm import write_vllm
from specdraft.trainer.models import (
    build_draft,
    dense_block_mask,
    flex_block_mask,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.models.layers import attend_with_sink

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

ANCHORS = torch.tensor([[0, 3, 7, 12], [2, 5, 9, 18]])
KEEP = torch.tensor([[True, True, True, False], [True, False, True, True]])


def _qkv(heads: int = 4, kv_heads: int = 2):
    torch.manual_seed(0)
    queries, keys = 16, 20 + 16
    return (
        torch.randn(2, heads, queries, 8),
        torch.randn(2, kv_heads, keys, 8),
        torch.randn(2, kv_heads, keys, 8),
    )


def test_dense_and_flex_compute_the_same_sink_attention():
    query, key, value = _qkv()
    sink = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    for window in (None, 6):
        dense = dense_block_mask(ANCHORS, KEEP, 20, 4, window=window)
        flex = flex_block_mask(ANCHORS, KEEP, 20, 4, window=window)
        torch.testing.assert_close(
            attend_with_sink(query, key, value, dense, sink),
            attend_with_sink(query, key, value, flex, sink),
            rtol=1e-5,
            atol=1e-5,
        )


def test_a_sink_far_below_every_score_is_plain_attention_and_a_high_one_silences_the_layer():
    query, key, value = _qkv()
    mask = dense_block_mask(ANCHORS, KEEP, 20, 4)
    plain = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    low = attend_with_sink(query, key, value, mask, torch.full((4,), -1e4))
    torch.testing.assert_close(low, plain, rtol=1e-5, atol=1e-6)
    high = attend_with_sink(query, key, value, mask, torch.full((4,), 1e4))
    assert high.abs().max() < 1e-6
    # A sink at 0 takes a share between the two: every output shrinks toward zero.
    mid = attend_with_sink(query, key, value, mask, torch.zeros(4))
    assert (mid.norm(dim=-1) < plain.norm(dim=-1)).all()


def test_the_sink_learns(draft_model_config, make_draft_batch, random_samples):
    cfg = draft_model_config("dflash", attention_sink_bias=True)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    sinks = [layer.self_attn.attention_sink_bias for layer in draft.layers]
    heads = draft.config.num_attention_heads
    assert all(s is not None and s.shape == (heads,) for s in sinks)
    batch = make_draft_batch(random_samples([20, 12], seed=1), 20)
    anchors = torch.tensor([[4, 9], [2, 6]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    head = load_target_head(cfg.target, torch.float32)
    hidden = draft.run_backbone(
        batch["input_ids"], batch["hidden_states"], anchors, keep, head, "sdpa"
    )
    hidden.square().sum().backward()
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in sinks)


def test_the_sink_travels_under_the_engines_names(draft_model_config, tiny_qwen3_target, tmp_path):
    cfg = draft_model_config("dflash", attention_sink_bias=True, sliding_window=8)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    with torch.no_grad():
        for layer in draft.layers:
            layer.self_attn.attention_sink_bias.uniform_(-1.0, 1.0)
    draft.save_pretrained(tmp_path / "own")
    own = json.loads((tmp_path / "own" / "config.json").read_text())
    assert own["dflash_config"]["attention_sink_bias"] is True  # SGLang's and vLLM's key
    again = type(draft).from_pretrained(tmp_path / "own")
    for ours, theirs in zip(draft.layers, again.layers, strict=True):
        assert torch.equal(ours.self_attn.attention_sink_bias, theirs.self_attn.attention_sink_bias)
    write_vllm(draft, tmp_path / "vllm", ExportOptions(checkpoint="ckpt"))
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["dflash_config"]["attention_sink_bias"] is True
    tensors = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    # qwen3_dflash loads a [heads] tensor per layer; llama.cpp's converter maps the same name
    # (model.layers.N.self_attn.attention_sink_bias) to attn_sinks.
    for index in range(len(draft.layers)):
        assert tensors[f"layers.{index}.self_attn.attention_sink_bias"].shape == (4,)
    with pytest.raises(ExportRefused, match=r"speculators 0\.9\.0's DFlash-family configs"):
        write_speculators(
            draft,
            tmp_path / "spec",
            ExportOptions(checkpoint="ckpt", verifier=tiny_qwen3_target.path),
        )


def test_a_draft_without_a_sink_writes_none(draft_model_config, tmp_path):
    cfg = draft_model_config("dflash")
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    assert all(layer.self_attn.attention_sink_bias is None for layer in draft.layers)
    draft.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (
        "attention_sink_bias" not in config and "attention_sink_bias" not in config["dflash_config"]
    )
