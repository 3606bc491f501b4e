"""One run per folder: the output_dir lock, and what a fresh run finds already there.

`hold_run_folder` takes an exclusive `flock` on `<output_dir>/.specdraft-run.lock` for the life
of the run. The kernel drops the lock when the holder exits however it exits (SIGKILL, a crash),
so a stale lock of a dead process never blocks anyone; the file keeps the holder's host, pid and
start time for the message a second run gets. (flock on NFS depends on the server: local and
Lustre/GPFS mounts honour it.)

A fresh run (no `--resume`) into a folder that already holds a run (checkpoints, metrics) would
mix two experiments: it is refused, unless `--overwrite` moves the old run's files into
`<output_dir>/replaced-<time>/` first, and says where.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ..runtime.atomic import fsync_dir
from ..runtime.private import run_folder
from .tracking.registry import run_files as tracking_run_files

LOCK_NAME = ".specdraft-run.lock"
REPLACED_PREFIX = "replaced-"
# What a training run writes into output_dir (and --overwrite moves aside); each tracking
# backend names its own (TensorBoard's events, W&B's offline runs, MLflow's store).
RUN_FILES = (
    "checkpoints",
    "metrics.jsonl",
    "summary.json",
    "trained-samples",
    *tracking_run_files(),
)


class RunFolderError(RuntimeError):
    """The run folder is busy or already holds another run; the message names the fix."""


def lock_path(output_dir: str | Path) -> Path:
    """The lock file of a run folder."""
    return Path(output_dir) / LOCK_NAME


def describe_holder(path: Path) -> str:
    """Who holds a lock, from what its file says ("an unknown process" when unreadable)."""
    try:
        info = json.loads(path.read_text() or "{}")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"pid {info['pid']} on {info['host']} (started {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def hold_run_folder(output_dir: str | Path) -> Iterator[Path]:
    """Hold the run folder's lock within this block; RunFolderError when another run has it."""
    folder = run_folder(output_dir)  # a new one 0700, an existing one keeps its mode
    path = lock_path(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(
                f"output_dir {folder} is in use by another specdraft train run: "
                f"{describe_holder(path)}; wait for it to end, stop it, or choose another "
                "output_dir"
            ) from None
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        with contextlib.suppress(OSError):
            os.fsync(fd)
        yield path
    finally:
        os.close(fd)  # releases the lock (so would the process's end)


def existing_run(output_dir: str | Path) -> list[str]:
    """What of a previous run the folder holds (checkpoints, metrics), as short phrases."""
    folder = Path(output_dir)
    found = []
    root = folder / "checkpoints"
    if root.is_dir():
        steps = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
        if steps:
            found.append(f"{len(steps)} checkpoint(s) up to {steps[-1]}")
    metrics = folder / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    return found


def fresh_run_refusal(output_dir: str | Path) -> str | None:
    """Why a fresh run may not start in `output_dir` (None: it may)."""
    found = existing_run(output_dir)
    if not found:
        return None
    return (
        f"output_dir {output_dir} already holds a run ({', '.join(found)}); continue it with "
        "--resume latest, move it aside with --overwrite, or choose another output_dir"
    )


def move_run_aside(output_dir: str | Path, extra: tuple[str, ...] = ()) -> Path | None:
    """Move the previous run's files into `<output_dir>/replaced-<time>/`; return that folder.

    Nothing is deleted: the folder is on the same filesystem, so this is a few renames. `extra`
    names more entries to move (a managed disaggregated run's own `disagg/` and `logs/`).
    """
    folder = Path(output_dir)
    names = [n for n in (*RUN_FILES, *extra) if (folder / n).exists()]
    if not names:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = folder / f"{REPLACED_PREFIX}{stamp}"
    suffix = 1
    while target.exists():
        suffix += 1
        target = folder / f"{REPLACED_PREFIX}{stamp}-{suffix}"
    target.mkdir(mode=0o700)
    for name in names:
        (folder / name).rename(target / name)
    # Both folders' entries changed: a crash after this returns must not undo either.
    fsync_dir(target)
    fsync_dir(folder)
    return target
