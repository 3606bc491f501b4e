"""Durable atomic writes: a file is either its old content or its new content, even after a
power cut.

Every file a run writes goes through here: the bytes go to a temporary file in the same folder
(same filesystem, so the rename is atomic), that file is fsync'd, renamed over the target, and the
folder is fsync'd so the rename itself survives a crash. A write that fails (a full disk, an I/O
error) removes its temporary file, so a failure never leaves a 0-byte `.tmp` behind, and raises
the OSError with the target's path.
"""

from __future__ import annotations

import contextlib
import os
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


@contextlib.contextmanager
def atomic_path(path: str | Path, *, mode: int = 0o666) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new content to; publish it durably on exit.

    For writers that want a file name (safetensors, torch): write the whole file to the yielded
    path; on a normal exit it is fsync'd and renamed over `path`, on an exception it is removed.
    `mode` is the mode of a new file before the umask (0o600 for private files).
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
    fsync_dir(path.parent)


def atomic_write(path: str | Path, data: bytes | str, *, mode: int = 0o666) -> Path:
    """Write `data` (str as UTF-8) to `path` durably and atomically; return `path`."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_path(path, mode=mode) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
    return Path(path)
