"""build_draft: the one place that turns a specdraft ModelConfig into a draft model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdraft.config import ModelConfig

from .backbone import DraftModel
from .config import DFlashDraftConfig, backbone_kwargs, check_backbone
from .family import family_of

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def draft_config_from(
    model_cfg: ModelConfig, target_config: Any, draft_vocab: Sequence[int] | None = None
) -> DFlashDraftConfig:
    """The HF draft config for `model_cfg` (specdraft ModelConfig) and the target's HF config.

    `draft_vocab`: the draft vocabulary's target ids (ascending) when model.draft_vocab_size is
    set; without them the config has the size only (shapes, FLOPs), not the tokens.
    """
    family = family_of(model_cfg)
    backbone = backbone_kwargs(model_cfg, target_config)
    if draft_vocab is not None:
        backbone["draft_vocab_ids"] = [int(token) for token in draft_vocab]
    check_backbone(backbone, model_cfg)
    return family.build_config(model_cfg, backbone)


def build_draft(
    cfg_model: ModelConfig,
    target_config: Any,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    draft_vocab: Sequence[int] | None = None,
) -> DraftModel:
    """A freshly initialised draft for `cfg_model` (specdraft ModelConfig) and the target config.

    `dtype` overrides `cfg_model.dtype` (e.g. float32 for CPU tests); `device="meta"` builds the
    shapes without memory (parameter counts, deferred init). `draft_vocab` as in
    `draft_config_from`; the draft head's rows are then copied from the target's head by
    `DraftModel.init_draft_head`.
    """
    config = draft_config_from(cfg_model, target_config, draft_vocab)
    torch_dtype = dtype or _DTYPES[cfg_model.dtype]
    config.dtype = torch_dtype
    model_class = family_of(cfg_model).model_class
    with torch.device(device) if device is not None else _no_device():
        model = model_class(config)
    return model.to(torch_dtype)


class _no_device:
    """A do-nothing context (torch.device(None) is not a context manager)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
