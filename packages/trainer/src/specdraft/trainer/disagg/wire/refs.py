"""Sample references: what the producer publishes and the trainers receive, tensor-free.

A published sample is exactly its capture reply (store keys, shapes, dtypes, no tensors), so a
trainer rank reads the tensors straight from the feature store; only JSON crosses the controller,
in the reply's own wire form.
"""

from __future__ import annotations

from typing import Any

from .capture import CaptureReply, reply_from_json, reply_to_json

# The reference to a captured sample is the capture reply itself.
SampleRef = CaptureReply

# What a trainer rank gets for one optimizer step: one list of references per micro-step.
WindowRefs = list[list[SampleRef]]


def window_to_json(window: WindowRefs) -> list[list[dict[str, Any]]]:
    """JSON-ready form of one rank's window."""
    return [[reply_to_json(ref) for ref in micro] for micro in window]


def window_from_json(data: list[list[dict[str, Any]]]) -> WindowRefs:
    """Inverse of `window_to_json`."""
    return [[reply_from_json(ref) for ref in micro] for micro in data]
