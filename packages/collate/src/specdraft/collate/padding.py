"""Zero padding of samples into a batch, to a static length or to the longest sample.

A sample is a dict of per-token tensors (`input_ids`, `loss_mask` `[S]`, `hidden_states`
`[S, L*H]`, `target_last_hidden_states` `[S, H]`) plus a scalar `sample_id` (see
docs/internals.md). `input_ids` fixes a sample's length; every per-token feature is padded with
zeros after it, so padding positions have `loss_mask = 0` and never carry a target feature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .lengths import PadTo, check_pad_to, resolve_static_length

# Per-token keys in the order they are collated; other keys are stacked as they are.
TOKEN_KEYS = ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states")
# Integer keys: ids and the 0/1 mask stay int64 whatever the caller handed in (e.g. Python lists).
INTEGER_KEYS = ("input_ids", "loss_mask")
STACKED_KEYS = ("sample_id",)


def _as_tensor(value: Any, key: str) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if key in INTEGER_KEYS or key in STACKED_KEYS:
        tensor = tensor.long()
    return tensor


def pad_and_concatenate_features(
    features: Sequence[Mapping[str, Any]], keys: Sequence[str], pad_to: PadTo
) -> dict[str, torch.Tensor]:
    """Zero-pad each key's per-token tensors to the batch's pad length and stack them into [B, ...].

    The pad length is `resolve_static_length(longest input_ids, pad_to)`. A feature with more rows
    than its sample's `input_ids` is an error: it would be cut, or silently shift the tokens.
    """
    if not features:
        raise ValueError("cannot collate an empty list of samples")
    pad_to = check_pad_to(pad_to)
    for i, feature in enumerate(features):
        if "input_ids" not in feature:
            raise KeyError(f"sample {i} has no 'input_ids' (keys: {sorted(feature)})")
    lengths = [int(_as_tensor(f["input_ids"], "input_ids").shape[0]) for f in features]
    padded = resolve_static_length(max(lengths), pad_to)
    batch: dict[str, torch.Tensor] = {}
    for key in keys:
        rows = []
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
    """Collate samples into a zero-padded batch; `pad_to` is None, an int or a bucket tuple."""

    def __init__(self, pad_to: PadTo = None) -> None:
        self.pad_to = check_pad_to(pad_to)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Collate one micro-batch: per-token keys padded, `sample_id` stacked to [B]."""
        if not features:
            raise ValueError(
                "cannot collate an empty micro-batch; the trainer turns [] into a dummy batch"
            )
        # A key that only some samples carry is an error (raised below), never silently dropped.
        present = [k for k in TOKEN_KEYS if any(k in f for f in features)]
        batch = pad_and_concatenate_features(features, present, self.pad_to)
        for key in STACKED_KEYS:
            if any(key in f for f in features):
                batch[key] = _stack_scalars(features, key)
        return batch

    def __repr__(self) -> str:
        return f"DataCollatorWithPadding(pad_to={self.pad_to!r})"
