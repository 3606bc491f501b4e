"""SpecForge 0.2.0's side of the peer benchmark, run by build/specforge-venv's python:
`python specforge_worker.py FIXTURE FAMILY THREADS` (FAMILY: dflash or dspark).

SpecForge's own classes, imported as a library: its draft (`DFlashDraftModel` /
`DSparkDraftModel`, a Qwen3Config with `dflash_config`) loads the fixture's draft tensors (the
module names are the same), its training wrapper (`OnlineDFlashModel` / `OnlineDSparkModel`)
takes the target's frozen embedding and LM head. SpecForge draws anchors at random inside the
wrapper, so the wrapper's anchor sampler is replaced by one that returns the fixture's anchors;
everything after it is SpecForge's code. Dense SDPA masks (`attention_backend="sdpa"`): CPU
torch has no flex-attention backward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from protocol import serve
from safetensors.torch import load_file
from torch import nn

GAMMA = 7.0


def frozen_head(target: Path) -> tuple[nn.Embedding, nn.Linear]:
    """The target's embedding and LM head, frozen."""
    tensors = load_file(str(target / "model.safetensors"))
    embed = nn.Embedding.from_pretrained(tensors["model.embed_tokens.weight"], freeze=True)
    weight = tensors["lm_head.weight"]
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight = nn.Parameter(weight, requires_grad=False)
    return embed, head


def draft_config(folder: Path, family: str):
    """SpecForge's draft config: the specdraft draft's Qwen3 config and its `dflash_config`."""
    from transformers import Qwen3Config

    saved = json.loads((folder / family / "specdraft" / "config.json").read_text())
    dflash = dict(saved["dflash_config"])
    if family == "dspark":
        dflash.update(
            projector_type="dspark",
            markov_rank=saved["markov_rank"],
            markov_head_type=saved["markov_head_type"],
            enable_confidence_head=saved["enable_confidence_head"],
            confidence_head_with_markov=saved["confidence_head_with_markov"],
        )
    keys = (
        *("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"),
        *("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act"),
        *("rms_norm_eps", "rope_parameters", "attention_bias", "attention_dropout"),
        *("max_position_embeddings", "layer_types"),
    )
    config = Qwen3Config(**{key: saved[key] for key in keys if key in saved})
    config.dflash_config = dflash
    config.block_size = saved["block_size"]
    config.num_target_layers = saved["num_target_layers"]
    config._attn_implementation = "sdpa"
    return config


def main(fixture: str, family: str, threads: str) -> None:
    """Build SpecForge's training step on the fixture, then serve the benchmark's commands."""
    from specforge.algorithms.common.dflash_family_model import (
        OnlineDFlashModel,
        OnlineDSparkModel,
    )
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel

    folder = Path(fixture)
    config = draft_config(folder, family)
    draft_class = DSparkDraftModel if family == "dspark" else DFlashDraftModel
    draft = draft_class(config).to(torch.float32)
    state = load_file(str(folder / family / "specdraft" / "model.safetensors"))
    draft.load_state_dict(state, strict=True)
    embed, head = frozen_head(folder / "target")
    batch = load_file(str(folder / "batch.safetensors"))
    anchors = batch["anchors"]
    options = json.loads((folder / family / "model.json").read_text())
    common = dict(
        draft_model=draft,
        target_lm_head=head,
        target_embed_tokens=embed,
        mask_token_id=options["mask_token_id"],
        block_size=options["block_size"],
        attention_backend="sdpa",
        num_anchors=anchors.shape[1],
        loss_decay_gamma=GAMMA,
    )
    if family == "dspark":
        weights = options["dspark"]
        model = OnlineDSparkModel(
            **common,
            dspark_ce_loss_alpha=weights["ce_weight"],
            dspark_l1_loss_alpha=weights["l1_weight"],
            dspark_confidence_head_alpha=weights["confidence_weight"],
        )
    else:
        model = OnlineDFlashModel(**common)
    keep = torch.ones_like(anchors, dtype=torch.bool)
    model._sample_anchor_positions = lambda seq_len, loss_mask, device: (anchors, keep)
    inputs = [batch["input_ids"], batch["hidden_states"], batch["loss_mask"]]
    if family == "dspark":
        inputs.append(batch["target_last_hidden_states"])

    def forward() -> dict:
        loss, _, _ = model(*inputs)
        return {"loss": loss}

    serve(model, forward, int(threads), f"specforge {family}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
