"""Tensor I/O against a feature store: a sample's tensors as raw row-major bytes, and back.

The reply that describes the bytes (keys, shapes, dtype names) is the wire contract of
`wire.capture`; this module is the torch side of it, used by the capture servers (write) and the
trainer ranks (read).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import torch

from ..wire.capture import CaptureReply, CaptureRequest, CaptureSpec, ProtocolError, TensorMeta
from ..wire.keys import sample_key
from .base import FeatureStore, StoreError

# dtype names on the wire <-> torch dtypes; only what features and token rows use.
DTYPES: dict[str, torch.dtype] = {
    "int64": torch.int64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def tensors_to_store(
    store: FeatureStore,
    request: CaptureRequest,
    spec: CaptureSpec,
    tensors: Mapping[str, torch.Tensor],
    *,
    names: Sequence[str] | None = None,
) -> CaptureReply:
    """Write a sample's tensors as raw bytes, then return the reply that describes them.

    `names` limits the write to some of the spec's tensors (the SGLang plugin writes the
    features, the SGLang client the token rows); the reply then lists only those.

    The shapes are checked before anything is written; if a write fails, what was written is
    removed again so a failed attempt leaves nothing resident, and the error propagates (the
    caller must not reply).
    """
    seq_len = len(request.input_ids)
    metas = []
    for name in spec.tensor_names():
        if names is not None and name not in names:
            continue
        if name not in tensors:
            raise ProtocolError(f"sample {request.sample_id}: tensor {name!r} was not computed")
        tensor = tensors[name]
        if tuple(tensor.shape) != spec.shape_of(name, seq_len):
            raise ProtocolError(
                f"sample {request.sample_id}: {name} has shape {list(tensor.shape)}, "
                f"expected {list(spec.shape_of(name, seq_len))}"
            )
        if tensor.dtype not in DTYPE_NAMES:
            raise ProtocolError(f"sample {request.sample_id}: {name} has dtype {tensor.dtype}")
        key = sample_key(request.run, request.sample_id, request.attempt, name)
        metas.append(
            (TensorMeta(name, key, tuple(tensor.shape), DTYPE_NAMES[tensor.dtype]), tensor)
        )
    written: list[str] = []
    try:
        for meta, tensor in metas:
            store.put(meta.key, tensor_bytes(tensor))
            written.append(meta.key)
    except BaseException:
        # The original error matters more; a failed clean-up is the producer retry's to redo.
        for key in written:
            with contextlib.suppress(StoreError):
                store.remove(key, force=True)
        raise
    return CaptureReply(
        run=request.run,
        sample_id=request.sample_id,
        attempt=request.attempt,
        seq_len=seq_len,
        layer_ids=spec.layer_ids,
        hidden_size=spec.hidden_size,
        tensors=tuple(meta for meta, _ in metas),
    )


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's row-major bytes, without a copy when it is already contiguous on the CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    # numpy has no bfloat16: view the storage as bytes first.
    return memoryview(flat.view(torch.uint8).numpy())


def tensor_nbytes(meta: TensorMeta) -> int:
    """Bytes of the object a tensor's metadata describes."""
    if meta.dtype not in DTYPES:
        raise ProtocolError(f"{meta.key}: unknown dtype {meta.dtype!r}")
    return math.prod(meta.shape) * torch.empty((), dtype=DTYPES[meta.dtype]).element_size()


def tensor_from_bytes(data: bytes | bytearray | memoryview, meta: TensorMeta) -> torch.Tensor:
    """Rebuild one tensor from its bytes and its reply metadata (checks the byte count)."""
    dtype = DTYPES.get(meta.dtype)
    expected = tensor_nbytes(meta)
    if len(data) != expected:
        raise StoreError(
            f"{meta.key}: holds {len(data)} bytes, but shape {list(meta.shape)} of {meta.dtype} "
            f"needs {expected}: the object was overwritten or damaged"
        )
    if expected == 0:
        return torch.empty(meta.shape, dtype=dtype)
    # torch must not alias an immutable object: copy bytes, wrap a bytearray (or a writable
    # view of one, as a batched read returns) as it is.
    writable = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly)
    owned = data if writable else bytearray(data)
    raw = torch.frombuffer(owned, dtype=torch.uint8)
    return raw.view(dtype).reshape(meta.shape)


def read_sample(store: FeatureStore, reply: CaptureReply) -> dict[str, torch.Tensor]:
    """A sample row (internals.md) from the store: its tensors plus a scalar `sample_id`."""
    sample = {meta.name: tensor_from_bytes(store.get(meta.key), meta) for meta in reply.tensors}
    sample["sample_id"] = torch.tensor(reply.sample_id, dtype=torch.int64)
    return sample
