"""Zero padding of samples into a batch, to a static length or to the longest sample.

A sample is a dict of per-token tensors (`input_ids`, `loss_mask` `[S]`, `hidden_states`
`[S, L*H]`, `target_last_hidden_states` `[S, H]`) plus a scalar `sample_id` (see
docs/internals.md). `input_ids` fixes a sample's length; every per-token feature is padded with
zeros after it, so padding positions have `loss_mask = 0` and never carry a target feature.

With a shape policy that knows `num_anchors`, the collator also chooses the micro-batch's anchor
width (`ANCHOR_WIDTH`, a Python int) here on the host from the loss masks, so the device never
has to report how many anchors a batch holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from specdraft.config import PadTo, ShapePolicy

from .packed import collate_packed

# Per-token keys in the order they are collated; other keys are stacked as they are. The last
# three are labels from the target's own predictions (trainer models/target_labels.py).
TOKEN_KEYS = (
    "input_ids",
    "loss_mask",
    "hidden_states",
    "target_last_hidden_states",
    "target_labels",
    "target_soft_ids",
    "target_soft_logprobs",
)
# Integer keys: ids and the 0/1 mask stay int64 whatever the caller handed in (e.g. Python lists).
INTEGER_KEYS = ("input_ids", "loss_mask", "target_labels", "target_soft_ids")
STACKED_KEYS = ("sample_id",)
# The batch key holding the number of anchor blocks the draft computes (a Python int, not a
# tensor: moving it to a device must not turn a shape into a value the host has to wait for).
ANCHOR_WIDTH = "anchor_width"


def anchor_counts(loss_mask: torch.Tensor) -> list[int]:
    """Valid anchors per row of a host [B, S] loss mask (a and a+1 both supervised)."""
    if loss_mask.device.type != "cpu":
        raise ValueError(
            "anchor_counts reads the loss mask on the host; call it at collate time, before the "
            "batch moves to the device"
        )
    supervised = loss_mask.bool()
    return (supervised[:, :-1] & supervised[:, 1:]).sum(dim=1).tolist()


def valid_anchor_count(loss_mask: Sequence[int]) -> int:
    """Valid anchors of one sample's loss mask (a and a+1 both supervised), as anchor_counts."""
    supervised = torch.as_tensor(loss_mask, dtype=torch.bool)
    return int((supervised[:-1] & supervised[1:]).sum())


def batch_anchor_width(loss_mask: torch.Tensor, policy: ShapePolicy) -> int:
    """The anchor width of a collated micro-batch under `policy` (largest count, bucketed)."""
    return policy.anchor_width(max(anchor_counts(loss_mask), default=0))


def _as_tensor(value: Any, key: str) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if key in INTEGER_KEYS or key in STACKED_KEYS:
        tensor = tensor.long()
    return tensor


def pad_and_concatenate_features(
    features: Sequence[Mapping[str, Any]], keys: Sequence[str], pad_to: PadTo | ShapePolicy
) -> dict[str, torch.Tensor]:
    """Zero-pad each key's per-token tensors to the batch's pad length and stack them into [B, ...].

    The pad length is the policy's `pad_length(longest input_ids)`. A feature with more rows
    than its sample's `input_ids` is an error: it would be cut, or silently shift the tokens.
    """
    if not features:
        raise ValueError("cannot collate an empty list of samples")
    policy = ShapePolicy.of(pad_to)
    for i, feature in enumerate(features):
        if "input_ids" not in feature:
            raise KeyError(f"sample {i} has no 'input_ids' (keys: {sorted(feature)})")
    lengths = [int(_as_tensor(f["input_ids"], "input_ids").shape[0]) for f in features]
    padded = policy.pad_length(max(lengths))
    batch: dict[str, torch.Tensor] = {}
    for key in keys:
        rows: list[torch.Tensor] = []
        for i, (feature, length) in enumerate(zip(features, lengths, strict=True)):
            if key not in feature:
                raise KeyError(f"sample {i} has no {key!r}; every sample of a batch needs it")
            tensor = _as_tensor(feature[key], key)
            if tensor.dim() == 0:
                raise ValueError(
                    f"sample {i}: {key!r} is a scalar; per-token features are [S, ...]"
                )
            if tensor.shape[0] > length:
                raise ValueError(
                    f"sample {i}: {key!r} has {tensor.shape[0]} rows but input_ids has {length} "
                    f"tokens; features must not be longer than input_ids"
                )
            if rows and tensor.shape[1:] != rows[0].shape[1:]:
                raise ValueError(
                    f"sample {i}: {key!r} has shape {tuple(tensor.shape)}, but sample 0's is "
                    f"{tuple(rows[0].shape)}; all samples must share the feature width"
                )
            if rows and tensor.dtype != rows[0].dtype:
                raise ValueError(
                    f"sample {i}: {key!r} has dtype {tensor.dtype}, but sample 0's is "
                    f"{rows[0].dtype}"
                )
            rows.append(tensor)
        out = rows[0].new_zeros((len(rows), padded, *rows[0].shape[1:]))
        for row, tensor in enumerate(rows):
            out[row, : tensor.shape[0]] = tensor
        batch[key] = out
    return batch


def _stack_scalars(features: Sequence[Mapping[str, Any]], key: str) -> torch.Tensor:
    values = []
    for i, feature in enumerate(features):
        if key not in feature:
            raise KeyError(f"sample {i} has no {key!r}; every sample of a batch needs it")
        value = _as_tensor(feature[key], key)
        if value.numel() != 1:
            raise ValueError(
                f"sample {i}: {key!r} must be a scalar, got shape {tuple(value.shape)}"
            )
        values.append(value.reshape(()))
    return torch.stack(values)


class DataCollatorWithPadding:
    """Collate samples into a zero-padded batch, by the run's `ShapePolicy` (or a seed `pad_to`).

    `pad_to` is the run's ShapePolicy, or the seed's None / int / bucket tuple. A policy that
    knows num_anchors also sets the batch's `anchor_width` from its loss masks.
    """

    def __init__(self, pad_to: PadTo | ShapePolicy = None) -> None:
        self.policy = ShapePolicy.of(pad_to)
        self.pad_to = self.policy.pad_to

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate one micro-batch: per-token keys padded, `sample_id` stacked to [B]."""
        if not features:
            raise ValueError(
                "cannot collate an empty micro-batch; the trainer turns [] into a dummy batch"
            )
        # A key that only some samples carry is an error (raised below), never silently dropped.
        present = [k for k in TOKEN_KEYS if any(k in f for f in features)]
        if self.policy.packing:
            # Several documents per row (see packed.py); unpacked batches never take this path.
            return collate_packed(features, present, self.policy, _as_tensor)
        batch: dict[str, Any] = pad_and_concatenate_features(features, present, self.policy)
        for key in STACKED_KEYS:
            if any(key in f for f in features):
                batch[key] = _stack_scalars(features, key)
        if self.policy.num_anchors is not None and "loss_mask" in batch:
            batch[ANCHOR_WIDTH] = batch_anchor_width(batch["loss_mask"], self.policy)
        return batch

    def __repr__(self) -> str:
        return f"DataCollatorWithPadding(pad_to={self.pad_to!r})"
