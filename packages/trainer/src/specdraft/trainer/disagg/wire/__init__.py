"""The wire contract of the disaggregated runtime: what crosses HTTP between its processes.

Capture requests and replies with their JSON form and checks (`capture`), feature-store object
keys (`keys`), the sample references a window is made of (`refs`) and the window controller's
routes, status codes and address file (`windows`). JSON only, no torch: client and server of
each contract import it from here, so neither imports the other.
"""

from .capture import (
    CaptureClient,
    CaptureError,
    CaptureMismatch,
    CaptureRejected,
    CaptureReply,
    CaptureRequest,
    CaptureSpec,
    CaptureTimeout,
    CaptureUnavailable,
    ProtocolError,
    TensorMeta,
    capture_spec,
    check_reply,
    target_hidden_size,
)
from .keys import TENSOR_NAMES, parse_sample_key, sample_key
from .refs import SampleRef, WindowRefs

__all__ = [
    "TENSOR_NAMES",
    "CaptureClient",
    "CaptureError",
    "CaptureMismatch",
    "CaptureRejected",
    "CaptureReply",
    "CaptureRequest",
    "CaptureSpec",
    "CaptureTimeout",
    "CaptureUnavailable",
    "ProtocolError",
    "SampleRef",
    "TensorMeta",
    "WindowRefs",
    "capture_spec",
    "check_reply",
    "parse_sample_key",
    "sample_key",
    "target_hidden_size",
]
