"""llama.cpp's converter run in a child process (llama_convert.py): a HF folder -> one GGUF file.

The converter and its gguf-py come from the pinned llama.cpp tree (runtime/llama_cpp.py),
run by this interpreter, which holds the converter's dependencies (the trainer's `gguf` extra
adds sentencepiece). The tree's gguf-py goes first on PYTHONPATH so that an installed `gguf`
package (transformers' GGUF reader) never stands in for it.

Pre-tokenizer: the converter names a BPE tokenizer's pre-tokenizer by the hash of its output on
a fixed text and refuses a hash it does not know. specdraft's tiny tokenizer is one: its split
is Qwen2's regex (assets/tokenizer.py, QWEN_SPLIT_PATTERN; llama.cpp's `qwen2` pre-tokenizer
splits by the same expression), so for it alone, recognised by its asset record and its
tokenizer.json, the child writes `qwen2`. Any other unknown tokenizer stays refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .source import ExportError

CHILD = Path(__file__).with_name("llama_convert.py")
# llama.cpp's name of the pre-tokenizer that splits by Qwen2's regex.
QWEN2_PRE_TOKENIZER = "qwen2"
# Converter output types by the torch dtype names export takes (--dtype).
OUTTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def tiny_tokenizer_pre(target_dir: Path) -> str | None:
    """`qwen2` when `target_dir` holds specdraft's tiny tokenizer (its asset record says so and
    its tokenizer.json splits by Qwen2's regex), else None."""
    from ..assets.tokenizer import INFO_FILE, QWEN_SPLIT_PATTERN

    try:
        record = json.loads((target_dir / INFO_FILE).read_text(encoding="utf-8"))
        tokenizer = json.loads((target_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = (record.get("recipe") or {}).get("kind")
    if kind not in ("tiny-target", "tiny-tokenizer"):
        return None
    return QWEN2_PRE_TOKENIZER if _split_pattern(tokenizer) == QWEN_SPLIT_PATTERN else None


def _split_pattern(tokenizer: dict[str, Any]) -> str | None:
    """The regex of the tokenizer's Split pre-tokenizer (in a Sequence or alone), if any."""
    pre = tokenizer.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        if step.get("type") == "Split":
            return (step.get("pattern") or {}).get("Regex")
    return None


def run_converter(
    source: Path,
    outfile: Path,
    *,
    outtype: str,
    target_dir: Path | None = None,
    model_name: str | None = None,
    append: Path | None = None,
    append_type: str = "f32",
) -> None:
    """Convert the HF folder `source` into `outfile` with the pinned llama.cpp's converter;
    `append` (an .npz) adds tensors to its output (llama_convert.py)."""
    from ..runtime.llama_cpp import LlamaCppUnavailable, require_llama_cpp

    try:
        llama = require_llama_cpp()
    except LlamaCppUnavailable as exc:
        raise ExportError(f"the GGUF export runs llama.cpp's own converter: {exc}") from None
    pre = tiny_tokenizer_pre(target_dir if target_dir is not None else source)
    command = [sys.executable, str(CHILD), "--home", str(llama.home)]
    if pre is not None:
        command += ["--pre-tokenizer", pre]
    if append is not None:
        command += ["--append", str(append), "--append-type", append_type]
    command += ["--", str(source), "--outfile", str(outfile), "--outtype", outtype]
    if target_dir is not None:
        command += ["--target-model-dir", str(target_dir)]
    if model_name is not None:
        command += ["--model-name", model_name]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(llama.gguf_py), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or not outfile.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ExportError(
            f"llama.cpp's converter ({llama.converter}, build {llama.build_number}) failed on "
            f"{source} (exit {done.returncode}):\n{tail}"
        )
