"""Feature stores: where capture servers put a sample's tensors and trainer ranks read them.

`base` is the protocol every store follows (raw bytes under `wire.keys` keys) and its errors;
`local` keeps objects as files under the run folder (one machine), `mooncake` in a Mooncake
cluster whose master `mooncake_master` can start; `factory.open_store` opens the one a config
names. `tensors` is the torch side: a sample's tensors as bytes, and back.
"""

from .base import (
    FeatureStore,
    StoreError,
    StoreKeyMissing,
    StoreUnavailable,
    local_store_root,
)
from .factory import open_store
from .local import LocalFeatureStore
from .tensors import read_sample, tensors_to_store

__all__ = [
    "FeatureStore",
    "LocalFeatureStore",
    "StoreError",
    "StoreKeyMissing",
    "StoreUnavailable",
    "local_store_root",
    "open_store",
    "read_sample",
    "tensors_to_store",
]
