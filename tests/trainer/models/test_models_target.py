"""The frozen target: head read from safetensors alone (single, sharded, tied), features."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from specdraft.trainer.models import TargetFeatureExtractor, load_target_config, load_target_head


def _tiny(tied: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(3)
    config = Qwen3Config(
        vocab_size=80,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    return Qwen3ForCausalLM(config)


def test_head_is_read_from_a_single_safetensors_file(tiny_qwen3_target):
    head = load_target_head(tiny_qwen3_target.path, torch.float32)
    model = tiny_qwen3_target.model
    assert torch.equal(head.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(head.lm_head.weight, model.lm_head.weight)
    assert not any(p.requires_grad for p in head.parameters())
    assert (head.vocab_size, head.hidden_size) == (96, 32)


def test_head_is_read_from_a_sharded_checkpoint(tmp_path):
    model = _tiny(tied=False)
    model.save_pretrained(tmp_path, max_shard_size="5KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    head = load_target_head(tmp_path, torch.float32)
    assert torch.equal(head.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(head.lm_head.weight, model.lm_head.weight)


def test_tied_embeddings_share_one_matrix(tmp_path):
    model = _tiny(tied=True)
    model.save_pretrained(tmp_path)
    head = load_target_head(tmp_path, torch.bfloat16)
    assert head.lm_head.weight is head.embed_tokens.weight
    assert head.lm_head.weight.dtype == torch.bfloat16
    hidden = torch.randn(2, 16)
    expected = hidden @ model.model.embed_tokens.weight.T
    torch.testing.assert_close(head.logits(hidden).float(), expected, rtol=2e-2, atol=2e-2)


def test_missing_weights_name_the_folder_and_the_fix(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8}))
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors") as err:
        load_target_head(tmp_path)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_target_head(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="local HF model folder"):
        load_target_config(tmp_path / "nowhere")


def test_untied_checkpoint_without_lm_head_is_an_error(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match=r"lm_head\.weight"):
        load_target_head(tmp_path)


def test_feature_extractor_returns_layer_outputs_and_final_normed_state(tiny_qwen3_target):
    model = tiny_qwen3_target.model
    outputs = []
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out: outputs.append(out))
        for layer in model.model.layers
    ]
    extractor = TargetFeatureExtractor(model, [0, 2])
    ids = torch.randint(0, 90, (2, 7))
    try:
        features, last = extractor(ids, torch.ones_like(ids))
    finally:
        for hook in hooks:
            hook.remove()
    layer_out = [out[0] if isinstance(out, tuple) else out for out in outputs]
    torch.testing.assert_close(features, torch.cat([layer_out[0], layer_out[2]], dim=-1))
    torch.testing.assert_close(last, model.model.norm(layer_out[3]))
    assert features.shape == (2, 7, 64) and last.shape == (2, 7, 32)


def test_feature_extractor_loads_from_a_path_and_rejects_the_last_layer(tiny_qwen3_target):
    extractor = TargetFeatureExtractor(tiny_qwen3_target.path, [1], dtype=torch.float32)
    features, _ = extractor(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert features.shape == (1, 3, 32)
    with pytest.raises(ValueError, match=r"use ids in 0\.\.2"):
        TargetFeatureExtractor(tiny_qwen3_target.model, [3])
