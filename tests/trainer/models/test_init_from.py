"""model.init_from: a draft exported in any format starts a new draft that computes exactly what
the exported one did (fp32, max abs difference 0), full-vocabulary and draft-vocabulary alike;
a folder that does not fit the draft is refused, naming the tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.trainer.export.formats import FORMATS
from specdraft.trainer.export.options import ExportOptions
from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    family_for,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.models.init_from import (
    InitFromError,
    load_init_weights,
    read_init_weights,
)

SPEC = DraftTrainSpec(num_anchors=6, loss_decay_gamma=4.0, logits_chunk_blocks=4)
# Every (family, format) the exports write for a full-vocabulary draft.
CASES = [
    (f, fmt) for f in ("dflash", "dflash2", "dspark") for fmt in ("sglang", "vllm", "speculators")
]
# Draft-vocabulary drafts: the formats that carry one (sglang's loaders read none).
VOCAB_CASES = [("dflash", "vllm"), ("dflash", "speculators"), ("dspark", "vllm")]
DRAFT_IDS = tuple(range(1, 96, 3))  # 32 target ids


def _exported(draft_model_config, target, algorithm, fmt, folder, ids=None, **attention):
    """A draft with every trainable weight perturbed (zero-initialised heads included), written
    in `fmt` to `folder`; returns it with its config and head. `attention`: sliding_window,
    layer_types."""
    overrides = {} if ids is None else {"draft_vocab_size": len(ids)}
    cfg = draft_model_config(algorithm, **overrides, **attention)
    head = load_target_head(cfg.target, torch.float32)
    torch.manual_seed(0)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, draft_vocab=ids)
    draft.init_draft_head(head)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    options = ExportOptions(checkpoint="the test draft", verifier=target.path)
    FORMATS[fmt].write(draft, folder, options)
    return draft, head


def _started(draft_model_config, algorithm, folder, ids_size=None, **attention):
    """A fresh draft (another seed) started from `folder` as build_trainer starts it."""
    overrides = {"init_from": str(folder), **attention}
    if ids_size is not None:
        overrides["draft_vocab_size"] = ids_size
    cfg = draft_model_config(algorithm, **overrides)
    weights = read_init_weights(cfg)
    torch.manual_seed(7)
    draft = build_draft(
        cfg,
        load_target_config(cfg.target),
        dtype=torch.float32,
        draft_vocab=weights.draft_vocab_ids,
    )
    draft.init_draft_head(load_target_head(cfg.target, torch.float32))
    load_init_weights(draft, weights)
    return draft, weights


def _assert_same_forward(a, b, head, batch):
    anchors = torch.tensor([[2, 5, 9, 14, 20, 25]] * batch["input_ids"].shape[0])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    with torch.no_grad():
        loss_a = a.forward_with_anchors(batch, anchors, keep, head, SPEC)
        loss_b = b.forward_with_anchors(batch, anchors, keep, head, SPEC)
        blocks_a = a.predict_blocks(batch["input_ids"], batch["hidden_states"], anchors, keep, head)
        blocks_b = b.predict_blocks(batch["input_ids"], batch["hidden_states"], anchors, keep, head)
    assert torch.equal(loss_a.numerator, loss_b.numerator)
    assert loss_a.metrics.keys() == loss_b.metrics.keys()
    for name, value in loss_a.metrics.items():
        assert torch.equal(value, loss_b.metrics[name]), name
    assert torch.equal(blocks_a, blocks_b)
    for name, value in a.state_dict().items():
        assert (value - b.state_dict()[name]).abs().max().item() == 0, name


@pytest.mark.parametrize(("algorithm", "fmt"), CASES)
def test_every_export_starts_a_draft_with_the_same_forward(
    algorithm,
    fmt,
    draft_model_config,
    tiny_qwen3_target,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    source, head = _exported(draft_model_config, tiny_qwen3_target, algorithm, fmt, tmp_path)
    started, weights = _started(draft_model_config, algorithm, tmp_path)
    assert weights.folder.format == fmt and weights.folder.algorithm == algorithm
    assert weights.draft_vocab_ids is None
    batch = make_draft_batch(random_samples([30, 24], seed=3), 32)
    _assert_same_forward(source, started, head, batch)


@pytest.mark.parametrize(("algorithm", "fmt"), VOCAB_CASES)
def test_a_draft_vocabulary_comes_back_with_its_tokens(
    algorithm,
    fmt,
    draft_model_config,
    tiny_qwen3_target,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    source, head = _exported(
        draft_model_config, tiny_qwen3_target, algorithm, fmt, tmp_path, ids=DRAFT_IDS
    )
    started, weights = _started(draft_model_config, algorithm, tmp_path, len(DRAFT_IDS))
    assert weights.draft_vocab_ids == list(DRAFT_IDS)
    batch = make_draft_batch(random_samples([30, 24], seed=4), 32)
    _assert_same_forward(source, started, head, batch)


def test_the_sha256_follows_the_weights_and_a_stray_tensor_is_refused(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    _exported(draft_model_config, tiny_qwen3_target, "dflash", "sglang", tmp_path)
    first = read_init_weights(draft_model_config("dflash", init_from=str(tmp_path)))
    weights_file = tmp_path / "model.safetensors"
    tensors = load_file(str(weights_file))
    tensors["fc.weight"] = tensors["fc.weight"] + 1
    tensors["extra_head.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    changed = read_init_weights(draft_model_config("dflash", init_from=str(tmp_path)))
    assert first.sha256.startswith("sha256:") and changed.sha256 != first.sha256
    draft = build_draft(
        draft_model_config("dflash"),
        load_target_config(tiny_qwen3_target.path),
        dtype=torch.float32,
    )
    with pytest.raises(InitFromError, match=r"not a draft parameter \['extra_head.weight'\]"):
        load_init_weights(draft, changed)


def test_a_disagreeing_field_is_refused_before_any_weight_is_read(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    _exported(draft_model_config, tiny_qwen3_target, "dspark", "vllm", tmp_path)
    cfg = draft_model_config("dspark", init_from=str(tmp_path), block_size=8)
    with pytest.raises(InitFromError) as caught:
        read_init_weights(cfg)
    assert "model.block_size: model.block_size = 8 but the dspark draft" in str(caught.value)
    assert "(vllm format) has 4: set block_size = 4" in str(caught.value)


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_the_config_package_names_each_family_as_the_exports_do(algorithm):
    family = family_for(algorithm)
    assert family.rules.architecture == family.architecture
    assert family.speculators is not None
    assert family.rules.speculators_type == family.speculators.model_type


# A window that cuts keys of the test batches (32 positions), on one layer of two and on both.
SLIDING = [
    {"sliding_window": 8},
    {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]},
]


@pytest.mark.parametrize("attention", SLIDING, ids=["all-layers", "mixed"])
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
@pytest.mark.parametrize("algorithm", ["dflash", "dspark"])
def test_a_sliding_window_draft_comes_back_with_the_same_forward(
    algorithm,
    fmt,
    attention,
    draft_model_config,
    tiny_qwen3_target,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    source, head = _exported(
        draft_model_config, tiny_qwen3_target, algorithm, fmt, tmp_path, **attention
    )
    started, weights = _started(draft_model_config, algorithm, tmp_path, **attention)
    assert weights.folder.sliding_window == 8
    assert started.config.layer_windows() == source.config.layer_windows()
    batch = make_draft_batch(random_samples([30, 24], seed=3), 32)
    _assert_same_forward(source, started, head, batch)
    # The window matters on this batch: the same weights at full attention compute otherwise.
    full, _ = _started_full(draft_model_config, algorithm, started)
    _assert_computes_otherwise(started, full, head, batch)


def _assert_computes_otherwise(draft, other, head, batch):
    """Two drafts with the same weights and another attention differ on late blocks."""
    anchors = torch.tensor([[20, 25]] * 2)
    keep = torch.ones_like(anchors, dtype=torch.bool)
    ids, features = batch["input_ids"], batch["hidden_states"]
    with torch.no_grad():
        ours = draft.run_backbone(ids, features, anchors, keep, head, "sdpa")
        theirs = other.run_backbone(ids, features, anchors, keep, head, "sdpa")
    assert not torch.equal(ours, theirs)


CAUSAL = [
    (
        "vllm",
        {
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "causal_layers": "sliding",
        },
    ),
    ("speculators", {"sliding_window": 8, "causal_layers": "all"}),
    ("sglang", {"causal_layers": "all"}),
]


@pytest.mark.parametrize(("fmt", "attention"), CAUSAL, ids=["vllm-mixed", "speculators", "sglang"])
def test_a_causal_draft_comes_back_with_the_same_forward(
    fmt,
    attention,
    draft_model_config,
    tiny_qwen3_target,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    source, head = _exported(
        draft_model_config, tiny_qwen3_target, "dflash", fmt, tmp_path, **attention
    )
    started, weights = _started(draft_model_config, "dflash", tmp_path, **attention)
    assert weights.folder.causal == source.config.layer_causal() != (False, False)
    assert started.config.layer_causal() == source.config.layer_causal()
    batch = make_draft_batch(random_samples([30, 24], seed=3), 32)
    _assert_same_forward(source, started, head, batch)
    # The causality matters: the same weights with bidirectional blocks compute otherwise.
    cfg = draft_model_config("dflash", **{**attention, "causal_layers": "none"})
    both_ways = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    both_ways.load_state_dict(started.state_dict())
    _assert_computes_otherwise(started, both_ways, head, batch)


def _started_full(draft_model_config, algorithm, draft):
    """The same weights in a full-attention draft."""
    cfg = draft_model_config(algorithm)
    full = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    full.load_state_dict(draft.state_dict())
    return full, cfg


def test_a_sliding_folder_needs_the_same_window_in_the_config(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    _exported(draft_model_config, tiny_qwen3_target, "dflash", "vllm", tmp_path, sliding_window=8)
    with pytest.raises(InitFromError) as caught:
        read_init_weights(draft_model_config("dflash", init_from=str(tmp_path)))
    assert "set sliding_window = 8" in str(caught.value)
    with pytest.raises(InitFromError, match="set sliding_window = 8"):
        read_init_weights(draft_model_config("dflash", init_from=str(tmp_path), sliding_window=16))


def test_sglang_refuses_a_sliding_window_draft(draft_model_config, tiny_qwen3_target, tmp_path):
    from specdraft.trainer.export.source import ExportRefused

    with pytest.raises(ExportRefused, match="masks a sliding-window layer causally"):
        _exported(
            draft_model_config, tiny_qwen3_target, "dflash", "sglang", tmp_path, sliding_window=8
        )


@pytest.mark.parametrize(
    ("algorithm", "fmt"), [("dflash", "vllm"), ("dflash2", "sglang"), ("dspark", "vllm")]
)
def test_a_draft_with_attention_sinks_comes_back_with_the_same_forward(
    algorithm,
    fmt,
    draft_model_config,
    tiny_qwen3_target,
    make_draft_batch,
    random_samples,
    tmp_path,
):
    # (SGLang serves no window: its draft has full attention.)
    window = {} if fmt == "sglang" else {"sliding_window": 8}
    sink = {"attention_sink_bias": True, **window}
    source, head = _exported(
        draft_model_config, tiny_qwen3_target, algorithm, fmt, tmp_path, **sink
    )
    started, weights = _started(draft_model_config, algorithm, tmp_path, **sink)
    assert weights.folder.attention_sink_bias
    for ours, theirs in zip(source.layers, started.layers, strict=True):
        assert torch.equal(ours.self_attn.attention_sink_bias, theirs.self_attn.attention_sink_bias)
    _assert_same_forward(
        source, started, head, make_draft_batch(random_samples([30, 24], seed=3), 32)
    )
    # The config must say so: a folder with sinks does not start a draft without them.
    with pytest.raises(InitFromError, match="set attention_sink_bias = true"):
        read_init_weights(draft_model_config(algorithm, init_from=str(tmp_path), **window))
