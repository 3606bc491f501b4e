"""`--format sglang`: the HF folder SGLang's DFlash / DSpark loaders read (and from_pretrained).

config.json is the draft's own HF config (nested `dflash_config` first, then the top-level keys
SGLang falls back to; see models/config.py), model.safetensors every draft tensor.
"""

from __future__ import annotations

from pathlib import Path

from ...models.backbone import DraftModel
from .options import ExportOptions


def write_sglang(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write config.json and model.safetensors; nothing is left out."""
    del options
    model.save_pretrained(str(folder), safe_serialization=True)
    return []
