"""The feature-store protocol and its errors (implementations: `local`, `mooncake`).

Capture servers write a sample's tensors as raw row-major bytes under deterministic keys
`{run}/{sample}/g{attempt}/{name}`; trainers read them back; the producer removes them once the
optimizer step that trained them is acknowledged. Shapes and dtypes never live in the store:
they travel in the capture reply, so a store holds plain bytes and nothing that unpickles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

# Who opens a store: capture servers write, trainers read, the producer removes; the embedded
# "store" service of a managed run only holds memory.
ROLES = ("capture", "trainer", "producer", "store", "tool")


class StoreError(RuntimeError):
    """A feature-store operation failed (the message says which key and why)."""


class StoreKeyMissing(StoreError, KeyError):
    """No object under that key: never written, already removed, or lost with its holder."""

    def __str__(self) -> str:
        # KeyError would print the repr of the message; keep it readable.
        return str(self.args[0]) if self.args else "missing key"


class StoreUnavailable(StoreError):
    """The store cannot be reached or set up (master down, package missing, bad settings)."""


@runtime_checkable
class FeatureStore(Protocol):
    """Raw-byte object store shared by capture servers, producer and trainers."""

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store `data` under `key` (replacing any object there); readers see all of it or none."""
        ...

    def get(self, key: str) -> bytes | bytearray:
        """The object under `key` (a bytearray where that saves a copy); StoreKeyMissing if none."""
        ...

    def remove(self, key: str, *, force: bool = True) -> None:
        """Drop the object under `key`; a missing key is not an error (removal is idempotent)."""
        ...

    def exists(self, key: str) -> bool:
        """Whether an object lies under `key`."""
        ...

    def bytes_resident(self) -> int:
        """Bytes the store holds now, over all writers (for the `store bytes resident` counter)."""
        ...

    def close(self) -> None:
        """Release connections and memory this process contributed."""
        ...


def local_store_root(run_dir: Path) -> Path:
    """Where the embedded store keeps its objects inside a run folder."""
    return Path(run_dir) / "feature-store"
