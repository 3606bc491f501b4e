"""Read a window's tensors from the feature store: the rows the collator pads and stacks."""

from __future__ import annotations

import torch

from .protocol import read_sample
from .refs import SampleRef
from .store import FeatureStore, StoreKeyMissing


class SampleMissing(RuntimeError):
    """A published sample's objects are not in the store."""


def fetch_sample(store: FeatureStore, ref: SampleRef) -> dict[str, torch.Tensor]:
    """One sample row (internals.md): its tensors and a scalar `sample_id`."""
    try:
        return read_sample(store, ref.to_reply())
    except StoreKeyMissing as exc:
        raise SampleMissing(
            f"sample {ref.sample_id} (attempt {ref.attempt}) of run {ref.run} is not in the "
            f"feature store: {exc}. Its window was acknowledged by every rank already (a rank "
            f"acked too early, or a restarted trainer did not call resume), or the store lost it"
        ) from None


def fetch_micro_batches(
    store: FeatureStore, refs: list[list[SampleRef]]
) -> list[list[dict[str, torch.Tensor]]]:
    """Every micro-step's sample rows, in the order the producer published them."""
    return [[fetch_sample(store, ref) for ref in micro] for micro in refs]
