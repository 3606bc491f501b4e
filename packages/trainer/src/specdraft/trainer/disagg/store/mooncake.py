"""The Mooncake feature store: `mooncake.store.MooncakeDistributedStore` over TCP (or RDMA).

Calls used (mooncake-transfer-engine 0.3.13, `help(MooncakeDistributedStore)`):
`setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
rdma_devices, master_server_addr)`, `upsert(key, buffer, ReplicateConfig)`, `upsert_from(key,
ptr, size, ReplicateConfig)`, `get(key)`, `get_size(key)`, `get_into(key, ptr, size)`,
`batch_get_into(keys, ptrs, sizes)`, `register_buffer` / `unregister_buffer`, `is_exist(key)`,
`remove(key, force)`, `health_check()`, `close()`; `ReplicateConfig.with_hard_pin` keeps objects
from eviction.

Semantics that shaped this file (measured on loopback):
- `put` on an existing key answers 0 but keeps the OLD bytes, so writes use `upsert`, which
  replaces them (the local store's rename does too).
- `put`/`get` copy through the client's local buffer and fail (-600) for an object larger than
  what is free in it; those go through `upsert_from` / `get_into` on a registered buffer.
- `setup` retries for ~90 s when the master is down, so the master's port is probed first and
  an unreachable master fails within `store_timeout_s` with the address to fix.
- The master's metrics server reports `master_allocated_bytes`: the bytes-resident counter.
"""

from __future__ import annotations

import itertools
import os
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import StoreError, StoreKeyMissing, StoreKind, StoreUnavailable
from .mooncake_master import master_services, port_open, split_address

if TYPE_CHECKING:
    from pathlib import Path

    from specdraft.config import DisaggregatedConfig
    from specdraft.config.stores.mooncake import MooncakeConfig

OBJECT_NOT_FOUND = -704
LOCAL_BUFFER_FULL = -600
_CODES = {OBJECT_NOT_FOUND: "object not found", LOCAL_BUFFER_FULL: "no room in the local buffer"}

# Roles whose process contributes memory to the store. Trainer ranks (and tools) read only:
# a trainer that dies and resumes from its checkpoint must not take samples down with it.
MEMORY_ROLES = ("capture", "producer", "store")

_FIELD = "deployment.disaggregated.mooncake"


def _describe(code: int) -> str:
    return f"error {code}" + (f" ({_CODES[code]})" if code in _CODES else "")


def _address_of(data: bytes | bytearray | memoryview) -> tuple[np.ndarray, int]:
    """A uint8 view of `data` (kept alive by the caller) and its address."""
    array = np.frombuffer(data, dtype=np.uint8)
    return array, int(array.ctypes.data)


class MooncakeFeatureStore:
    """A `FeatureStore` on a Mooncake cluster; one client per process."""

    def __init__(self, cfg: MooncakeConfig, *, timeout_s: float, role: str) -> None:
        host, port = split_address(cfg.master_address, field=f"{_FIELD}.master_address")
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as exc:
            raise StoreUnavailable(
                f"deployment.disaggregated.store = 'mooncake' needs the mooncake package: "
                f"pip install 'specdraft-trainer[mooncake]' ({exc})"
            ) from exc
        self.cfg = cfg
        self.role = role
        self._master_host = host
        if not port_open(host, port, timeout=timeout_s):
            raise StoreUnavailable(
                f"mooncake_master is not reachable at {cfg.master_address} (field "
                f"{_FIELD}.master_address) within {timeout_s:g} s: start it, set "
                f"{_FIELD}.manage_master = true, or fix the address"
            )
        # The TCP transport binds its listening sockets to MC_TCP_BIND_ADDRESS; default it to
        # the address we advertise, so a loopback setup never listens on all interfaces.
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", cfg.local_hostname)
        self._local_buffer = cfg.local_buffer_size_mb << 20
        segment = cfg.global_segment_size_mb << 20 if role in MEMORY_ROLES else 0
        self._store = MooncakeDistributedStore()
        rc = self._store.setup(
            cfg.local_hostname,
            cfg.metadata_server,
            segment,
            self._local_buffer,
            cfg.protocol,
            cfg.device_name,
            cfg.master_address,
        )
        if rc != 0:
            raise StoreUnavailable(
                f"Mooncake client setup failed ({_describe(rc)}) against {cfg.master_address}: "
                f"check {_FIELD}.local_hostname ({cfg.local_hostname}), .protocol "
                f"({cfg.protocol}) and .metadata_server ({cfg.metadata_server})"
            )
        self._replicate = ReplicateConfig()
        self._replicate.replica_num = 1
        # Hard-pinned objects are never evicted: a sample must stay until its step is acked.
        self._replicate.with_hard_pin = True
        self._own_sizes: dict[str, int] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"MooncakeFeatureStore({self.cfg.master_address!r}, role={self.role!r})"

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Upsert `data`, hard-pinned; large objects skip the local buffer."""
        size = memoryview(data).nbytes
        if size == 0:
            raise StoreError(f"cannot put {key!r}: Mooncake stores no empty objects")
        rc = LOCAL_BUFFER_FULL
        if size <= self._local_buffer:
            rc = self._store.upsert(key, data, self._replicate)
        if rc == LOCAL_BUFFER_FULL:
            array, address = _address_of(data)
            self._registered(address, size)
            try:
                rc = self._store.upsert_from(key, address, size, self._replicate)
            finally:
                self._store.unregister_buffer(address)
                del array
        if rc != 0:
            raise StoreError(
                f"Mooncake put of {key!r} ({size} bytes) failed: {_describe(rc)}; "
                f"is {_FIELD}.global_segment_size_mb large enough?"
            )
        self._own_sizes[key] = size

    def get(self, key: str) -> bytes | bytearray:
        """The object's bytes; StoreKeyMissing if there is none."""
        size = self._store.get_size(key)
        if size == OBJECT_NOT_FOUND:
            raise StoreKeyMissing(f"no object {key!r} in Mooncake at {self.cfg.master_address}")
        if size < 0:
            raise StoreError(f"Mooncake get_size of {key!r} failed: {_describe(size)}")
        # Small objects copy through the local buffer; large ones (or when it is full) go
        # straight into a registered buffer, which is also the faster path for them.
        if size <= self._local_buffer // 4:
            data = self._store.get(key)
            if len(data) == size:
                return data
        buffer = bytearray(size)
        array, address = _address_of(buffer)
        self._registered(address, size)
        try:
            rc = self._store.get_into(key, address, size)
        finally:
            self._store.unregister_buffer(address)
            del array
        if rc == OBJECT_NOT_FOUND:
            raise StoreKeyMissing(f"no object {key!r} in Mooncake (removed while reading)")
        if rc != size:
            raise StoreError(f"Mooncake get of {key!r} returned {rc}, expected {size} bytes")
        return buffer

    def get_many(self, keys: Sequence[str], sizes: Sequence[int]) -> list[memoryview]:
        """Objects of known sizes in one batched transfer into one registered buffer.

        Returns a writable view per key; StoreKeyMissing if any object is gone.
        """
        if not keys:
            return []
        offsets = list(itertools.accumulate(sizes, initial=0))
        buffer = bytearray(offsets[-1])
        array, address = _address_of(buffer)
        self._registered(address, len(buffer))
        try:
            codes = self._store.batch_get_into(
                list(keys), [address + o for o in offsets[:-1]], list(sizes)
            )
        finally:
            self._store.unregister_buffer(address)
            del array
        for key, size, rc in zip(keys, sizes, codes, strict=True):
            if rc == OBJECT_NOT_FOUND:
                raise StoreKeyMissing(f"no object {key!r} in Mooncake at {self.cfg.master_address}")
            if rc != size:
                raise StoreError(f"Mooncake batched get of {key!r} returned {rc}, not {size} bytes")
        view = memoryview(buffer)
        return [view[lo:hi] for lo, hi in itertools.pairwise(offsets)]

    def remove(self, key: str, *, force: bool = True) -> None:
        """Remove the object; `force` skips lease checks (a reader's lease would block it)."""
        rc = self._store.remove(key, force)
        if rc not in (0, OBJECT_NOT_FOUND):
            raise StoreError(f"Mooncake remove of {key!r} failed: {_describe(rc)}")
        self._own_sizes.pop(key, None)

    def exists(self, key: str) -> bool:
        """Whether Mooncake holds an object under `key`."""
        rc = self._store.is_exist(key)
        if rc < 0:
            raise StoreError(f"Mooncake is_exist of {key!r} failed: {_describe(rc)}")
        return rc == 1

    def bytes_resident(self) -> int:
        """`master_allocated_bytes` from the master's metrics; this client's own bytes if the
        metrics server cannot be read."""
        url = f"http://{self._master_host}:{self.cfg.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                text = response.read().decode(errors="replace")
        except OSError:
            return sum(self._own_sizes.values())
        for line in text.splitlines():
            if line.startswith("master_allocated_bytes "):
                return int(float(line.split()[1]))
        return sum(self._own_sizes.values())

    def healthy(self) -> bool:
        """Whether the client is set up and reaches the master."""
        return not self._closed and self._store.health_check() == 0

    def close(self) -> None:
        """Close the client (the memory it mounted leaves the store with it)."""
        if not self._closed:
            self._closed = True
            self._store.close()

    def _registered(self, address: int, size: int) -> None:
        rc = self._store.register_buffer(address, size)
        if rc != 0:
            raise StoreError(f"Mooncake could not register a {size}-byte buffer: {_describe(rc)}")

    def __enter__(self) -> MooncakeFeatureStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _open(cfg: DisaggregatedConfig, run_dir: Path, role: str) -> MooncakeFeatureStore:
    """A client of the cluster `[deployment.disaggregated.mooncake]` names, for `role`."""
    return MooncakeFeatureStore(cfg.mooncake, timeout_s=cfg.store_timeout_s, role=role)


KIND = StoreKind("mooncake", open=_open, managed_services=master_services)
