"""The embedded feature store: one file per object under the run folder, for one machine.

Every process of a run (capture servers, producer, trainer ranks) opens the same folder; the
file system is the only shared state, so nothing has to be started and nothing is lost when a
process dies. A write is `runtime.atomic.atomic_write`: a private temporary file, fsync'd and
renamed over the key's path, so a reader sees the whole object or none of it, even after a power
cut. The folder is not fsync'd after the rename: an object a crash loses is captured again (the
producer checks which objects survived), a torn one would be read as features.
Folders are created 0700 and objects 0600: target features reveal the training data.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...runtime.atomic import atomic_write, is_temp_name
from ...runtime.private import private_dir
from .base import StoreError, StoreKeyMissing, StoreKind, local_store_root

if TYPE_CHECKING:
    from specdraft.config import DisaggregatedConfig


class LocalFeatureStore:
    """A `FeatureStore` of files under `root` (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            private_dir(self.root)
        except OSError as exc:
            raise StoreError(
                f"cannot create the feature-store folder {self.root}: {exc}; check the run "
                f"folder (config field output_dir) is writable"
            ) from exc

    def __repr__(self) -> str:
        return f"LocalFeatureStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        # Keys come from `sample_key`, but a store is a trust boundary for anything else that
        # hands it a key: never let one step out of the root.
        # A temporary file's name is never a key's part, so `exists` never sees a write in flight.
        if not key or any(p in ("", ".", "..") or is_temp_name(p) for p in parts):
            raise ValueError(f"{key!r} is not a valid feature-store key")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write `data` atomically: a fsync'd temporary file renamed over the key's path."""
        path = self._path(key)
        # A concurrent `remove` of a sibling may prune the folder between mkdir and open: retry.
        for retry in range(3):
            try:
                _make_folders(self.root, path.parent)
                atomic_write(path, data, mode=0o600, sync_folder=False)
                return
            except FileNotFoundError:
                if retry == 2:
                    raise StoreError(f"cannot write {key!r}: its folder keeps vanishing") from None
            except OSError as exc:
                raise StoreError(f"cannot write {key!r} under {self.root}: {exc}") from exc

    def get(self, key: str) -> bytearray:
        """Read the whole object; StoreKeyMissing if there is none."""
        try:
            with open(self._path(key), "rb") as fh:
                # Into a bytearray: the tensor reader wraps it without another copy.
                data = bytearray(os.fstat(fh.fileno()).st_size)
                fh.readinto(data)
                return data
        except FileNotFoundError:
            raise StoreKeyMissing(f"no object {key!r} in the feature store {self.root}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {key!r} under {self.root}: {exc}") from exc

    def remove(self, key: str, *, force: bool = True) -> None:
        """Delete the object (no leases here, so `force` changes nothing); missing is fine."""
        del force  # accepted for protocol parity with Mooncake, where it skips lease checks
        path = self._path(key)
        path.unlink(missing_ok=True)
        _remove_dead_writers_leftovers(path)
        # Prune the now-empty attempt and sample folders so a long run does not leave millions
        # of empty directories behind; a folder a writer still uses is simply not empty.
        for folder in (path.parent, path.parent.parent):
            if folder == self.root:
                break
            try:
                folder.rmdir()
            except OSError:
                break

    def exists(self, key: str) -> bool:
        """Whether the key's file exists (temporary files never match a key)."""
        return self._path(key).is_file()

    def bytes_resident(self) -> int:
        """Bytes of every object (and in-flight temporary file) under the root."""
        total = 0
        stack = [self.root]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue  # pruned by a concurrent remove
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
        return total

    def close(self) -> None:
        """Nothing to release: the objects stay on disk for the other processes."""

    def sweep_dead_writes(self) -> int:
        """Delete every temporary file whose writer has died, anywhere under the root.

        `remove` cleans a key's own leftovers, but a write killed before its object ever
        existed belongs to a key nobody removes: the producer captures that sample again under
        a new attempt. Returns how many files went."""
        swept = 0
        for folder, _dirs, names in os.walk(self.root, topdown=False):
            for name in names:
                if _left_by_a_dead_writer(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))
                        swept += 1
            if Path(folder) != self.root:
                # Emptied by the sweep (or by an earlier prune that lost a race): prune it too.
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        return swept


def _remove_dead_writers_leftovers(path: Path) -> None:
    """Delete the temporary files of `path` whose writer has died (killed before its rename).

    Without this a capture server killed mid-write leaves a hidden `.tmp` beside the key for the
    rest of the run, and its folder can never be pruned. A live writer's file is left alone: its
    rename must still land (or fail by itself).
    """
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(prefix) and _left_by_a_dead_writer(name):
            with contextlib.suppress(FileNotFoundError):
                (path.parent / name).unlink()


def _left_by_a_dead_writer(name: str) -> bool:
    """Whether a file name is a temporary file whose writer is no longer alive."""
    return is_temp_name(name) and not _alive(_writer_pid(name))


def _writer_pid(temp: str) -> int:
    """The pid `atomic.temp_name` put in a temporary file's name (`.<name>.<pid>.<tag>.tmp`)."""
    return int(temp.rsplit(".", 3)[1])


def _alive(pid: int) -> bool:
    """Whether a process of this machine has that pid (the local store is one machine's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_folders(root: Path, folder: Path) -> None:
    # mkdir(parents=True) would create the intermediate folders with the umask's mode.
    for part in reversed([folder, *folder.parents]):
        if part == root or root not in part.parents:
            continue
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=0o700)


def _open(cfg: DisaggregatedConfig, run_dir: Path, role: str) -> LocalFeatureStore:
    """The run folder's store: every role opens the same files; the producer, one per launch,
    first sweeps what writers killed in an earlier launch left behind."""
    store = LocalFeatureStore(local_store_root(run_dir))
    if role == "producer":
        store.sweep_dead_writes()
    return store


KIND = StoreKind("local", open=_open)
