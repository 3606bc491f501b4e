"""A draft vocabulary in the exports: the engines' d2t / t2d tensors, and who cannot serve it.

specdraft's draft config lists the vocabulary as ascending target ids (`draft_vocab_ids`) and
its `lm_head` holds their rows. vLLM 0.32 (qwen3_dflash, qwen3_dspark) reads `draft_vocab_size`,
the `lm_head` (kept as the draft's own: `has_own_lm_head`) and `d2t` (renamed
`draft_id_to_target_id`; target id = draft id + d2t[draft id]); it skips `t2d`. speculators
0.9.0 (`DraftVocabMixin`) reads `draft_vocab_size`, `lm_head.weight` and both buffers: `d2t` in
the same offset convention and `t2d`, a bool mask over the target vocabulary whose True entries
select the head rows in ascending order. SGLang 0.5.23's DFlash and DSpark loaders project
through the target's head and read no draft vocabulary.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..models.backbone import DraftModel
from ..models.draft_vocab import d2t_offsets, t2d_mask
from .source import ExportRefused

# Keys of specdraft's draft config that no engine reads: the vocabulary travels as tensors.
SPECDRAFT_ONLY_KEYS = ("draft_vocab_ids",)


def draft_vocab_ids(model: DraftModel) -> list[int] | None:
    """The draft vocabulary's target ids, or None for a full-vocabulary draft."""
    return None if model.lm_head is None else list(model.config.draft_vocab_ids)


def refuse_draft_vocab(model: DraftModel, fmt: str, reason: str | None, checkpoint: str) -> None:
    """Refuse `--format fmt` for a draft-vocabulary draft when the engine gives a `reason`."""
    ids = draft_vocab_ids(model)
    if ids is None or reason is None:
        return
    raise ExportRefused(
        f"cannot export {checkpoint} as --format {fmt}: it has a draft vocabulary "
        f"({len(ids)} of {model.config.vocab_size} tokens) and {reason}; retrain without "
        "model.draft_vocab_size to serve it there"
    )


def vocab_tensors(model: DraftModel, *, with_t2d: bool) -> dict[str, Tensor]:
    """`d2t` (and `t2d`) of a draft-vocabulary draft; nothing for a full-vocabulary one."""
    ids = draft_vocab_ids(model)
    if ids is None:
        return {}
    tensors = {"d2t": d2t_offsets(ids)}
    if with_t2d:
        tensors["t2d"] = t2d_mask(ids, model.config.vocab_size)
    return tensors


def without_specdraft_keys(config: dict[str, Any]) -> dict[str, Any]:
    """An engine's config.json without the keys only specdraft reads."""
    return {key: value for key, value in config.items() if key not in SPECDRAFT_ONLY_KEYS}
