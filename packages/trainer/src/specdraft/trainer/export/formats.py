"""The export formats by name, and `export_checkpoint`, which writes one of them.

A folder format writes into a staging folder that then replaces the files of `--out/`; a
single-file format (gguf) writes one file there, which then becomes `--out` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..models.backbone import DraftModel
from .destination import check_destination, staged
from .gguf import GGUF_FILE, write_gguf
from .gguf_file import check_file_destination, staged_file
from .options import ExportOptions
from .sglang import write_sglang
from .source import DTYPES, ExportError, ExportRefused, checkpoint_dtype, load_checkpoint_draft
from .speculators import write_speculators
from .vllm import write_vllm

# write(model in the export dtype, staging folder, options) -> tensor names left out.
Writer = Callable[[DraftModel, Path, ExportOptions], list[str]]


@dataclass(frozen=True)
class ExportFormat:
    """One `--format`: its name, what reads it, and the function that writes it."""

    name: str
    summary: str
    write: Writer
    # The one file the writer writes into its staging folder, which becomes `--out` (a file
    # path); None: the writer fills a folder, `--out/`.
    single_file: str | None = None


FORMATS: dict[str, ExportFormat] = {
    fmt.name: fmt
    for fmt in (
        ExportFormat("sglang", "SGLang's DFLASH / DSPARK loaders, from_pretrained", write_sglang),
        ExportFormat("vllm", "vLLM 0.32's qwen3_dflash(2) / qwen3_dspark loaders", write_vllm),
        ExportFormat("speculators", "speculators 0.9.0 and vLLM's reader", write_speculators),
        ExportFormat(
            "gguf", "llama.cpp's llama-server -md (one .gguf file)", write_gguf, GGUF_FILE
        ),
    )
}


@dataclass(frozen=True)
class ExportResult:
    """Where the export went and the draft tensors its format does not carry."""

    path: Path
    format: str
    left_out: list[str]


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dtype: str | None = None,
    format: str = "sglang",
    force: bool = False,
    verifier: str | None = None,
) -> ExportResult:
    """Write the checkpoint's draft in `format`: into the folder `out/` (config.json +
    model.safetensors), or, for a single-file format (gguf), as the file `out`."""
    if format not in FORMATS:
        raise ExportRefused(f"--format {format!r} is not one of {sorted(FORMATS)}")
    fmt = FORMATS[format]
    out = Path(out)
    protected = {"the checkpoint's": Path(checkpoint)}
    if verifier and Path(verifier).is_dir():
        protected["the target's"] = Path(verifier)
    if fmt.single_file is not None:
        check_file_destination(out, force=force, protected=protected)
    else:
        check_destination(out, force=force, protected=protected)
    model = load_checkpoint_draft(checkpoint, action="export")
    name = dtype or checkpoint_dtype(checkpoint)
    if name not in DTYPES:
        raise ExportError(f"--dtype {name!r} is not one of {sorted(DTYPES)}")
    model = model.to(DTYPES[name])
    model.config.dtype = name
    options = ExportOptions(checkpoint=str(checkpoint), verifier=verifier)
    staging = staged(out) if fmt.single_file is None else staged_file(out, fmt.single_file)
    with staging as stage:
        left_out = fmt.write(model, stage, options)
    return ExportResult(out, format, left_out)
