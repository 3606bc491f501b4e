"""`--format gguf`: one GGUF file that llama.cpp's `llama-server -m TARGET.gguf -md DRAFT.gguf
--spec-type draft-dflash|draft-dspark` loads (llama.cpp build 11434, runtime/llama_cpp.py).

The file is what llama.cpp's own converter (conversion/qwen.py: `DFlashModel` for
`DFlashDraftModel` / `DFlash2DraftModel`, `DSparkModel` for `Qwen3DSparkModel`) writes from the
`--format sglang` folder with the target as `--target-model-dir` (the draft's GGUF carries the
target's tokenizer; at run time it borrows the target's embeddings, and its head when it has none
of its own). `--verifier TARGET_DIR` is required.

A draft vocabulary goes past the converter where the runtime allows (src/models/dflash.cpp,
`load_arch_tensors`: `d2t` I64 absolute target ids and an `output.weight` of D rows, for every
family; the logits are scattered to the target vocabulary through d2t before the DSpark Markov
bias and the DFlash2 selector read them):

- DSpark: the converter reads `draft_vocab_size`, `lm_head.weight` and `d2t` in the offset
  convention (target = i + d2t[i]) and writes both itself.
- DFlash, DFlash2: the converter reads neither, so it converts the full-vocabulary view and
  the file is rewritten with `d2t` and `output.weight` added (llama_convert.py). DFlash2's
  selector then takes its top-k of the scattered logits, target ids whose codebook rows (indexed
  by target id, as specdraft's) it reads: the same candidates as in training.

What the runtime cannot load is refused before anything is written (`llama_cpp_refusal`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..models.backbone import DraftModel
from ..models.draft_vocab import d2t_offsets
from .converter import OUTTYPES, run_converter
from .draft_vocab import draft_vocab_ids, without_specdraft_keys
from .options import ExportOptions
from .source import ExportRefused

# The file a GGUF export writes into its staging folder (it then becomes --out).
GGUF_FILE = "model.gguf"
# Architectures whose converter class reads a draft vocabulary itself (DSparkModel).
_CONVERTER_READS_DRAFT_VOCAB = ("Qwen3DSparkModel",)


def llama_cpp_refusal(config: Any) -> str | None:
    """Why llama.cpp build 11434 cannot load this draft (and the option that fixes it), or None."""
    markov = getattr(config, "markov_head_type", None)
    if markov is not None and markov != "vanilla":
        return (
            f"its DSpark Markov head is {markov!r} (model.dspark.markov_type = {markov!r}) and "
            "llama.cpp builds only the 'vanilla' head (its converter refuses any other "
            "markov_head_type; dflash.cpp adds W2(W1[prev]) to the logits); retrain with "
            'model.dspark.markov_type = "vanilla" to serve it with llama.cpp'
        )
    if getattr(config, "enable_confidence_head", False) and not getattr(
        config, "confidence_head_with_markov", False
    ):
        return (
            "its DSpark confidence head reads the draft state alone "
            "(model.dspark.confidence_uses_markov = false) and llama.cpp's reads the state and "
            "the Markov embedding of the previous token (dflash.cpp's conf_proj has hidden_size "
            "+ markov_rank inputs: llama-server refuses the file, \"tensor 'conf_proj.weight' "
            'has wrong shape"); retrain with model.dspark.confidence_uses_markov = true, or '
            "without a confidence head (model.dspark.confidence_head = false)"
        )
    top_k = getattr(config, "selector_top_k", None)
    if top_k is not None and config.hidden_size < top_k * (top_k + 1):
        most = max(k for k in range(1, top_k) if config.hidden_size >= k * (k + 1))
        return (
            f"llama.cpp's DFlash2 selector packs each position's {top_k} candidates and their "
            f"{top_k}x{top_k} pair scores into one hidden-state row (dflash.cpp needs "
            f"hidden_size >= top_k * (top_k + 1) = {top_k * (top_k + 1)}) and this draft's "
            f"hidden size is {config.hidden_size}; retrain with model.dflash2.selector_top_k "
            f"<= {most}"
        )
    if getattr(config, "is_causal", False) is None:
        return (
            'its layers differ in causality (model.causal_layers = "sliding" over '
            f"layer_types {list(config.layer_types or [])}) and llama.cpp's converter writes one "
            'attention.causal for the whole draft; retrain with model.causal_layers = "all" '
            'or "none", or serve it with vLLM'
        )
    return None


def check_verifier(model: DraftModel, verifier: str | None, checkpoint: str) -> Path:
    """The target's local folder, refused when missing or not the target the draft was made for."""
    if not verifier:
        raise ExportRefused(
            "--format gguf needs --verifier TARGET_DIR, the target's local HF folder: llama.cpp's "
            "converter writes the target's tokenizer and layer count into the draft's GGUF"
        )
    folder = Path(verifier)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ExportRefused(
            f"--verifier {verifier} is not a local HF model folder (no config.json); --format "
            "gguf reads the target's files"
        )
    target = json.loads(config_file.read_text())
    target = {**target, **(target.get("text_config") or {})}
    config = model.config
    expected = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_target_layers,
    }
    for key, value in expected.items():
        if value is not None and target.get(key) != value:
            raise ExportRefused(
                f"--verifier {verifier} has {key} {target.get(key)} but {checkpoint} was trained "
                f"for a target with {key} {value}: pass the target the draft was trained for"
            )
    return folder


def write_gguf(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write `folder/model.gguf` with llama.cpp's converter; nothing is left out."""
    reason = llama_cpp_refusal(model.config)
    if reason is not None:
        raise ExportRefused(f"cannot export {options.checkpoint} as --format gguf: {reason}")
    target = check_verifier(model, options.verifier, options.checkpoint)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    source = folder / "draft-hf"
    append = write_converter_input(model, source)
    try:
        run_converter(
            source,
            folder / GGUF_FILE,
            outtype=OUTTYPES[dtype],
            target_dir=target,
            model_name=draft_model_name(type(model).__name__, target),
            append=append,
            append_type=OUTTYPES[dtype],
        )
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return []


def draft_model_name(architecture: str, target: Path) -> str:
    """The GGUF's `general.name`: the target's folder name and the draft's architecture."""
    return f"{target.resolve().name}-{architecture}"


def write_converter_input(model: DraftModel, source: Path) -> Path | None:
    """The `--format sglang` folder the converter reads; for a draft vocabulary the converter
    does not read, its full-vocabulary view and an .npz of the tensors to append after it."""
    source.mkdir(parents=True)
    model.save_pretrained(str(source), safe_serialization=True)
    ids = draft_vocab_ids(model)
    if ids is None:
        return None
    config_file, weights_file = source / "config.json", source / "model.safetensors"
    config = without_specdraft_keys(json.loads(config_file.read_text()))
    tensors = load_file(str(weights_file))
    append = None
    if type(model).__name__ in _CONVERTER_READS_DRAFT_VOCAB:
        tensors["d2t"] = d2t_offsets(ids)  # the converter turns them into absolute ids
    else:
        head = tensors.pop("lm_head.weight")
        config.pop("draft_vocab_size", None)
        append = source.parent / "draft-vocab.npz"
        np.savez(
            append,
            d2t=np.asarray(ids, dtype=np.int64),
            **{"output.weight": head.to(torch.float32).numpy()},
        )
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(weights_file), metadata={"format": "pt"})
    return append
