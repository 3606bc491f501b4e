"""The disaggregated runtime: feature stores, capture servers and clients, producer, trainers.

Capture servers (the embedded transformers server, or SGLang through `SGLangCaptureClient`)
turn prompts into target features and write them into a feature store (`LocalFeatureStore`
under the run folder, or Mooncake); the producer leases prompts and publishes tensor-free
sample references; trainer ranks read the tensors with `read_sample`. SGLang and Mooncake are
optional extras, imported only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: a producer or trainer process should not pay for transformers (the
# capture server's target) just to read a window. name -> module.
_EXPORTS: dict[str, str] = {
    "CaptureClient": "protocol",
    "CaptureError": "protocol",
    "CaptureMismatch": "protocol",
    "CaptureRejected": "protocol",
    "CaptureReply": "protocol",
    "CaptureRequest": "protocol",
    "CaptureServer": "capture_server",
    "CaptureSpec": "protocol",
    "CaptureTarget": "capture_target",
    "CaptureTimeout": "protocol",
    "CaptureUnavailable": "protocol",
    "FeatureStore": "store",
    "HttpCaptureClient": "capture_client",
    "LocalFeatureStore": "local_store",
    "ManagedSGLang": "sglang_launcher",
    "MooncakeFeatureStore": "mooncake_store",
    "MooncakeMaster": "mooncake_master",
    "ProtocolError": "protocol",
    "SGLangCaptureClient": "sglang_client",
    "ServiceError": "service_process",
    "StoreError": "store",
    "StoreKeyMissing": "store",
    "StoreUnavailable": "store",
    "TensorMeta": "protocol",
    "build_capture_server": "capture_server",
    "capture_spec": "protocol",
    "check_reply": "protocol",
    "load_capture_target": "capture_target",
    "open_store": "store",
    "parse_sample_key": "store",
    "read_sample": "protocol",
    "sample_key": "store",
    "sglang_command": "sglang_launcher",
    "start_master": "mooncake_master",
    "target_hidden_size": "protocol",
    "tensors_to_store": "protocol",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first access."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
