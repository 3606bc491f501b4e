"""What a run writes is its owner's alone: the run folder, private sub-folders, a private
umask for a run process, and private files written atomically.

A new run folder (config field output_dir) and its missing parents are 0700; an existing one
keeps its mode (it may be `.`, $HOME or a shared project folder). Sub-folders specdraft owns
(disagg/, logs/, the feature store) are 0700 and tightened if they exist looser; files are 0600.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .atomic import atomic_write

# What a run's processes create is theirs alone: folders 0700, files 0600.
PRIVATE_UMASK = 0o077


def _make_folders(path: Path) -> None:
    # mkdir(parents=True) would give the missing parents the umask's mode, not 0700.
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)


def run_folder(path: str | Path) -> Path:
    """Create a run folder (config field output_dir) and missing parents as 0700; keep an
    existing one's mode."""
    path = Path(path)
    # output_dir may be `.`, $HOME or a shared project folder: its mode is the user's choice,
    # and what specdraft writes inside it is private on its own (private_dir, private_files).
    _make_folders(path)
    return path


def private_dir(path: str | Path) -> Path:
    """Create a sub-folder specdraft owns (disagg/, logs/, the store) as 0700; tighten it if it
    exists with a looser mode. Never call it on output_dir itself: use `run_folder`."""
    path = Path(path)
    _make_folders(path)
    info = path.stat()
    # A folder another user made (a shared scratch root) is left as it is.
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Within this block, new files are 0600 and new folders 0700 (a 0o077 umask), restored after.

    Set by each run process's entry point (trainer ranks, producer, capture server), so the
    checkpoints, metrics and ledgers that torch and plain `open` write there are private too,
    while a library caller (a test, a notebook) keeps its own umask afterwards.
    """
    previous = os.umask(PRIVATE_UMASK)
    # Stricter bits the caller already had (say 0o277) are kept, never loosened.
    os.umask(previous | PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def write_private(path: str | Path, data: bytes) -> Path:
    """Write `data` atomically to a 0600 file (temporary file, then rename)."""
    return atomic_write(path, data, mode=0o600)
