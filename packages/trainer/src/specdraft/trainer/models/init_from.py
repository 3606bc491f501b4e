"""`model.init_from`: a draft starts from the weights of an exported or published draft folder.

The exports (export/sglang.py, vllm.py, speculators.py) keep specdraft's tensor names; what
they add or leave out is undone here: the engines' `d2t` / `t2d` become the draft vocabulary's
target ids again, and an `embed_tokens` or a full-vocabulary `lm_head` (the target's, which
some published folders carry) stay the target's. A prefix `model.` (vLLM's in-memory names)
is dropped. Every other tensor of the folder must be a parameter of the draft, and every
parameter of the draft must be in the folder: nothing is dropped or left fresh in silence.

The sha256 of the folder's safetensors joins the run fingerprint (the resume contract), so a
resume with other weights under the same path is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from specdraft.config import ModelConfig
from specdraft.config.draft_folder import DraftFolder, DraftFolderError, read_draft_folder
from specdraft.config.init_from_rules import init_from_refusals
from specdraft.config.target_info import TargetUnreadable, read_target_info

from .backbone import DraftModel

log = logging.getLogger(__name__)

# Tensors that carry the draft vocabulary's ids in the engines' formats (draft_vocab.py).
VOCAB_TENSORS = ("d2t", "t2d")
# Shared with the target: the target's own weights are used, never the folder's copy.
SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")
_PREFIX = "model."
_CHUNK = 1 << 22


class InitFromError(ValueError):
    """model.init_from cannot start this run (a missing folder, a disagreeing field, a tensor
    that does not fit)."""


@dataclass(frozen=True)
class InitWeights:
    """A draft folder's weights in specdraft's names, ready to load into a fresh draft."""

    folder: DraftFolder
    tensors: dict[str, Tensor]
    # The draft vocabulary's target ids (ascending), or None over the whole vocabulary.
    draft_vocab_ids: list[int] | None
    # "sha256:<hex>" of the folder's safetensors files: the run fingerprint's entry.
    sha256: str


def read_init_weights(model_cfg: ModelConfig) -> InitWeights:
    """Read model.init_from: refuse what disagrees with the config or the target, map names."""
    path = model_cfg.init_from
    if path is None:
        raise InitFromError("model.init_from is not set")
    try:
        folder = read_draft_folder(path)
    except DraftFolderError as exc:
        raise InitFromError(str(exc)) from None
    try:
        info = read_target_info(model_cfg.target)
    except TargetUnreadable:
        info = None  # the target's own loader says why, with its path
    refusals = init_from_refusals(model_cfg, folder, info)
    if refusals:
        raise InitFromError(f"cannot start from {folder.described}:\n  " + "\n  ".join(refusals))
    raw: dict[str, Tensor] = {}
    for name in folder.weight_files:
        raw.update(load_file(str(Path(folder.path) / name)))
    tensors = map_names_back(raw)
    ids = vocab_ids(folder, tensors)
    tensors = {name: t for name, t in tensors.items() if name not in VOCAB_TENSORS}
    return InitWeights(folder, tensors, ids, weights_sha256(folder))


def map_names_back(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A folder's tensors under specdraft's names (the inverse of the exports' renaming)."""
    return {name.removeprefix(_PREFIX): tensor for name, tensor in tensors.items()}


def vocab_ids(folder: DraftFolder, tensors: dict[str, Tensor]) -> list[int] | None:
    """The draft vocabulary's target ids: the config's own list (sglang layout, checkpoints),
    else speculators' `t2d` mask, else vLLM's `d2t` offsets; None without one."""
    if folder.draft_vocab_size is None:
        return None
    raw = json.loads((Path(folder.path) / "config.json").read_text())
    if raw.get("draft_vocab_ids") is not None:
        ids = [int(token) for token in raw["draft_vocab_ids"]]
    elif "t2d" in tensors:
        ids = tensors["t2d"].nonzero().flatten().tolist()
    elif "d2t" in tensors:
        d2t = tensors["d2t"].to(torch.int64)
        ids = (torch.arange(d2t.numel()) + d2t).tolist()
    else:
        raise InitFromError(
            f"{folder.described} has draft_vocab_size {folder.draft_vocab_size} but neither "
            "draft_vocab_ids nor a d2t / t2d tensor: its head rows cannot be mapped to tokens"
        )
    if len(ids) != folder.draft_vocab_size:
        raise InitFromError(
            f"{folder.described}: its draft vocabulary lists {len(ids)} tokens but "
            f"draft_vocab_size is {folder.draft_vocab_size}"
        )
    return ids


def weights_sha256(folder: DraftFolder) -> str:
    """sha256 over the folder's safetensors files (names and contents, in name order)."""
    digest = hashlib.sha256()
    for name in folder.weight_files:
        digest.update(name.encode() + b"\0")
        with (Path(folder.path) / name).open("rb") as handle:
            while block := handle.read(_CHUNK):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def load_init_weights(draft: DraftModel, weights: InitWeights) -> None:
    """Copy the folder's weights into a freshly built draft (its head stays the target's)."""
    own = draft.state_dict()
    # The draft-vocabulary head holds the target head's rows (init_draft_head), and a
    # full-vocabulary draft has none: either way the target's weights, not the folder's copy.
    skipped = [name for name in weights.tensors if _shared(name)]
    loaded = {name: t for name, t in weights.tensors.items() if name not in skipped}
    missing = sorted(name for name in own if name not in loaded and not _shared(name))
    unexpected = sorted(name for name in loaded if name not in own)
    if missing or unexpected:
        raise InitFromError(
            f"the weights of {weights.folder.described} do not fit the draft: missing "
            f"{missing[:6]}, not a draft parameter {unexpected[:6]}; start from the sglang "
            "export of the checkpoint (`specdraft export --format sglang`), which has them all"
        )
    for name, tensor in loaded.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise InitFromError(
                f"{weights.folder.described}: {name} has shape {list(tensor.shape)}, the draft "
                f"{list(own[name].shape)}"
            )
    with torch.no_grad():
        for name, tensor in loaded.items():
            own[name].copy_(tensor.to(own[name].dtype))
    if skipped:
        log.info("model.init_from: kept the target's %s (the folder's copy is not used)", skipped)
    log.info("model.init_from: started from %s (%s)", weights.folder.described, weights.sha256[:19])


def _shared(name: str) -> bool:
    """A tensor that is the target's: the embedding, and the LM head in any case."""
    return name in SHARED_WITH_TARGET
