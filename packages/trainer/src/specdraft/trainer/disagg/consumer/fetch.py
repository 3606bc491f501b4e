"""Read a window's tensors from the feature store: the rows the collator pads and stacks.

A store that can read many objects in one transfer (`get_many`: Mooncake's batched read) gets
the whole window at once; any other reads object by object. On Mooncake each read is a round
trip to the process holding the object, so one batch instead of a dozen reads per window keeps
the store's share of the data wait small.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..store.base import FeatureStore, StoreKeyMissing
from ..store.tensors import read_sample, tensor_from_bytes, tensor_nbytes
from ..wire.refs import SampleRef


class SampleMissing(RuntimeError):
    """A published sample's objects are not in the store."""


def fetch_sample(store: FeatureStore, ref: SampleRef) -> dict[str, torch.Tensor]:
    """One sample row (internals.md): its tensors and a scalar `sample_id`."""
    try:
        return read_sample(store, ref)
    except StoreKeyMissing as exc:
        raise _missing(ref, exc) from None


def fetch_micro_batches(
    store: FeatureStore, refs: list[list[SampleRef]]
) -> list[list[dict[str, torch.Tensor]]]:
    """Every micro-step's sample rows, in the order the producer published them."""
    get_many = getattr(store, "get_many", None)
    if get_many is None:
        return [[fetch_sample(store, ref) for ref in micro] for micro in refs]
    samples = [ref for micro in refs for ref in micro]
    metas = [meta for ref in samples for meta in ref.tensors]
    try:
        data = get_many([m.key for m in metas], [tensor_nbytes(m) for m in metas])
    except StoreKeyMissing as exc:
        raise _missing(_owner(samples, str(exc)), exc) from None
    rows = iter(_rows(samples, data))
    return [[next(rows) for _ in micro] for micro in refs]


def _rows(samples: Sequence[SampleRef], data: Sequence[bytes | bytearray | memoryview]) -> list:
    out, at = [], 0
    for ref in samples:
        row = {}
        for meta in ref.tensors:
            row[meta.name] = tensor_from_bytes(data[at], meta)
            at += 1
        row["sample_id"] = torch.tensor(ref.sample_id, dtype=torch.int64)
        out.append(row)
    return out


def _owner(samples: Sequence[SampleRef], message: str) -> SampleRef:
    """The sample whose key the store's error names (the first one if none matches)."""
    return next((r for r in samples if any(t.key in message for t in r.tensors)), samples[0])


def _missing(ref: SampleRef, exc: Exception) -> SampleMissing:
    return SampleMissing(
        f"sample {ref.sample_id} (attempt {ref.attempt}) of run {ref.run} is not in the "
        f"feature store: {exc}. Its window was acknowledged by every rank already (a rank "
        f"acked too early, or a restarted trainer did not call resume), or the store lost it"
    )
