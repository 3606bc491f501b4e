"""Where an export may write: never over a folder's files unasked, never into a model's folder.

An export writes its files into a staging folder next to `--out` and moves them in when all are
written, so an interrupted export leaves `--out` as it was.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .source import ExportRefused


def draft_architectures() -> frozenset[str]:
    """`architectures` entries of the folders export itself writes, read from the registered
    families (their own class, vLLM's and speculators' names), so a new family's export folder
    is never mistaken for a target's."""
    from ..models.family import FAMILIES

    names: set[str] = set()
    for family in FAMILIES.values():
        names.add(family.architecture)
        for layout in (family.vllm, family.speculators):
            if layout is not None:
                names.add(layout.architecture)
    return frozenset(names)


def foreign_model(folder: Path) -> str | None:
    """What model a folder holds if it is not a draft export (a target's folder), else None."""
    config_file = folder / "config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            return "a config.json that is not a draft's"
        architectures = config.get("architectures") or []
        if "speculators_model_type" in config or draft_architectures().intersection(architectures):
            return None
        return f"a model with architectures {architectures}"
    weights = sorted(p.name for p in folder.glob("*.safetensors"))
    if weights or (folder / "model.safetensors.index.json").exists():
        return f"model weights ({', '.join(weights[:3]) or 'an index'}) but no draft config"
    return None


def check_destination(out: Path, *, force: bool, protected: dict[str, Path] | None = None) -> None:
    """Refuse an `--out` that holds files (unless `force`), a model, or a protected folder
    (`protected`: what the folder is, e.g. "the target's" -> its path)."""
    if out.exists() and not out.is_dir():
        raise ExportRefused(f"--out {out} is a file, not a folder; choose a folder path")
    resolved = out.resolve()
    for what, folder in (protected or {}).items():
        if resolved == Path(folder).resolve():
            raise ExportRefused(
                f"--out {out} is {what} own folder; export writes config.json and "
                f"model.safetensors, which would replace {what}: choose another folder"
            )
    if not out.is_dir() or not any(out.iterdir()):
        return
    held = foreign_model(out)
    if held is not None:
        raise ExportRefused(
            f"--out {out} holds {held} (a target's folder?); export never writes into a "
            "model's folder, not even with --force: choose an empty folder"
        )
    if not force:
        raise ExportRefused(
            f"--out {out} is not empty; pass --force to replace the draft files in it, or "
            "choose an empty folder"
        )


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A staging folder beside `out`; its files replace `out`'s of the same name on success."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        yield stage
        out.mkdir(exist_ok=True)
        for item in stage.iterdir():
            item.replace(out / item.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
