"""The specdraft cache folder and building cache entries once, atomically, across processes.

Shared by the tokenised-data cache (`data`), the tiny assets (`assets`) and `regenerate`'s
Hugging Face JSON cache; it sits in `runtime` so that none of them imports another for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import publish_dir

CACHE_ENV = "SPECDRAFT_CACHE"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: `cache_dir`, else $SPECDRAFT_CACHE, else ~/.cache/specdraft."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specdraft"


def recipe_hash(recipe: Any, length: int = 16) -> str:
    """A short stable hash of a JSON-serialisable recipe (the cache key of what it builds)."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """Return `final`, building it first with `build(tmp_dir)` if it does not exist yet.

    The entry is built in a private temporary folder and published whole (its files fsync'd,
    then renamed into place, `atomic.publish_dir`), so a reader never sees a half-written entry,
    not even after a power cut. A lock file makes concurrent processes (parallel test workers)
    wait for the first builder instead of repeating its work.
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock_path = final.parent / f".{final.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if final.is_dir():
                return final
            tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                build(tmp)
                publish_dir(tmp, final)
            except OSError:
                # Another builder without the lock (a different file system's semantics) won.
                if not final.is_dir():
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def file_digest(path: Path, *, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
