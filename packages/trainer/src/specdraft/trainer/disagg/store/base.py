"""The feature-store protocol, its errors, and `StoreKind`: what a store module declares
(implementations: `local`, `mooncake`; `factory` finds them by name).

Capture servers write a sample's tensors as raw row-major bytes under deterministic keys
`{run}/{sample}/g{attempt}/{name}`; trainers read them back; the producer removes them once the
optimizer step that trained them is acknowledged. Shapes and dtypes never live in the store:
they travel in the capture reply, so a store holds plain bytes and nothing that unpickles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from specdraft.config import Config, DisaggregatedConfig

    from ...runtime.service_process import ServiceSpec

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


def no_services(config: Config) -> Sequence[ServiceSpec]:
    """A store that needs no service of its own (the embedded store: files)."""
    return ()


@dataclass(frozen=True)
class StoreKind:
    """One feature store as the runtime sees it: `disagg/store/<name>.py`'s `KIND`."""

    # The `deployment.disaggregated.store` value, also the module's name.
    name: str
    # Open it for a role (capture, trainer, producer, ...) in a run folder; its settings are
    # the config's `[deployment.disaggregated.<name>]` table when it has one.
    open: Callable[[DisaggregatedConfig, Path, str], FeatureStore]
    # Services a managed run starts for it before anything else (its master, a daemon).
    managed_services: Callable[[Config], Sequence[ServiceSpec]] = no_services
