"""The target's GGUF for llama.cpp (`llama-server -m TARGET.gguf`): its HF folder through
llama.cpp's own converter (converter.py), written beside `--out` and moved in when whole.

Third-party tokenizers are named by the converter's own hash table; specdraft's tiny tokenizer,
which that table cannot know, is written with the `qwen2` pre-tokenizer (converter.py says why).
"""

from __future__ import annotations

from pathlib import Path

from .gguf_file import check_file_destination, staged_file
from .source import ExportRefused

# Output types the converter writes for a target that llama.cpp's CPU build runs.
TARGET_OUTTYPES = ("f32", "f16", "q8_0")
_STAGED = "target.gguf"


def write_target_gguf(
    target_dir: str | Path, out_file: str | Path, *, outtype: str = "f32", force: bool = False
) -> Path:
    """Write the target's GGUF to `out_file` (a new .gguf path, or an existing one with
    `force`; never inside the target's folder) and return its path."""
    target, out = Path(target_dir), Path(out_file)
    if outtype not in TARGET_OUTTYPES:
        raise ExportRefused(f"--outtype {outtype!r} is not one of {', '.join(TARGET_OUTTYPES)}")
    if not (target / "config.json").is_file():
        raise ExportRefused(f"--target {target} is not a local HF model folder (no config.json)")
    check_file_destination(out, force=force, protected={"the target's": target})
    from .converter import run_converter

    # `general.name` is the converter's default, the target folder's name.
    with staged_file(out, _STAGED) as stage:
        run_converter(target, stage / _STAGED, outtype=outtype)
    return out
