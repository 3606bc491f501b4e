"""The disaggregated runtime: feature stores, capture servers and clients, producer, trainers.

Capture servers (the embedded transformers server, or SGLang through `SGLangCaptureClient`)
turn prompts into target features and write them into a feature store (`LocalFeatureStore`
under the run folder, or Mooncake); the producer leases prompts and publishes tensor-free
sample references; trainer ranks read the tensors with `read_sample`. SGLang and Mooncake are
optional extras, imported only when used.
"""

from .capture_client import HttpCaptureClient
from .capture_server import CaptureServer, build_capture_server
from .capture_target import CaptureTarget, load_capture_target
from .local_store import LocalFeatureStore
from .mooncake_master import MooncakeMaster, start_master
from .mooncake_store import MooncakeFeatureStore
from .protocol import (
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
    read_sample,
    target_hidden_size,
    tensors_to_store,
)
from .service_process import ServiceError
from .sglang_client import SGLangCaptureClient
from .sglang_launcher import ManagedSGLang, sglang_command
from .store import (
    FeatureStore,
    StoreError,
    StoreKeyMissing,
    StoreUnavailable,
    open_store,
    parse_sample_key,
    sample_key,
)

__all__ = [
    "CaptureClient",
    "CaptureError",
    "CaptureMismatch",
    "CaptureRejected",
    "CaptureReply",
    "CaptureRequest",
    "CaptureServer",
    "CaptureSpec",
    "CaptureTarget",
    "CaptureTimeout",
    "CaptureUnavailable",
    "FeatureStore",
    "HttpCaptureClient",
    "LocalFeatureStore",
    "ManagedSGLang",
    "MooncakeFeatureStore",
    "MooncakeMaster",
    "ProtocolError",
    "SGLangCaptureClient",
    "ServiceError",
    "StoreError",
    "StoreKeyMissing",
    "StoreUnavailable",
    "TensorMeta",
    "build_capture_server",
    "capture_spec",
    "check_reply",
    "load_capture_target",
    "open_store",
    "parse_sample_key",
    "read_sample",
    "sample_key",
    "sglang_command",
    "start_master",
    "target_hidden_size",
    "tensors_to_store",
]
