"""`--format sglang`: the HF folder SGLang's DFlash / DSpark loaders read (and from_pretrained).

config.json is the draft's own HF config (nested `dflash_config` first, then the top-level keys
SGLang falls back to; see models/config.py), model.safetensors every draft tensor.
"""

from __future__ import annotations

from pathlib import Path

from ..models.backbone import DraftModel
from .draft_vocab import refuse_draft_vocab
from .options import ExportOptions
from .sliding_window import sglang_refusal
from .source import ExportRefused

# Read in SGLang 0.5.23: models/dflash.py and models/dspark.py take their logits (and DFlash2's
# candidates) from the target's lm_head, restricted to its original vocabulary.
_NO_DRAFT_VOCAB = (
    "SGLang 0.5.23's DFlash and DSpark loaders project through the target's LM head and read no "
    "draft vocabulary (no draft_vocab_size, lm_head or d2t); export it with --format vllm or "
    "--format speculators instead (dflash, dspark), or"
)


def write_sglang(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write config.json and model.safetensors; nothing is left out."""
    refuse_draft_vocab(model, "sglang", _NO_DRAFT_VOCAB, options.checkpoint)
    reason = sglang_refusal(model.config)
    if reason is not None:
        raise ExportRefused(f"cannot export {options.checkpoint} as --format sglang: {reason}")
    model.save_pretrained(str(folder), safe_serialization=True)
    return []
