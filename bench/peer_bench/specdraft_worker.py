"""specdraft's side of the peer benchmark: `python specdraft_worker.py FIXTURE FAMILY THREADS`.

The draft is rebuilt from the family's `model.json` and loaded from its saved tensors; the batch
carries the fixture's anchors (`given_anchors`), so no anchor is sampled. The step backpropagates
numerator / denominator, the loss the trainer forms (one micro-batch, one rank).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from protocol import serve
from safetensors.torch import load_file


def main(fixture: str, family: str, threads: str) -> None:
    """Build the draft and its step, then serve the benchmark's commands."""
    from specdraft.config.schema import ModelConfig
    from specdraft.trainer.models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
    )
    from specdraft.trainer.models.backbone import GIVEN_ANCHORS, GIVEN_KEEP

    folder = Path(fixture)
    options = json.loads((folder / family / "model.json").read_text())
    target = folder / "target"
    draft = build_draft(ModelConfig(**options), load_target_config(target), dtype=torch.float32)
    draft.load_state_dict(load_file(str(folder / family / "specdraft" / "model.safetensors")))
    head = load_target_head(target, torch.float32)
    batch = load_file(str(folder / "batch.safetensors"))
    anchors = batch.pop("anchors")
    batch[GIVEN_ANCHORS] = anchors
    batch[GIVEN_KEEP] = torch.ones_like(anchors, dtype=torch.bool)
    spec = DraftTrainSpec(num_anchors=anchors.shape[1], loss_decay_gamma=7.0)

    def forward() -> dict:
        out = draft(batch, head, spec)
        return {
            "loss": out.numerator / out.denominator,
            "numerator": out.numerator.detach(),
            "denominator": out.denominator,
            "count": out.metrics["count"],
        }

    serve(draft, forward, int(threads), f"specdraft {family}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
