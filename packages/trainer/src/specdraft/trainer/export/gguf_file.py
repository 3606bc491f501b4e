"""Where a GGUF file may be written: `--out` names the file, refused when it exists (unless
forced) and always when it lies inside a model's folder; written beside it, then moved in.

The folder formats' rules are destination.py's; a GGUF export writes one file, so its `--out` is
that file, and a half-written file never takes its place.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .source import ExportRefused


def check_file_destination(
    out: Path, *, force: bool, protected: dict[str, Path] | None = None
) -> None:
    """Refuse an `--out` that is not a new `.gguf` file path (an existing file needs `force`)
    or that lies inside a protected folder (`protected`: "the target's" -> its folder)."""
    if out.suffix != ".gguf":
        raise ExportRefused(
            f"--out {out}: a GGUF export writes one file; name it with the .gguf suffix "
            "(e.g. --out draft.gguf)"
        )
    if out.is_dir():
        raise ExportRefused(f"--out {out} is a folder; a GGUF export writes one .gguf file")
    resolved = out.resolve()
    for what, folder in (protected or {}).items():
        if Path(folder).resolve() in resolved.parents:
            raise ExportRefused(
                f"--out {out} is inside {what} folder ({folder}); a GGUF export never writes "
                "into a model's folder, not even with --force: choose a path outside it"
            )
    if out.exists() and not force:
        raise ExportRefused(f"--out {out} exists; pass --force to replace it, or choose a new path")


@contextmanager
def staged_file(out: Path, name: str) -> Iterator[Path]:
    """A staging folder beside `out`; the file `name` written there replaces `out` on success."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        yield stage
        (stage / name).replace(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
