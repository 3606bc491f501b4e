"""The shared DFlash backbone: target features -> context, anchor blocks -> draft hidden states.

    context = norm(fc(concat of target layers))          [B, S, H], once per forward
    blocks  = [token at anchor_b, MASK, ..., MASK]         [B, N, bs], positions anchor_b + k
    hidden  = norm(layers(embed(blocks), context, ...))  [B, N, bs, H]

The draft owns no embedding and, over the full vocabulary, no LM head: both are the target's,
frozen, passed in as a `TargetHead`. With a draft vocabulary (`draft_vocab_size`) the draft owns
`lm_head`, the target head's rows of its tokens (frozen), and the objectives work in draft ids
(draft_vocab.py); `vocab_logits`, `to_draft_labels` and `to_target_ids` hide which case it is.
Module names (`fc`, `hidden_norm`, `layers.N.*`, `norm`, `lm_head`) are those of the DFlash
checkpoints SGLang and vLLM load.

A sliding-window layer (`config.layer_windows()`) gets the same mask cut to its window, and a
causal layer (`config.layer_causal()`) the same mask with its block's later keys cut
(masks.py); the shapes do not change.

A packed batch (with `document_ids`, see documents.py) runs the same graph with per-row
positions: context RoPE from `position_ids`, block positions position_ids[anchor] + k, a mask
that keeps each block inside its anchor's document, and labels cut at the document's end. With
the same anchors a document's blocks then compute what they compute alone. Without
`document_ids` nothing of this runs. Evaluation (`predict_blocks`) is always unpacked.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from specdraft.collate import ANCHOR_WIDTH

from .anchors import sample_anchors
from .config import DFlashDraftConfig
from .documents import DocumentLayout, document_layout
from .draft_vocab import VocabMap, build_vocab_map, to_draft_labels, to_target_ids
from .layers import RMSNorm, rotary_tables
from .losses import DraftLoss, block_targets
from .masks import build_block_mask
from .spec import DraftTrainSpec
from .target import TargetHead
from .target_labels import TARGET_LABELS

REQUIRED_KEYS = ("input_ids", "loss_mask", "hidden_states", "sample_id")


# Batch keys that turn a forward into a prediction (evaluation).
PREDICT_ANCHORS = "predict_anchors"
PREDICT_KEEP = "predict_keep"
# Batch keys that fix the anchors of a training forward instead of sampling them (exactness
# checks, analysis): anchors [B, N] int64 and keep [B, N] bool, as `sample_anchors` returns.
GIVEN_ANCHORS = "given_anchors"
GIVEN_KEEP = "given_keep"


class BlockTargets(NamedTuple):
    """Where the blocks sit and what they should predict (see `losses.block_targets`)."""

    anchors: Tensor  # [B, N]
    keep: Tensor  # [B, N]
    gold: Tensor  # [B, N, bs+1] tokens at anchor + j
    supervised: Tensor  # [B, N, bs+1] loss_mask at anchor + j, inside the sample (and the
    # anchor's document when packed), block kept
    positions: Tensor  # [B, N, bs+1] anchor + j clamped into the sequence


def require_keys(batch: dict[str, Tensor], keys: tuple[str, ...]) -> None:
    """Fail with the missing batch keys named, instead of a bare KeyError deep in the model."""
    missing = [key for key in keys if key not in batch]
    if missing:
        raise KeyError(
            f"the draft batch lacks {missing}; a batch needs {list(keys)} "
            "(see docs/internals.md, 'A sample')"
        )


class DraftModel(PreTrainedModel):
    """Base of the DFlash-family drafts: the backbone; subclasses add heads and an objective."""

    config_class = DFlashDraftConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    # The layer class FSDP / device maps must not split; a family with its own layer names it.
    _no_split_modules: ClassVar[list[str]] = ["DFlashDecoderLayer"]
    # Batch keys a family needs beyond REQUIRED_KEYS (DSpark: target_last_hidden_states).
    extra_batch_keys: tuple[str, ...] = ()

    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        num_features = len(config.target_layer_ids or ())
        if num_features == 0:
            raise ValueError("the draft config needs target_layer_ids (at least one layer)")
        self.fc = nn.Linear(num_features * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            [self.make_layer(config, index) for index in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        # The draft vocabulary's head: the target head's rows of its tokens, frozen (copied in
        # by init_draft_head, then saved with every checkpoint so that an export needs no target).
        self.lm_head: nn.Linear | None = None
        if config.draft_vocab_size is not None:
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
            self.lm_head.weight.requires_grad_(False)
        # VocabMap per device, built from config.draft_vocab_ids on first use (not buffers: FSDP1
        # mixed precision casts every buffer to the compute dtype, which would ruin the ids).
        self._vocab_maps: dict[torch.device, VocabMap] = {}

    def make_layer(self, config: DFlashDraftConfig, index: int) -> nn.Module:
        """One decoder layer of this family."""
        raise NotImplementedError

    @property
    def block_size(self) -> int:
        """Tokens per draft block."""
        return self.config.block_size

    def vocab_map(self, device: torch.device) -> VocabMap | None:
        """The draft vocabulary's id maps on `device`; None over the target's whole vocabulary."""
        if self.lm_head is None:
            return None
        vocab = self._vocab_maps.get(device)
        if vocab is None:
            ids = self.config.draft_vocab_ids
            if ids is None:
                raise ValueError(
                    "this draft has draft_vocab_size but no draft_vocab_ids: build it with "
                    "build_draft(..., draft_vocab=ids) or load it from a checkpoint"
                )
            vocab = self._vocab_maps[device] = build_vocab_map(ids, self.config.vocab_size, device)
        return vocab

    def init_draft_head(self, head: TargetHead) -> None:
        """Copy the target head's rows of the draft vocabulary into `lm_head` (frozen)."""
        if self.lm_head is None:
            return
        ids = self.vocab_map(head.lm_head.weight.device).draft_to_target
        with torch.no_grad():
            rows = head.lm_head.weight.index_select(0, ids)
            self.lm_head.weight.copy_(rows.to(self.lm_head.weight))

    def head_weight(self, head: TargetHead) -> Tensor:
        """The weight [D, H] the draft's logits come from (the target's [V, H] without a draft
        vocabulary)."""
        return head.lm_head.weight if self.lm_head is None else self.lm_head.weight

    def vocab_logits(self, hidden: Tensor, head: TargetHead) -> Tensor:
        """Logits [.., D] over the draft vocabulary (the target's head without one)."""
        if self.lm_head is None:
            return head.logits(hidden)
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))

    def to_draft_labels(self, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Draft ids of target-id `labels` and where they exist (see draft_vocab.py)."""
        return to_draft_labels(labels, self.vocab_map(labels.device))

    def to_target_ids(self, ids: Tensor) -> Tensor:
        """Target ids of draft ids."""
        return to_target_ids(ids, self.vocab_map(ids.device))

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype the layers run in (the fc weight's, which FSDP mixed precision also casts)."""
        return self.fc.weight.dtype

    def encode_context(self, hidden_states: Tensor) -> Tensor:
        """Context features [B, S, H] from concatenated target layers [B, S, L*H]."""
        expected = self.fc.in_features
        if hidden_states.shape[-1] != expected:
            raise ValueError(
                f"hidden_states has last dim {hidden_states.shape[-1]}, the draft expects "
                f"{expected} (= {len(self.config.target_layer_ids)} target layers x "
                f"{self.config.hidden_size}); the features were captured for other "
                "target_layer_ids or another target"
            )
        return self.hidden_norm(self.fc(hidden_states.to(self.compute_dtype)))

    def block_inputs(self, input_ids: Tensor, anchors: Tensor, head: TargetHead) -> Tensor:
        """Embedded blocks [B, N*bs, H]: the anchor token, then block_size-1 mask tokens."""
        batch, num_anchors = anchors.shape
        anchor_tokens = torch.gather(input_ids, 1, anchors)
        tokens = torch.full(
            (batch, num_anchors, self.block_size),
            self.config.mask_token_id,
            dtype=input_ids.dtype,
            device=input_ids.device,
        )
        tokens[:, :, 0] = anchor_tokens
        return head.embed(tokens.flatten(1)).to(self.compute_dtype)

    def run_backbone(
        self,
        input_ids: Tensor,
        hidden_states: Tensor,
        anchors: Tensor,
        keep: Tensor,
        head: TargetHead,
        attention_backend: str,
        layout: DocumentLayout | None = None,
    ) -> Tensor:
        """Draft hidden states [B, N, bs, H] (after the final norm) of the blocks at `anchors`.

        `layout` (a packed batch) gives the per-row positions and the document mask.
        """
        batch, length = input_ids.shape
        num_anchors = anchors.shape[1]
        context = self.encode_context(hidden_states)
        hidden = self.block_inputs(input_ids, anchors, head)
        offsets = torch.arange(self.block_size, device=anchors.device)
        if layout is None:
            positions = (anchors[:, :, None] + offsets).flatten(1)
            context_positions = document_ids = None
        else:
            anchor_positions = layout.position_ids.gather(1, anchors)
            positions = (anchor_positions[:, :, None] + offsets).flatten(1)
            context_positions, document_ids = layout.position_ids, layout.document_ids
        rotary = rotary_tables(
            positions,
            length,
            self.config.head_dim,
            self.config.rope_parameters["rope_theta"],
            self.compute_dtype,
            context_positions,
        )
        # One mask per distinct (window, causality): the layers differ only there.
        shapes = list(zip(self.config.layer_windows(), self.config.layer_causal(), strict=True))
        masks = {
            shape: build_block_mask(
                anchors, keep, length, self.block_size, attention_backend, document_ids, *shape
            )
            for shape in dict.fromkeys(shapes)
        }
        for layer, shape in zip(self.layers, shapes, strict=True):
            hidden = layer(hidden, context, rotary, masks[shape])
        hidden = self.norm(hidden)
        return hidden.view(batch, num_anchors, self.block_size, -1)

    def place_blocks(self, batch: dict[str, Tensor], spec: DraftTrainSpec) -> BlockTargets:
        """Sample the anchors of a batch and read what each block slot should predict.

        A batch carrying `given_anchors` / `given_keep` uses those anchors instead.
        """
        if GIVEN_ANCHORS in batch:
            return self.blocks_at(batch, batch[GIVEN_ANCHORS], batch[GIVEN_KEEP])
        # The collator chose the width on the host (ShapePolicy.anchor_width); batches built by
        # hand without it compute num_anchors blocks, as before anchor widths existed.
        width = int(batch.get(ANCHOR_WIDTH, spec.num_anchors))
        anchors, keep = sample_anchors(
            batch["loss_mask"],
            batch["sample_id"],
            spec.num_anchors,
            spec.seed,
            width,
            document_layout(batch),
        )
        return self.blocks_at(batch, anchors, keep)

    def blocks_at(self, batch: dict[str, Tensor], anchors: Tensor, keep: Tensor) -> BlockTargets:
        """What each slot of the blocks at `anchors` [B, N] (kept where `keep`) should predict.

        A batch carrying `target_labels` (target_labels.py) takes its gold labels from them.
        """
        layout = document_layout(batch)
        gold, supervised, positions = block_targets(
            batch["input_ids"],
            batch["loss_mask"],
            anchors,
            keep,
            self.block_size,
            None if layout is None else layout.document_ids,
            batch.get(TARGET_LABELS),
        )
        return BlockTargets(anchors, keep, gold, supervised, positions)

    def forward_with_anchors(
        self,
        batch: dict[str, Tensor],
        anchors: Tensor,
        keep: Tensor,
        head: TargetHead,
        spec: DraftTrainSpec,
    ) -> DraftLoss:
        """The training forward with the given anchors [B, N] and keep [B, N] (not sampled).

        It goes through `forward` (batch keys `given_anchors` / `given_keep`), so sharding
        hooks run as in training; the exactness checks compare a document packed and alone
        with the same anchors through it.
        """
        return self({**batch, GIVEN_ANCHORS: anchors, GIVEN_KEEP: keep}, head, spec)

    def forward(
        self, batch: dict[str, Tensor], head: TargetHead, spec: DraftTrainSpec
    ) -> DraftLoss | Tensor:
        """Loss sums of one micro-batch (see `DraftLoss`); any pad length gives the same sums.

        A batch carrying `predict_anchors` / `predict_keep` asks for greedy proposals instead
        (`predict_blocks`): evaluation goes through forward so that every backend's sharding
        hooks (FSDP1 only hooks forward) gather the parameters.
        """
        if PREDICT_ANCHORS in batch:
            return self.predict_blocks(
                batch["input_ids"],
                batch["hidden_states"],
                batch[PREDICT_ANCHORS],
                batch[PREDICT_KEEP],
                head,
                spec.attention_backend,
            )
        require_keys(batch, REQUIRED_KEYS + self.extra_batch_keys + spec.label_keys)
        targets = self.place_blocks(batch, spec)
        hidden = self.run_backbone(
            batch["input_ids"],
            batch["hidden_states"],
            targets.anchors,
            targets.keep,
            head,
            spec.attention_backend,
            document_layout(batch),
        )
        return self.objective(hidden, targets, batch, head, spec)

    def objective(
        self,
        hidden: Tensor,
        targets: BlockTargets,
        batch: dict[str, Tensor],
        head: TargetHead,
        spec: DraftTrainSpec,
    ) -> DraftLoss:
        """The family's loss sums from the draft hidden states."""
        raise NotImplementedError

    @torch.no_grad()
    def predict_blocks(
        self,
        input_ids: Tensor,
        hidden_states: Tensor,
        anchors: Tensor,
        keep: Tensor,
        head: TargetHead,
        attention_backend: str = "sdpa",
    ) -> Tensor:
        """Greedy draft tokens [B, N, bs-1] for positions anchor+1..anchor+bs-1 (-1 if not kept)."""
        hidden = self.run_backbone(input_ids, hidden_states, anchors, keep, head, attention_backend)
        anchor_tokens = torch.gather(input_ids, 1, anchors)
        tokens = self.greedy_tokens(hidden, anchor_tokens, head)
        return torch.where(keep[:, :, None], tokens, torch.full_like(tokens, -1))

    def greedy_tokens(self, hidden: Tensor, anchor_tokens: Tensor, head: TargetHead) -> Tensor:
        """The family's greedy tokens [B, N, bs-1] from hidden [B, N, bs, H]."""
        raise NotImplementedError
