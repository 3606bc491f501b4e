"""speculators 0.9.0's side of the peer benchmark, run by build/speculators-venv's python:
`python speculators_worker.py FIXTURE FAMILY THREADS` (FAMILY: dflash, dflash2 or dspark).

The family's `--format speculators` folder loads through `SpeculatorModel.from_pretrained` (the
class from `speculators_model_type`; embedding and LM head from the recorded verifier, the
fixture's target), in fp32 with SDPA and dense masks (its flex-attention default compiles a
block mask, and CPU torch has no flex-attention backward). Its training forward runs as
speculators' trainer calls it, with the keyword arguments of `get_trainer_kwargs` and the eager
loss implementations (the fused ones are Triton GPU kernels). speculators draws anchors at
random, so its `select_anchors` is replaced by one returning the fixture's anchors.

The losses are speculators' hard-label "ce" (labels: the argmax of the verifier's logits, the
data tokens of the fixture), with "tv" for DSpark, whose TV distance is half specdraft's L1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from protocol import serve
from safetensors.torch import load_file

GAMMA = 7.0


def loss_spec(family: str, options: dict) -> str:
    """speculators' `--loss-fn` matching specdraft's objective for the family."""
    if family == "dspark":
        weights = options["dspark"]
        return json.dumps({"ce": weights["ce_weight"], "tv": 2 * weights["l1_weight"]})
    return "ce"


def main(fixture: str, family: str, threads: str) -> None:
    """Build speculators' training step on the fixture, then serve the benchmark's commands."""
    import speculators.models.dflash.core as dflash_core
    from speculators import SpeculatorModel, SpeculatorModelConfig

    folder = Path(fixture)
    batch = load_file(str(folder / "batch.safetensors"))
    anchors = batch["anchors"][0]
    dflash_core.select_anchors = lambda loss_mask, num, block: (
        anchors.clone(),
        torch.ones_like(anchors, dtype=torch.bool),
    )
    export = str(folder / family / "speculators")
    config = SpeculatorModelConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = SpeculatorModel.from_pretrained(export, config=config).to(torch.float32).train()
    options = json.loads((folder / family / "model.json").read_text())
    kwargs, _ = type(model).get_trainer_kwargs(
        loss_fn=loss_spec(family, options),
        loss_implementation="eager",
        dflash_decay_gamma=GAMMA,
        max_anchors=anchors.numel(),
        confidence_head_alpha=options["dspark"]["confidence_weight"],
        selector_loss_alpha=options["dflash2"]["selector_loss_weight"],
    )
    inputs = dict(
        hidden_states=batch["hidden_states"],
        input_ids=batch["input_ids"],
        loss_mask=batch["loss_mask"],
        verifier_last_hidden_states=batch["target_last_hidden_states"],
        document_ids=torch.zeros_like(batch["input_ids"]),
    )

    def forward() -> dict:
        _, loss, _ = model(**inputs, **kwargs)
        return {"loss": loss}

    serve(model, forward, int(threads), f"speculators {family}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
