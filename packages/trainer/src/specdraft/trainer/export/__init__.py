"""`specdraft export`: a training checkpoint as a draft folder an engine or library loads.

One module per format (sglang, vllm, speculators, gguf), registered in formats.FORMATS;
source.py reads and verifies the checkpoint, destination.py guards a folder `--out` and
gguf_file.py a file one, layer_ids.py holds the engines' target-layer conventions. gguf runs
llama.cpp's own converter (converter.py, in a child: llama_convert.py), as target_gguf.py does
for the target's GGUF.
"""

from .formats import FORMATS, ExportFormat, ExportResult, export_checkpoint
from .gguf import llama_cpp_refusal
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
from .target_gguf import TARGET_OUTTYPES, write_target_gguf

__all__ = [
    "DRAFT_FILES",
    "DTYPES",
    "FORMATS",
    "TARGET_OUTTYPES",
    "ExportError",
    "ExportFormat",
    "ExportOptions",
    "ExportRefused",
    "ExportResult",
    "checkpoint_dtype",
    "draft_class_for",
    "export_checkpoint",
    "llama_cpp_refusal",
    "load_checkpoint_draft",
    "verify_draft_files",
    "write_target_gguf",
]
