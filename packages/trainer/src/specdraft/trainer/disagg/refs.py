"""Sample references: what the producer publishes and the trainers receive, tensor-free.

A `SampleRef` carries the fields of the capture reply (store keys, shapes, dtypes), so a trainer
rank reads the tensors straight from the feature store; only JSON crosses the controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .protocol import CaptureReply, TensorMeta


@dataclass(frozen=True)
class SampleRef:
    """Where one captured sample lies in the feature store, and its shapes."""

    run: str
    sample_id: int
    attempt: int
    seq_len: int
    layer_ids: tuple[int, ...]
    hidden_size: int
    tensors: tuple[TensorMeta, ...]

    @classmethod
    def from_reply(cls, reply: CaptureReply) -> SampleRef:
        """The reference to a capture server's reply."""
        return cls(
            run=reply.run,
            sample_id=reply.sample_id,
            attempt=reply.attempt,
            seq_len=reply.seq_len,
            layer_ids=tuple(reply.layer_ids),
            hidden_size=reply.hidden_size,
            tensors=tuple(reply.tensors),
        )

    def to_reply(self) -> CaptureReply:
        """The capture reply this reference stands for (what `read_sample` takes)."""
        return CaptureReply(
            run=self.run,
            sample_id=self.sample_id,
            attempt=self.attempt,
            seq_len=self.seq_len,
            layer_ids=self.layer_ids,
            hidden_size=self.hidden_size,
            tensors=self.tensors,
        )

    def keys(self) -> list[str]:
        """Store keys of this sample's objects."""
        return [t.key for t in self.tensors]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (ledger, controller)."""
        return {
            "run": self.run,
            "sample_id": self.sample_id,
            "attempt": self.attempt,
            "seq_len": self.seq_len,
            "layer_ids": list(self.layer_ids),
            "hidden_size": self.hidden_size,
            "tensors": [
                {"name": t.name, "key": t.key, "shape": list(t.shape), "dtype": t.dtype}
                for t in self.tensors
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleRef:
        """Inverse of `to_dict`."""
        return cls(
            run=str(data["run"]),
            sample_id=int(data["sample_id"]),
            attempt=int(data["attempt"]),
            seq_len=int(data["seq_len"]),
            layer_ids=tuple(int(x) for x in data["layer_ids"]),
            hidden_size=int(data["hidden_size"]),
            tensors=tuple(
                TensorMeta(
                    name=str(t["name"]),
                    key=str(t["key"]),
                    shape=tuple(int(x) for x in t["shape"]),
                    dtype=str(t["dtype"]),
                )
                for t in data["tensors"]
            ),
        )


# What a trainer rank gets for one optimizer step: one list of references per micro-step.
WindowRefs = list[list[SampleRef]]


def window_to_json(window: WindowRefs) -> list[list[dict[str, Any]]]:
    """JSON-ready form of one rank's window."""
    return [[ref.to_dict() for ref in micro] for micro in window]


def window_from_json(data: list[list[dict[str, Any]]]) -> WindowRefs:
    """Inverse of `window_to_json`."""
    return [[SampleRef.from_dict(ref) for ref in micro] for micro in data]
