"""Run by the speculators venv's python: a `--format speculators` export through speculators'
own classes. `python speculators_forward.py EXPORT INPUTS.safetensors OUT.safetensors`.

The draft is loaded with `SpeculatorModel.from_pretrained` (the class comes from the config's
`speculators_model_type`; embeddings and LM head from the recorded verifier), in fp32, then run
through its `_backbone_forward` at the anchors of INPUTS (speculators draws anchors at random,
so its `select_anchors` is replaced by one returning them). Written out: the draft hidden
states and logits of every block slot, plus the family's heads on them: DFlash2's selector
scores of the top-k candidates, DSpark's Markov logit bias and confidence logits.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file, save_file


def main(export: str, inputs_file: str, out_file: str) -> None:
    import speculators.models.dflash.core as dflash_core
    from speculators import SpeculatorModel, SpeculatorModelConfig

    inputs = load_file(inputs_file)
    anchors = inputs["anchors"]
    dflash_core.select_anchors = lambda loss_mask, num, block: (
        anchors.clone(),
        torch.ones_like(anchors, dtype=torch.bool),
    )
    config = SpeculatorModelConfig.from_pretrained(export)
    # Dense masks on CPU (its default flex-attention path compiles a block mask).
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = SpeculatorModel.from_pretrained(export, config=config).to(torch.float32).eval()
    block = model.block_size
    with torch.no_grad():
        hidden, logits, _, _, indices = model._backbone_forward(
            inputs["hidden_states"],
            inputs["input_ids"],
            torch.ones_like(inputs["input_ids"]),
            inputs["last_hidden"],
            torch.zeros_like(inputs["input_ids"]),
            max_anchors=anchors.numel(),
        )
        num = anchors.numel()
        out = {
            "hidden": hidden.view(num, block, -1),
            "logits": logits.view(num, block, -1),
        }
        tokens = inputs["input_ids"][0, indices].view(num, block)
        kind = config.speculators_model_type
        if kind == "dflash2":
            previous = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)
            candidates, scores = model.candidate_selector.select(
                out["logits"], out["hidden"], previous
            )
            out.update(candidates=candidates, selector_scores=scores)
        if kind == "dspark":
            embedded = model.markov_head.prev_embeddings(tokens)
            out["markov_bias"] = model.markov_head.block_bias(
                prev_token_ids=tokens, hidden_states=out["hidden"], prev_emb=embedded
            )
            if model.confidence_head is not None:
                features = out["hidden"]
                if config.confidence_head_with_markov:
                    features = torch.cat([features, embedded], dim=-1)
                out["confidence"] = model.confidence_head(features).reshape(num, block)
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
    print(f"loaded {type(model).__name__} ({kind}) from {export}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
