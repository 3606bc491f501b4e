"""A Llama target with tied embeddings, as SmolLM2 is: its head read from a checkpoint that holds
no lm_head, its features, a draft of each family trained against it, and every export format
carrying the target's RoPE theta and norm eps (not Qwen3's defaults)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig

from specdraft.config import ModelConfig
from specdraft.trainer.export import FORMATS, export_checkpoint
from specdraft.trainer.integrity import write_manifest
from specdraft.trainer.models import (
    DraftTrainSpec,
    TargetFeatureExtractor,
    build_draft,
    load_target_config,
    load_target_head,
)

ALGORITHMS = ["dflash", "dflash2", "dspark"]


def _model_config(target, algorithm: str) -> ModelConfig:
    return ModelConfig(
        target=target.path,
        algorithm=algorithm,
        block_size=4,
        num_draft_layers=1,
        target_layer_ids=list(target.layer_ids),
        mask_token_id=target.mask_token_id,
        dflash2={"selector_gold_policy": "exclude", "conv_group_size": 8, "selector_rank": 8},
        dspark={"markov_rank": 8},
    )


def _draft(target, algorithm: str):
    """A fresh fp32 draft of `algorithm` for the target (seeded)."""
    cfg = _model_config(target, algorithm)
    torch.manual_seed(0)
    return build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)


def _samples(target, lengths: list[int]) -> list:
    """Random samples [(input_ids, loss_mask, sample_id)], the first quarter unsupervised."""
    generator = torch.Generator().manual_seed(4)
    samples = []
    for index, length in enumerate(lengths):
        ids = torch.randint(3, target.vocab_size, (length,), generator=generator)
        mask = torch.ones(length, dtype=torch.long)
        mask[: length // 4] = 0
        samples.append((ids, mask, index))
    return samples


def test_the_tied_checkpoint_holds_no_lm_head_and_the_head_shares_the_embedding(
    tiny_llama_target,
):
    with safe_open(f"{tiny_llama_target.path}/model.safetensors", framework="pt") as handle:
        names = set(handle.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    head = load_target_head(tiny_llama_target.path, torch.float32)
    assert head.lm_head.weight is head.embed_tokens.weight
    assert (head.vocab_size, head.hidden_size) == (96, 32)
    # The frozen head on the target's own final (normed) state gives the target's logits.
    model = tiny_llama_target.model
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    _, last = TargetFeatureExtractor(model, list(tiny_llama_target.layer_ids))(
        ids, torch.ones_like(ids)
    )
    with torch.no_grad():
        expected = model(ids).logits
    torch.testing.assert_close(head.logits(last), expected)


def test_llama_features_are_the_decoder_layer_outputs(tiny_llama_target):
    model = tiny_llama_target.model
    ids = torch.tensor([[1, 7, 8, 9]])
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    assert len(states) == 6  # the embedding, 5 layers; the last entry is the normed final state
    features, last = TargetFeatureExtractor(tiny_llama_target.path, [1, 2], dtype=torch.float32)(
        ids, torch.ones_like(ids)
    )
    torch.testing.assert_close(features, torch.cat([states[2], states[3]], dim=-1))
    torch.testing.assert_close(last, states[-1])
    with pytest.raises(ValueError, match=r"use ids in 0\.\.3"):
        TargetFeatureExtractor(model, [4])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_draft_for_a_tied_llama_takes_its_shapes_rope_and_eps_and_learns(
    algorithm, tiny_llama_target, make_llama_batch
):
    draft = _draft(tiny_llama_target, algorithm)
    config = draft.config
    assert config.rope_parameters == {"rope_theta": 100000.0, "rope_type": "default"}
    assert config.rms_norm_eps == 1e-5
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    assert (config.vocab_size, config.num_target_layers) == (96, 5)
    head = load_target_head(tiny_llama_target.path, torch.float32)
    batch = make_llama_batch(_samples(tiny_llama_target, [16, 11]), 16)
    spec = DraftTrainSpec(num_anchors=3, loss_decay_gamma=4.0)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        out = draft(batch, head, spec)
        loss = out.mean()
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not head.embed_tokens.weight.requires_grad  # the tied matrix stays frozen


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_export_format_carries_the_llama_target_s_rope_and_eps(
    algorithm, tiny_llama_target, tmp_path
):
    checkpoint = tmp_path / "checkpoint"
    _draft(tiny_llama_target, algorithm).save_pretrained(checkpoint)
    write_manifest(checkpoint)
    # The HF-folder formats; the GGUF file (one file, llama.cpp's keys) is checked against
    # llama.cpp's own converter in tests/serve/test_serve_llama_gguf.py.
    for name in (n for n in FORMATS if n != "gguf"):
        out = tmp_path / name
        export_checkpoint(
            checkpoint, out, format=name, dtype="float32", verifier=tiny_llama_target.path
        )
        written = json.loads((out / "config.json").read_text())
        layer = written["transformer_layer_config"] if name == "speculators" else written
        assert layer["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}, name
        assert layer["rms_norm_eps"] == 1e-5, name
        assert (layer["vocab_size"], layer["max_position_embeddings"]) == (96, 1024), name
        if name == "speculators":
            verifier = written["speculators_config"]["verifier"]
            assert verifier["architectures"] == ["LlamaForCausalLM"]
            assert written["aux_hidden_state_layer_ids"] == [2, 3]
            assert written["mask_token_id"] == 0
        else:
            assert written["dflash_config"]["target_layer_ids"] == [1, 2]
            assert written["dflash_config"]["mask_token_id"] == 0
            # What an engine reads back with a plain AutoConfig: the same theta and eps.
            reread = AutoConfig.from_pretrained(out)
            assert reread.rope_parameters["rope_theta"] == 100000.0, name
            assert reread.rms_norm_eps == 1e-5, name
