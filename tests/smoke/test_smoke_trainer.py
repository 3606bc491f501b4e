"""specdraft-trainer as installed: every public module imports, and a tiny draft of each family,
built against a random tiny Qwen3 target (tests/support), takes one forward and backward on
random tensors."""

from __future__ import annotations

import pytest
import torch
from disagg_support import HIDDEN, VOCAB, build_random_target
from smoke_support import assert_every_public_module_imports

from specdraft.config.schema import ModelConfig
from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)

LAYER_IDS = [0, 2]


def test_every_public_module_imports():
    assert_every_public_module_imports("specdraft.trainer")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    """A random tiny Qwen3 target saved as safetensors (no pretraining)."""
    return str(build_random_target(tmp_path_factory.mktemp("smoke-target")))


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_one_forward_and_backward(target, algorithm):
    torch.manual_seed(0)
    model = ModelConfig(
        target=target,
        algorithm=algorithm,
        block_size=4,
        num_draft_layers=1,
        target_layer_ids=LAYER_IDS,
        mask_token_id=VOCAB - 1,
        dflash2={
            "selector_gold_policy": "exclude",
            "conv_group_size": 8,
            "selector_top_k": 4,
            "selector_rank": 8,
        },
        dspark={"markov_rank": 8},
    )
    draft = build_draft(model, load_target_config(target), dtype=torch.float32)
    head = load_target_head(target, torch.float32)
    batch, length = 2, 32
    out = draft(
        {
            "input_ids": torch.randint(0, VOCAB - 1, (batch, length)),
            "loss_mask": torch.ones(batch, length, dtype=torch.long),
            "hidden_states": torch.randn(batch, length, len(LAYER_IDS) * HIDDEN),
            "target_last_hidden_states": torch.randn(batch, length, HIDDEN),
            "sample_id": torch.tensor([3, 4]),
        },
        head,
        DraftTrainSpec(num_anchors=4, loss_decay_gamma=4.0),
    )
    loss = out.numerator / out.denominator
    loss.backward()
    assert torch.isfinite(loss)
    assert out.denominator > 0
    trainable = dict(draft.named_parameters())
    assert trainable
    no_grad = [name for name, p in trainable.items() if p.requires_grad and p.grad is None]
    assert no_grad == []
