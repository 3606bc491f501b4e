"""A checkpoint save that failed: every rank agrees it failed, and the one line that says why.

A save is a sequence of phases separated by collectives; a rank whose write fails (a full disk,
an I/O error) must not leave the others waiting in the next collective, so after each phase the
ranks exchange their errors (`agree_on_failure`) and all raise the same `CheckpointSaveFailed`.
Torch's own writers often hide the OSError (`RuntimeError: [enforce fail at inline_container.cc]
unexpected pos`), so the message says what the disk says: the free bytes against the bytes a
checkpoint needs.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..runtime import DistContext


class CheckpointSaveFailed(RuntimeError):
    """A checkpoint could not be written; the partial folder is gone, the run may go on."""

    def __init__(self, step: int, message: str) -> None:
        self.step = step
        super().__init__(message)


def unwrapped(exc: BaseException) -> BaseException:
    """The first rank's own error inside DCP's CheckpointException (which holds them by rank
    as (exception, traceback) pairs), else `exc`."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for pair in failures.values():
            inner = pair[0] if isinstance(pair, tuple) else pair
            if isinstance(inner, BaseException):
                return unwrapped(inner)
    return exc


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` (itself, its cause or context), or None."""
    seen: set[int] = set()
    current: BaseException | None = unwrapped(exc)
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_error(exc: BaseException, where: Path, needed: int = 0) -> str:
    """The error in a few words: errno name and path when known, else its first line (and,
    when the disk has less room than a checkpoint needs, that the disk is full: torch's zip
    writer reports ENOSPC as 'unexpected pos')."""
    os_error = os_error_in(exc)
    if os_error is not None:
        name = errno.errorcode.get(os_error.errno or 0, "")
        path = os_error.filename or where
        return f"{name} ({os_error.strerror}) writing {path}"
    inner = unwrapped(exc)
    text = str(inner).strip()
    first = text.splitlines()[0] if text else type(inner).__name__
    free = free_bytes(where)
    if needed and free is not None and free < needed:
        return f"ENOSPC (the disk is full: {type(inner).__name__}: {first[:160]}) writing {where}"
    return f"{type(inner).__name__}: {first[:200]} writing under {where}"


def agree_on_failure(
    error: BaseException | None, where: Path, ctx: DistContext, needed: int = 0
) -> str | None:
    """Every rank's error of the last phase, exchanged: the first one's description, or None.

    A collective: every rank calls it after every phase, failed or not.
    """
    who = f"rank {ctx.rank}: " if ctx.world_size > 1 else ""
    mine = None if error is None else f"{who}{describe_error(error, where, needed)}"
    if dist.is_initialized() and ctx.world_size > 1:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, mine)
        failed = [g for g in gathered if g is not None]
        return failed[0] if failed else None
    return mine


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (0 when it is missing)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def free_bytes(folder: Path) -> int | None:
    """Free bytes on the filesystem holding `folder` (its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def size_text(num_bytes: float) -> str:
    """Bytes for a log line: KiB, MiB or GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{int(num_bytes)} B"


def save_failed_message(step: int, what: str, folder: Path, needed: int) -> str:
    """One line: the step, the error and its path, the bytes a checkpoint needs and the free."""
    free = free_bytes(folder)
    room = f", {size_text(free)} free there" if free is not None else ""
    return (
        f"checkpoint of step {step} not saved: {what}; a checkpoint needs about "
        f"{size_text(needed)}{room}; the partial folder was removed"
    )
