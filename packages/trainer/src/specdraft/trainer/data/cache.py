"""Tokenised datasets cached on disk (`datasets` save_to_disk), keyed by everything they depend
on: the data files (path, size, mtime), the chat template source, the tokenizer's content,
max_length, the sample limit and the bad-row policy."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..runtime.cache import file_digest, recipe_hash
from .quiet import quiet_datasets
from .report import DataReport

# Bump when tokenisation or masking changes, so old caches are not reused.
PIPELINE_VERSION = 2  # 2: unsupervised tail trimmed

DATA_DIR = "data"
REPORT_FILE = "report.json"

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of what the tokenizer does: its serialised Rust tokenizer and special tokens, or,
    for a slow tokenizer, the files of the folder it was loaded from."""
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    digest.update(json.dumps(special, sort_keys=True, default=str).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
        return digest.hexdigest()[:16]
    folder = Path(str(getattr(tokenizer, "name_or_path", "")))
    files = [folder / name for name in _TOKENIZER_FILES if (folder / name).is_file()]
    if not files:
        raise ValueError(
            f"cannot fingerprint tokenizer {type(tokenizer).__name__} for the data cache: it "
            f"is not a fast tokenizer and was not loaded from a local folder"
        )
    for path in files:
        digest.update(path.name.encode())
        digest.update(file_digest(path).encode())
    return digest.hexdigest()[:16]


def dataset_cache_key(
    *,
    sources: list[dict[str, Any]],
    template_source: str,
    tokenizer_fp: str,
    max_length: int,
    limit: int | None,
    bad_rows: str,
) -> str:
    """The cache key of one tokenised dataset."""
    return recipe_hash(
        {
            "pipeline": PIPELINE_VERSION,
            "sources": sources,
            "template": hashlib.sha256(template_source.encode()).hexdigest(),
            "tokenizer": tokenizer_fp,
            "max_length": max_length,
            "limit": limit,
            "bad_rows": bad_rows,
        }
    )


def save_dataset(folder: Path, dataset: Any, report: DataReport) -> None:
    """Write a dataset and its report into `folder` (a fresh temporary folder)."""
    # The tokenising bar already showed progress; a second bar for a fast copy is noise.
    with quiet_datasets():
        dataset.save_to_disk(str(folder / DATA_DIR))
    (folder / REPORT_FILE).write_text(
        json.dumps(report.to_dict(), indent=2, sort_keys=True), encoding="utf-8"
    )


def load_dataset_report(folder: Path) -> DataReport:
    """The report stored next to a cached dataset."""
    report = DataReport.from_dict(json.loads((folder / REPORT_FILE).read_text(encoding="utf-8")))
    report.cache_path = os.fspath(folder)
    return report


def load_dataset_entry(folder: Path) -> tuple[Any, DataReport]:
    """Load a cached dataset (memory-mapped) and its report."""
    import datasets

    dataset = datasets.load_from_disk(str(folder / DATA_DIR))
    return dataset, load_dataset_report(folder)
