"""The feature-store protocol, its object keys, and the one function that opens a store.

Capture servers write a sample's tensors as raw row-major bytes under deterministic keys
`{run}/{sample}/g{attempt}/{name}`; trainers read them back; the producer removes them once the
optimizer step that trained them is acknowledged. Shapes and dtypes never live in the store:
they travel in the capture reply, so a store holds plain bytes and nothing that unpickles.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from specdraft.config import DisaggregatedConfig

# The tensors one sample has in the store; DSpark adds the final hidden state.
TENSOR_NAMES = ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states")

# Same alphabet as `Config.run_id`, so every run id makes a valid key prefix.
_RUN_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_KEY_RE = re.compile(r"^(?P<run>[A-Za-z0-9._-]+)/(?P<sample>\d+)/g(?P<attempt>\d+)/(?P<name>\w+)$")

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


def sample_key(run: str, sample_id: int, attempt: int, name: str) -> str:
    """The store key `{run}/{sample}/g{attempt}/{name}` of one tensor of one capture attempt."""
    if not _RUN_RE.match(run):
        raise ValueError(
            f"run id {run!r} cannot key store objects: use letters, digits, '.', '_' and '-' "
            f"(config field run_id)"
        )
    if isinstance(sample_id, bool) or not isinstance(sample_id, int) or sample_id < 0:
        raise ValueError(f"sample_id must be a non-negative int, got {sample_id!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be a non-negative int, got {attempt!r}")
    if name not in TENSOR_NAMES:
        raise ValueError(f"tensor name {name!r} is not one of {', '.join(TENSOR_NAMES)}")
    return f"{run}/{sample_id}/g{attempt}/{name}"


def parse_sample_key(key: str) -> tuple[str, int, int, str]:
    """Inverse of `sample_key`: (run, sample_id, attempt, name); ValueError if malformed."""
    match = _KEY_RE.match(key)
    if match is None or match["name"] not in TENSOR_NAMES:
        raise ValueError(f"{key!r} is not a feature-store key of the form run/sample/gN/name")
    return match["run"], int(match["sample"]), int(match["attempt"]), match["name"]


def open_store(cfg: DisaggregatedConfig, run_dir: Path, *, role: str) -> FeatureStore:
    """The feature store `deployment.disaggregated.store` names, opened for `role`."""
    if role not in ROLES:
        raise ValueError(f"store role {role!r} is not one of {', '.join(ROLES)}")
    if cfg.store == "local":
        from .local_store import LocalFeatureStore

        return LocalFeatureStore(local_store_root(run_dir))
    if cfg.store == "mooncake":
        from .mooncake_store import MooncakeFeatureStore

        return MooncakeFeatureStore(cfg.mooncake, timeout_s=cfg.store_timeout_s, role=role)
    raise ValueError(
        f"deployment.disaggregated.store = {cfg.store!r} is not a known store; use 'local' or "
        f"'mooncake'"
    )


def local_store_root(run_dir: Path) -> Path:
    """Where the embedded store keeps its objects inside a run folder."""
    return Path(run_dir) / "feature-store"
