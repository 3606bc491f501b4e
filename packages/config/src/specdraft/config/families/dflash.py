"""Plain DFlash, config side: no options of its own, no checks beyond the shared ones."""

from __future__ import annotations

from .base import FamilyRules

RULES = FamilyRules(
    name="dflash",
    title="DFlash",
    summary="the plain DFlash draft SGLang and vLLM serve: the backbone alone, slot k predicts "
    "anchor + k",
    # vLLM's qwen3_dflash maps draft ids through d2t (speculators' DFlash takes t2d/d2t);
    # llama.cpp's dflash.cpp scatters the draft head's logits through d2t (export --format gguf).
    draft_vocab_engines=("vllm", "llama.cpp"),
    architecture="DFlashDraftModel",
    speculators_type="dflash",
)
