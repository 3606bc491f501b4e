"""The weights and the batch every side of the peer benchmark loads: written once under build/.

One folder per size: `target/` (a random Qwen3 target, HF layout), `batch.safetensors` (one row)
and per family `<family>/specdraft/` (the draft, `save_pretrained`), `<family>/speculators/` (the
same tensors with speculators' config.json, as `specdraft export --format speculators` writes
it) and `<family>/model.json` (the specdraft `[model]` table that built it). Each side reads
these files and builds its own modules from them, so all sides start from identical weights.

The batch is built so that the peers' objectives can be compared with specdraft's:
- `target_last_hidden_states` have RMS 1 per position, so the target's final RMSNorm (weight 1)
  that speculators applies to them again changes them by 1/sqrt(1 + eps) only;
- every token after the first is the target's greedy token from the previous position, so
  speculators' hard labels (the argmax of the verifier's logits) equal the data tokens that
  specdraft and SpecForge use as labels;
- the anchors are fixed (`anchors`, all kept, each with a full block inside the row and every
  label supervised): every side computes the blocks at the same positions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

FAMILIES = ("dflash", "dflash2", "dspark")
BLOCK_SIZE = 16
GAMMA = 7.0
# Bump when what a fixture holds changes: an older folder is rewritten.
FIXTURE_VERSION = 1


@dataclass(frozen=True)
class Size:
    """One benchmark size: the target's shape and the batch's."""

    name: str
    hidden: int
    intermediate: int
    vocab: int
    length: int
    anchors: int


SIZES = {
    "tiny": Size("tiny", 128, 256, 512, 96, 4),
    "small": Size("small", 256, 768, 8192, 512, 16),
    # bench/flop_bound.py's medium model; one row of 2048 tokens (speculators trains on one
    # packed row, so every side gets the same single row).
    "medium": Size("medium", 512, 1536, 32000, 2048, 32),
}


def model_options(family: str, size: Size, target: Path) -> dict:
    """The specdraft `[model]` table of a family at a size (objectives set to match the peers)."""
    return {
        "target": str(target),
        "algorithm": family,
        "block_size": BLOCK_SIZE,
        "num_draft_layers": 1,
        "target_layer_ids": [0, 2],
        "mask_token_id": size.vocab - 1,
        "dtype": "float32",
        # speculators' selector puts a missing gold token in place of the weakest candidate.
        "dflash2": {"selector_gold_policy": "insert", "selector_loss_weight": 0.1},
        "dspark": {"ce_weight": 0.1, "l1_weight": 0.9, "confidence_weight": 1.0},
    }


def fixture_folder(root: Path, size: Size) -> Path:
    """Where a size's fixture lives."""
    return root / size.name


def write_fixture(root: Path, size: Size, families: tuple[str, ...] = FAMILIES) -> Path:
    """Write (once) the target, the batch and the families' drafts of `size` under `root`.

    A folder of the same size and version is kept; families it lacks are added beside the
    others (the same target and batch).
    """
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder = fixture_folder(root, size)
    stamp = folder / "fixture.json"
    want = {"version": FIXTURE_VERSION, "size": asdict(size), "families": []}
    have = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if {**have, "families": []} != want:
        folder.mkdir(parents=True, exist_ok=True)
        head_weight = write_target(folder / "target", size)
        save_file(make_batch(size, head_weight), str(folder / "batch.safetensors"))
        have = want
    missing = [family for family in families if family not in have["families"]]
    for family in missing:
        write_drafts(folder / family, family, size, folder / "target")
    if missing or have is want:
        want["families"] = sorted({*have["families"], *families})
        stamp.write_text(json.dumps(want, indent=2) + "\n")
    return folder


def write_target(folder: Path, size: Size) -> torch.Tensor:
    """A random Qwen3 target in HF layout; returns its LM head weight."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=4,
        num_attention_heads=size.hidden // 64,
        num_key_value_heads=max(1, size.hidden // 128),
        head_dim=64,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(str(folder))
    return model.lm_head.weight.detach().clone()


def make_batch(size: Size, head_weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One row: features, RMS-1 final states, the target's greedy tokens, fixed anchors."""
    generator = torch.Generator().manual_seed(1)
    length, hidden = size.length, size.hidden
    last = torch.randn(1, length, hidden, generator=generator)
    last = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True))
    greedy = (last @ head_weight.t()).argmax(-1)
    input_ids = torch.empty(1, length, dtype=torch.long)
    input_ids[0, 0] = int(torch.randint(0, size.vocab - 1, (1,), generator=generator))
    input_ids[0, 1:] = greedy[0, :-1]
    # Anchors with a whole block and its last label inside the row (DSpark's slot bs-1
    # predicts anchor + bs), none repeated, ascending as every side sorts them.
    room = length - BLOCK_SIZE - 1
    anchors = torch.randperm(room, generator=generator)[: size.anchors].sort().values
    return {
        "input_ids": input_ids,
        "loss_mask": torch.ones(1, length, dtype=torch.long),
        "hidden_states": torch.randn(1, length, 2 * hidden, generator=generator),
        "target_last_hidden_states": last,
        "sample_id": torch.zeros(1, dtype=torch.long),
        "anchors": anchors[None],
    }


def write_drafts(folder: Path, family: str, size: Size, target: Path) -> None:
    """The family's draft (seeded init) as specdraft and speculators folders, and its options."""
    from specdraft.config.schema import ModelConfig
    from specdraft.trainer.export.options import ExportOptions
    from specdraft.trainer.export.speculators import write_speculators
    from specdraft.trainer.models import build_draft, load_target_config

    options = model_options(family, size, target)
    torch.manual_seed(2)
    draft = build_draft(ModelConfig(**options), load_target_config(target), dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(str(folder / "specdraft"), safe_serialization=True)
    write_speculators(
        draft, folder / "speculators", ExportOptions(checkpoint=str(folder), verifier=str(target))
    )
    (folder / "model.json").write_text(json.dumps(options, indent=2) + "\n")
