"""Every target layer's hidden state at sampled positions of a few conversations.

A probe row is a context position j of one sample. A draft anchored at a = j + 1 reads the
context's features at positions <= j (models/masks.py: context keys strictly before the anchor)
and the anchor token x_{j+1} (block slot 0); block slot k = 1..bs-1 predicts x_{j+1+k}
(models/offsets.py; DSpark's offset k = 0..bs-1 predicts x_{a+k+1}, the same tokens). So the
draft's first drafted token sits at offset +2 from the last features it sees, slot k at +(k+1).

Per row this keeps: each layer's state at j (HF `hidden_states[l + 1]` = output of decoder layer
l, specdraft's id convention, export/layer_ids.py; the last entry is HF's normed final state, as
HF replaces the last layer's output by it), the anchor token, the labels x_{j+d} at the probed
offsets d (-1 where not supervised), and the target's normed final state at j + d - 1 (the
state its head reads x_{j+d} from: the probes' regression target, as DSpark's
`target_last_hidden_states`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# Rows per target forward: small, so the [layers, batch, length, hidden] states stay modest.
FORWARD_BATCH = 4


@dataclass
class LayerStates:
    """The probe rows of one split: N rows, L layers, hidden size H, O offsets."""

    features: Tensor  # [L, N, H] float32; entry L-1 is the normed final state
    anchor_ids: Tensor  # [N] int64: x_{j+1}, the anchor (and the early-exit label)
    labels: Tensor  # [N, O] int64: x_{j+d}, -1 where not supervised
    teacher: Tensor  # [N, O, H] float32: the target's normed final state at j + d - 1
    samples: int  # conversations the rows come from

    @property
    def num_rows(self) -> int:
        """Probe rows (positions) held."""
        return int(self.anchor_ids.shape[0])


def probe_positions(
    loss_mask: Sequence[int], offsets: Sequence[int], per_sample: int, generator: torch.Generator
) -> list[int]:
    """Up to `per_sample` positions j of one sample, ascending, drawn by `generator`.

    j qualifies when x_{j+1} is a valid anchor (loss_mask at j+1 and j+2, models/anchors.py)
    and the target's state at j + max(offsets) - 1 exists (the furthest regression target).
    """
    mask = [bool(m) for m in loss_mask]
    length, reach = len(mask), max(offsets) - 1
    valid = [j for j in range(length - 2) if mask[j + 1] and mask[j + 2] and j + reach < length]
    if not valid:
        return []
    order = torch.randperm(len(valid), generator=generator)[:per_sample]
    return sorted(valid[int(i)] for i in order)


def load_target_model(path: str | Path, device: torch.device) -> Any:
    """The target causal LM, frozen, in the dtype training runs it in on `device`."""
    from transformers import AutoModelForCausalLM

    from ..models.target import target_dtype

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=target_dtype(device), local_files_only=True
    )
    return model.to(device).eval().requires_grad_(False)


def collect_layer_states(
    model: Any,
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    offsets: Sequence[int],
    *,
    per_sample: int,
    seed: int,
    on_sample: Callable[[int], None] | None = None,
) -> LayerStates:
    """Run the target over `rows` ((input_ids, loss_mask) pairs) and keep the probe rows.

    Positions are drawn per sample in row order from one generator seeded with `seed`, so the
    same rows and seed give the same rows here. `on_sample(n)` reports progress.
    """
    generator = torch.Generator().manual_seed(seed)
    picked = [probe_positions(mask, offsets, per_sample, generator) for _, mask in rows]
    decoder = getattr(model, "model", model)
    device = next(model.parameters()).device
    offset_index = torch.tensor(list(offsets), dtype=torch.long)
    # Batches of similar lengths pad least; rows are put back in their own order at the end.
    by_length = sorted(range(len(rows)), key=lambda i: (len(rows[i][0]), i))
    kept: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
    for start in range(0, len(rows), FORWARD_BATCH):
        batch = by_length[start : start + FORWARD_BATCH]
        lengths = [len(rows[i][0]) for i in batch]
        ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
        attention = torch.zeros_like(ids)
        for k, i in enumerate(batch):
            ids[k, : lengths[k]] = torch.as_tensor(list(rows[i][0]), dtype=torch.long)
            attention[k, : lengths[k]] = 1
        with torch.no_grad():
            # Right padding under causal attention: a sample's states equal its unpadded ones.
            out = decoder(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                output_hidden_states=True,
                use_cache=False,
            )
        # hidden_states[0] is the embedding output: layer l is entry l + 1.
        states = torch.stack([s.float().cpu() for s in out.hidden_states[1:]])
        final = states[-1]
        for k, i in enumerate(batch):
            positions = torch.tensor(picked[i], dtype=torch.long)
            if positions.numel() == 0:
                continue
            sample_ids = ids[k, : lengths[k]]
            mask = torch.as_tensor(list(rows[i][1]), dtype=torch.bool)
            target = positions[:, None] + offset_index[None, :]
            inside = target < lengths[k]
            clamped = target.clamp(max=lengths[k] - 1)
            supervised = inside & mask[clamped]
            kept[i] = (
                states[:, k, positions],
                sample_ids[positions + 1],
                torch.where(supervised, sample_ids[clamped], -1),
                final[k, positions[:, None] + offset_index[None, :] - 1],
            )
        del out, states, final
        if on_sample is not None:
            on_sample(len(batch))
    if not kept:
        raise ValueError(
            "no sample has a position a draft block could start after (two supervised tokens "
            "in a row, followed by enough tokens for the furthest offset)"
        )
    parts = [kept[i] for i in sorted(kept)]
    return LayerStates(
        features=torch.cat([p[0] for p in parts], dim=1),
        anchor_ids=torch.cat([p[1] for p in parts]),
        labels=torch.cat([p[2] for p in parts]),
        teacher=torch.cat([p[3] for p in parts]),
        samples=len(parts),
    )
