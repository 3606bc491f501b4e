"""A compiled draft layer sees packed rows as one graph: different packings never recompile."""

from __future__ import annotations

import pytest
import torch

from specdraft.trainer.models import build_draft, dense_block_mask, load_target_config
from specdraft.trainer.models.layers import rotary_tables


def _packed_inputs(doc_lengths: list[list[int]], anchors: torch.Tensor, length: int = 16):
    """Rotary tables and dense mask of packed rows with the given document lengths."""
    document_ids = torch.tensor(
        [
            [doc for doc, n in enumerate(row) for _ in range(n)] + [-1] * (length - sum(row))
            for row in doc_lengths
        ]
    )
    position_ids = torch.tensor(
        [[p for n in row for p in range(n)] + [0] * (length - sum(row)) for row in doc_lengths]
    )
    keep = torch.ones_like(anchors, dtype=torch.bool)
    positions = (position_ids.gather(1, anchors)[:, :, None] + torch.arange(4)).flatten(1)
    rotary = rotary_tables(positions, length, 8, 1e6, torch.float32, position_ids)
    return rotary, dense_block_mask(anchors, keep, length, 4, document_ids)


@pytest.mark.compile
def test_packed_layers_trace_to_one_full_graph_per_grad_mode(draft_model_config):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = draft_model_config("dflash2")
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    counter = CompileCounter()
    compiled = torch.compile(draft.layers[0], backend=counter, fullgraph=True, dynamic=False)
    context = torch.randn(2, 16, 32, requires_grad=True)
    first = torch.randn(2, 12, 32)  # the first block's input: no grad
    later = torch.randn(2, 12, 32, requires_grad=True)  # later blocks' inputs: grad
    packings = [
        ([[5, 6, 3], [16]], torch.tensor([[1, 6, 11], [0, 4, 9]])),
        ([[10, 6], [2, 2, 2, 9]], torch.tensor([[3, 8, 12], [0, 6, 10]])),
    ]
    for doc_lengths, anchors in packings:
        rotary, mask = _packed_inputs(doc_lengths, anchors)
        compiled(first, context, rotary, mask).sum().backward()
        compiled(later, context, rotary, mask).sum().backward()
    assert counter.frame_count == 2
