"""Durable atomic writes: a file is either its old content or its new content, even after a
power cut.

Every file a run writes goes through here: the bytes go to a temporary file in the same folder
(same filesystem, so the rename is atomic), that file is fsync'd, renamed over the target, and the
folder is fsync'd so the rename itself survives a crash. A write that fails (a full disk, an I/O
error) removes its temporary file, so a failure never leaves a 0-byte `.tmp` behind, and raises
the OSError with the target's path.

A writer whose file a crash may lose (it is rebuilt or re-captured, like the embedded feature
store's objects) passes `sync_folder=False`: the bytes are still flushed before the rename, so
a crash never leaves a torn file under the final name, but the folder is not flushed after it.
A folder built whole (a cache entry) is published with `publish_dir`.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (renames, new files) to disk; a no-op where folders cannot be
    opened (some network filesystems)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL on filesystems that do not sync folders
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush one written file's bytes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """A unique temporary sibling of `path` (hidden, pid and random tag: writers never collide)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


_TEMP_NAME_RE = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp")


def is_temp_name(name: str) -> bool:
    """Whether a file name is one `temp_name` makes (a write in flight, or one a crash left)."""
    return _TEMP_NAME_RE.fullmatch(name) is not None


@contextlib.contextmanager
def atomic_path(path: str | Path, *, mode: int = 0o666, sync_folder: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new content to; publish it durably on exit.

    For writers that want a file name (safetensors, torch): write the whole file to the yielded
    path; on a normal exit it is fsync'd and renamed over `path`, on an exception it is removed.
    `mode` is the mode of a new file before the umask (0o600 for private files);
    `sync_folder=False` skips the folder's fsync after the rename (see the module docstring).
    """
    path = Path(path)
    tmp = temp_name(path)
    # Created here (exclusive) so a private mode holds before any byte lands.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync_folder:
        fsync_dir(path.parent)


def atomic_write(
    path: str | Path,
    data: bytes | bytearray | memoryview | str,
    *,
    mode: int = 0o666,
    sync_folder: bool = True,
) -> Path:
    """Write `data` (str as UTF-8) to `path` durably and atomically; return `path`."""
    payload = data.encode("utf-8") if isinstance(data, str) else memoryview(data).cast("B")
    with atomic_path(path, mode=mode, sync_folder=sync_folder) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
    return Path(path)


def publish_dir(tmp: str | Path, final: str | Path) -> None:
    """Rename a folder built whole at `tmp` to `final`, durably: every file and folder under
    `tmp` is fsync'd first (a crash never leaves an entry whose files are torn), the parent after.

    OSError from the rename (`final` exists, another builder won) is the caller's to handle.
    """
    tmp, final = Path(tmp), Path(final)
    for folder, _dirs, files in os.walk(tmp):
        for name in files:
            fsync_file(Path(folder) / name)
        fsync_dir(folder)
    os.rename(tmp, final)
    fsync_dir(final.parent)
