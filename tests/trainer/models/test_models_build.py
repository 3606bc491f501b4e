"""build_draft: shapes from the target, save/load as SGLang reads it, errors, inference, compile."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, Qwen3Config

from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
    sample_anchors,
)
from specdraft.trainer.models.dflash import DFlashDraftModel
from specdraft.trainer.models.dflash2 import DFlash2DraftModel
from specdraft.trainer.models.dspark import Qwen3DSparkModel
from specdraft.trainer.models.layers import rotary_tables
from specdraft.trainer.models.masks import dense_block_mask


def _build(draft_model_config, algorithm, **overrides):
    torch.manual_seed(0)
    cfg = draft_model_config(algorithm, **overrides)
    return build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_draft_shapes_come_from_the_target(algorithm, draft_model_config, tiny_qwen3_target):
    draft = _build(draft_model_config, algorithm)
    target = tiny_qwen3_target.model.config
    config = draft.config
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert getattr(config, key) == getattr(target, key)
    assert config.rms_norm_eps == target.rms_norm_eps
    assert config.rope_parameters["rope_theta"] == target.rope_parameters["rope_theta"]
    assert config.intermediate_size == target.intermediate_size
    assert config.num_target_layers == target.num_hidden_layers
    assert len(draft.layers) == 2
    assert draft.fc.in_features == 2 * target.hidden_size
    wider = _build(draft_model_config, algorithm, draft_intermediate_size=40)
    assert wider.layers[0].mlp.gate_proj.out_features == 40


@pytest.mark.parametrize(
    ("algorithm", "model_class", "architecture"),
    [
        ("dflash", DFlashDraftModel, "DFlashDraftModel"),
        ("dflash2", DFlash2DraftModel, "DFlash2DraftModel"),
        ("dspark", Qwen3DSparkModel, "Qwen3DSparkModel"),
    ],
)
def test_save_and_load_keep_weights_and_the_serving_config(
    algorithm,
    model_class,
    architecture,
    draft_model_config,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    draft = _build(draft_model_config, algorithm)
    draft.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [architecture]
    assert written["model_type"] == "qwen3"
    nested = written["dflash_config"]
    assert nested["block_size"] == 4 and nested["target_layer_ids"] == [0, 2]
    assert nested["mask_token_id"] == 95
    if algorithm == "dflash2":
        assert {k: nested[k] for k in ("conv_kernel_size", "conv_group_size")} == {
            "conv_kernel_size": 2,
            "conv_group_size": 8,
        }
        assert (nested["selector_rank"], nested["selector_top_k"]) == (8, 4)
    elif algorithm == "dflash":
        # No conv or selector keys: SGLang and vLLM then build the plain backbone.
        assert set(nested) == {"block_size", "target_layer_ids", "mask_token_id"}
        assert not {"markov_rank", "conv_kernel_size", "selector_rank"} & set(written)
    else:
        assert (written["markov_rank"], written["markov_head_type"]) == (8, "vanilla")
        assert written["enable_confidence_head"] is True
        assert written["confidence_head_with_markov"] is False
    # A serving stack reads it with a plain AutoConfig (model_type qwen3, no remote code).
    plain = AutoConfig.from_pretrained(tmp_path)
    assert plain.block_size == 4 and plain.architectures == [architecture]

    loaded = model_class.from_pretrained(tmp_path)
    assert type(loaded) is type(draft)
    for (name, a), (_, b) in zip(
        draft.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    head = load_target_head(draft_model_config(algorithm).target, torch.float32)
    batch = make_draft_batch(random_samples([15], seed=2), 16)
    spec = DraftTrainSpec(num_anchors=3, loss_decay_gamma=4.0)
    with torch.no_grad():
        assert torch.equal(draft(batch, head, spec).numerator, loaded(batch, head, spec).numerator)


def test_state_dict_uses_the_checkpoint_names_sglang_loads(draft_model_config):
    names = set(_build(draft_model_config, "dflash2").state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    assert {
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.1.attention_conv.base_kernel",
        "layers.1.mlp_conv.kernel_projection.weight",
        "candidate_selector.hidden_projection.weight",
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
    } <= names
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    dspark = set(_build(draft_model_config, "dspark", dspark={"markov_type": "gated"}).state_dict())
    assert {
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "markov_head.gate_proj.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    } <= dspark
    # Plain DFlash holds the backbone alone: exactly the tensors DFlash2 shares with it.
    dflash = set(_build(draft_model_config, "dflash").state_dict())
    assert dflash == {n for n in names if "_conv." not in n and "candidate_selector" not in n}


def test_bad_shapes_fail_with_the_field_and_the_fix(draft_model_config):
    with pytest.raises(ValueError, match=r"conv_group_size = 12 does not divide .* 32"):
        _build(draft_model_config, "dflash2", dflash2={"conv_group_size": 12})
    with pytest.raises(ValueError, match=r"mask_token_id = 500 is outside"):
        _build(draft_model_config, "dspark", mask_token_id=500)


def test_a_batch_with_wrong_features_or_keys_is_refused(
    draft_model_config, make_draft_batch, random_samples
):
    draft = _build(draft_model_config, "dspark")
    head = load_target_head(draft_model_config("dspark").target, torch.float32)
    batch = make_draft_batch(random_samples([12], seed=0), 12)
    spec = DraftTrainSpec(num_anchors=2, loss_decay_gamma=4.0)
    with pytest.raises(KeyError, match="target_last_hidden_states"):
        draft({k: v for k, v in batch.items() if k != "target_last_hidden_states"}, head, spec)
    narrow = {**batch, "hidden_states": batch["hidden_states"][..., :32]}
    with pytest.raises(ValueError, match="2 target layers x 32"):
        draft(narrow, head, spec)


def test_parameter_counts_for_qwen3_8b_shapes_match_the_architecture(draft_model_config):
    # Qwen3-8B: hidden 4096, 36 layers, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936.
    target = Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
    )
    hidden, mlp, vocab, hd, layers = 4096, 12288, 151936, 128, 5
    base = {
        "num_draft_layers": layers,
        "target_layer_ids": [1, 9, 17, 25, 33],
        "mask_token_id": 151669,
        "block_size": 16,
    }
    per_layer = hidden * 32 * hd + 2 * hidden * 8 * hd + 32 * hd * hidden
    per_layer += 2 * hidden + 2 * hd + 3 * hidden * mlp
    backbone = layers * per_layer + 5 * hidden * hidden + 2 * hidden
    conv = 2 * (2 * 2 * hidden + 2 * 2 * (hidden // 16) * hidden)
    selector = hidden * 256 + 2 * vocab * 256
    cfg = draft_model_config(
        "dflash2",
        dflash2={"conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16},
        **base,
    )
    dflash2 = build_draft(cfg, target, device="meta")
    assert sum(p.numel() for p in dflash2.parameters()) == backbone + layers * conv + selector
    cfg = draft_model_config("dspark", dspark={"markov_rank": 256}, **base)
    dspark = build_draft(cfg, target, device="meta")
    assert sum(p.numel() for p in dspark.parameters()) == backbone + 2 * vocab * 256 + hidden + 1
    dflash = build_draft(draft_model_config("dflash", **base), target, device="meta")
    assert sum(p.numel() for p in dflash.parameters()) == backbone


def _predictions(draft_model_config, make_draft_batch, random_samples, algorithm):
    """(predicted tokens, anchors, keep, draft hidden states, input ids, head, draft) of 2 rows."""
    draft = _build(draft_model_config, algorithm)
    head = load_target_head(draft_model_config(algorithm).target, torch.float32)
    batch = make_draft_batch(random_samples([20, 9], seed=5), 20)
    anchors, keep = sample_anchors(batch["loss_mask"], batch["sample_id"], 5, seed=0)
    tokens = draft.predict_blocks(batch["input_ids"], batch["hidden_states"], anchors, keep, head)
    assert tokens.shape == (2, 5, 3)
    assert tokens[~keep].eq(-1).all() and tokens[keep].ge(0).all()
    with torch.no_grad():
        hidden = draft.run_backbone(
            batch["input_ids"], batch["hidden_states"], anchors, keep, head, "sdpa"
        )
    return tokens, anchors, keep, hidden, batch["input_ids"], head, draft


def test_predict_blocks_dspark_feeds_back_its_own_choices(
    draft_model_config, make_draft_batch, random_samples
):
    tokens, anchors, keep, hidden, input_ids, head, draft = _predictions(
        draft_model_config, make_draft_batch, random_samples, "dspark"
    )
    markov = draft.markov_head
    previous = torch.gather(input_ids, 1, anchors)
    with torch.no_grad():
        for slot in range(3):
            logits = head.logits(hidden[:, :, slot]) + markov.markov_w2(markov.markov_w1(previous))
            previous = logits.argmax(-1)
            assert torch.equal(tokens[keep][:, slot], previous[keep])


def test_predict_blocks_dflash_takes_each_slots_argmax(
    draft_model_config, make_draft_batch, random_samples
):
    tokens, _, keep, hidden, _, head, _ = _predictions(
        draft_model_config, make_draft_batch, random_samples, "dflash"
    )
    # Slot k (k = 1..bs-1) proposes the token at anchor + k; slot 0 holds the anchor.
    with torch.no_grad():
        want = head.logits(hidden[:, :, 1:]).argmax(-1)
    assert torch.equal(tokens[keep], want[keep])


def test_predict_blocks_dflash2_walks_the_selector_path(
    draft_model_config, make_draft_batch, random_samples
):
    draft = _build(draft_model_config, "dflash2")
    head = load_target_head(draft_model_config("dflash2").target, torch.float32)
    batch = make_draft_batch(random_samples([20], seed=6), 20)
    anchors, keep = sample_anchors(batch["loss_mask"], batch["sample_id"], 3, seed=0)
    tokens = draft.predict_blocks(batch["input_ids"], batch["hidden_states"], anchors, keep, head)
    selector = draft.candidate_selector
    with torch.no_grad():
        hidden = draft.run_backbone(
            batch["input_ids"], batch["hidden_states"], anchors, keep, head, "sdpa"
        )
        for n in range(3):
            previous = int(batch["input_ids"][0, anchors[0, n]])
            for k in range(1, 4):
                h = hidden[0, n, k]
                unary, cands = torch.topk(head.logits(h), 4)
                context = selector.predecessor_codebook[previous] * selector.hidden_projection(h)
                scores = unary + selector.successor_codebook[cands] @ context
                previous = int(cands[scores.argmax()])
                assert int(tokens[0, n, k - 1]) == previous


@pytest.mark.compile
@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_layers_trace_to_one_full_graph_per_grad_mode(algorithm, draft_model_config):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    draft = _build(draft_model_config, algorithm)
    layer = draft.layers[0]
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=False)
    anchors = torch.tensor([[0, 5, 9], [3, 0, 0]])
    keep = torch.tensor([[True, True, True], [True, False, False]])
    positions = (anchors[:, :, None] + torch.arange(4)).flatten(1)
    rotary = rotary_tables(positions, 16, 8, 1e6, torch.float32)
    mask = dense_block_mask(anchors, keep, 16, 4)
    context = torch.randn(2, 16, 32, requires_grad=True)
    first = torch.randn(2, 12, 32)  # the first block's input: no grad
    later = torch.randn(2, 12, 32, requires_grad=True)  # later blocks' inputs: grad
    for _ in range(2):
        compiled(first, context, rotary, mask).sum().backward()
        compiled(later, context, rotary, mask).sum().backward()
    assert counter.frame_count == 2


def test_attention_backend_auto_is_flex_on_cuda_and_sdpa_elsewhere():
    from specdraft.trainer.models import resolve_attention_backend

    assert resolve_attention_backend("auto", "cpu") == "sdpa"
    assert resolve_attention_backend("auto", "cuda") == "flex"
    assert resolve_attention_backend("flex", "cpu") == "flex"
    with pytest.raises(ValueError, match="'auto', 'sdpa', 'flex'"):
        resolve_attention_backend("xformers", "cpu")


def test_train_spec_comes_from_the_run_config(draft_model_config):
    from specdraft.config.schema import Config

    config = Config(
        model=draft_model_config("dflash2").model_dump(),
        data={"train_paths": ["x.jsonl"]},
        training={"num_anchors": 7, "logits_chunk_blocks": 3, "seed": 5, "loss_decay_gamma": 2.5},
    )
    spec = DraftTrainSpec.from_config(config, "cpu")
    assert spec == DraftTrainSpec(
        num_anchors=7, loss_decay_gamma=2.5, attention_backend="sdpa", logits_chunk_blocks=3, seed=5
    )
