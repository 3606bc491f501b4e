"""`specdraft export`: a training checkpoint as a draft folder an engine or library loads.

One module per format (sglang, vllm, speculators), registered in formats.FORMATS; source.py
reads and verifies the checkpoint, destination.py guards `--out`, layer_ids.py holds the
engines' target-layer conventions.
"""

from .formats import FORMATS, ExportFormat, ExportResult, export_checkpoint
from .options import ExportOptions
from .source import (
    DRAFT_FILES,
    DTYPES,
    ExportError,
    ExportRefused,
    checkpoint_dtype,
    draft_class_for,
    load_checkpoint_draft,
    verify_draft_files,
)

__all__ = [
    "DRAFT_FILES",
    "DTYPES",
    "FORMATS",
    "ExportError",
    "ExportFormat",
    "ExportOptions",
    "ExportRefused",
    "ExportResult",
    "checkpoint_dtype",
    "draft_class_for",
    "export_checkpoint",
    "load_checkpoint_draft",
    "verify_draft_files",
]
