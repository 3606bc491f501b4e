"""Model FLOPs of one draft step, counted from the draft's config and the batch shapes.

Matmul FLOPs only (2 * m * n * k per product; norms, RoPE, softmax, the conv taps and the
selector's pair products are elementwise and left out, as `torch.utils.flop_counter` does).
Per micro-batch of B rows, padded length S and anchor width N (T = N * bs draft tokens a row):

    fc          2 B S (F H) H                                        x2: no input grad (data)
    attention   per layer: q/o 2 * 2 B T H (nh d), k/v 2 * 2 B (T + S) H (nkv d),
                scores + values 4 B nh T (S + T) d (dense, as SDPA computes it)       x3
    mlp         per layer: 3 * 2 B T H I                                              x3
    conv        DFlash2, per layer: 2 * 2 B T H (2 taps H / group)                    x3
    head        the frozen LM head over the slots the objective computes (DFlash and DFlash2:
                bs - 1 per block, DSpark: bs): 2 R H V                      x2: input grad only
    selector    DFlash2 (selector_loss_weight != 0): hidden_projection 2 R H r        x3
    markov      DSpark: markov_w2 2 R r V (+ gate 2 R (H + r) r, or rnn 2 R (2r + H) 3r)  x3
    confidence  DSpark: 2 R (H [+ r])                                                  x3
    target head DSpark with L1 or the confidence head: 2 R H V, under no_grad          x1

The backbone's terms are counted here; a family's own (DFlash2's conv and selector, DSpark's
heads, and which slots the objective computes) come from its folder (`DraftFamily.layer_flops`,
`head_flops`, `supervised_slots` in models/<family>/family.py).

Forward + backward is 3x the forward for trainable parts (the backward computes the input's
and the weight's gradients), 2x where one of the two is not needed (the frozen head's weight,
the features into fc), 1x for the target head. These are *model* FLOPs, what MFU counts.
The step also recomputes work the model FLOPs leave out: the objective's chunks run their
forward again in the backward (activation checkpointing of the logits). `StepFlops.recomputed`
counts that, so `model + recomputed` is what `torch.utils.flop_counter.FlopCounterMode` counts
for a forward+backward with SDPA's math kernel (tested equal). Fused attention kernels also
recompute the score matrix in their backward (5 products where the math kernel has 4); that
is hardware work, in neither count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdraft.collate import ANCHOR_WIDTH

from ..models.config import DFlashDraftConfig
from ..models.draft_vocab import logits_size
from ..models.family import family_of_config
from ..models.family_spec import NO_GRAD, ONE_GRAD, TRAINABLE, DraftFamily
from .peak import Peak, resolve_peak

__all__ = ["NO_GRAD", "ONE_GRAD", "TRAINABLE", "FlopMeter", "Part", "StepFlops"]


@dataclass(frozen=True)
class Part:
    """One term of the count: forward FLOPs and the forward+backward multiplier."""

    forward: int
    multiplier: int
    # Forward FLOPs the backward runs again (checkpointed chunks, SDPA's score recompute).
    recomputed: int = 0

    @property
    def model(self) -> int:
        """Forward + backward model FLOPs of this part."""
        return self.forward * self.multiplier


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one or more micro-batches, by part."""

    parts: Mapping[str, Part] = field(default_factory=dict)

    @property
    def model(self) -> int:
        """Forward + backward model FLOPs (what MFU counts)."""
        return sum(part.model for part in self.parts.values())

    @property
    def forward(self) -> int:
        """Forward FLOPs alone."""
        return sum(part.forward for part in self.parts.values())

    @property
    def recomputed(self) -> int:
        """FLOPs the step runs beyond the model FLOPs (recomputation)."""
        return sum(part.recomputed for part in self.parts.values())

    def __add__(self, other: StepFlops) -> StepFlops:
        names = list(dict.fromkeys([*self.parts, *other.parts]))
        zero = Part(0, 0)
        parts = {}
        for name in names:
            a, b = self.parts.get(name, zero), other.parts.get(name, zero)
            multiplier = a.multiplier or b.multiplier
            parts[name] = Part(a.forward + b.forward, multiplier, a.recomputed + b.recomputed)
        return StepFlops(parts)


def _objective_parts(
    family: DraftFamily, config: DFlashDraftConfig, rows: int, recomputed_rows: int
) -> dict[str, Part]:
    """The head and the family's heads over `rows` slots, `recomputed_rows` of them checkpointed."""

    def forwards(count: int) -> dict[str, tuple[int, int]]:
        out = {"head": (2 * count * config.hidden_size * logits_size(config), ONE_GRAD)}
        out.update(family.head_flops(config, count))
        return out

    # Activation checkpointing runs a chunk's whole forward again in the backward (the target
    # head's no_grad logits included); the last chunk is not checkpointed (losses.chunked_sums).
    again = forwards(recomputed_rows)
    return {
        name: Part(forward, multiplier, again[name][0])
        for name, (forward, multiplier) in forwards(rows).items()
    }


def micro_batch_flops(
    config: DFlashDraftConfig, rows: int, length: int, anchors: int, chunk_blocks: int = 64
) -> StepFlops:
    """FLOPs of one training forward+backward: `rows` x `length` tokens, `anchors` blocks a row.

    `chunk_blocks` (training.logits_chunk_blocks) only sets `recomputed`: the blocks before the
    last chunk run their objective's forward twice.
    """
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    layers, block = config.num_hidden_layers, config.block_size
    features = len(config.target_layer_ids or ())
    context = rows * length
    per_row = anchors * block
    tokens = rows * per_row
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    projections = 2 * 2 * tokens * hidden * q_width + 2 * 2 * (tokens + context) * hidden * kv_width
    scores = 4 * rows * heads * per_row * (length + per_row) * head_dim
    parts: dict[str, Part] = {
        "fc": Part(2 * context * features * hidden * hidden, ONE_GRAD),
        "attention_proj": Part(layers * projections, TRAINABLE),
        "attention_scores": Part(layers * scores, TRAINABLE),
        "mlp": Part(layers * 3 * 2 * tokens * hidden * inter, TRAINABLE),
    }
    family = family_of_config(config)
    for name, (forward, multiplier) in family.layer_flops(config, tokens).items():
        parts[name] = Part(layers * forward, multiplier)
    slots = family.supervised_slots(block)
    checkpointed = (anchors - 1) // chunk_blocks * chunk_blocks
    parts.update(
        _objective_parts(family, config, rows * anchors * slots, rows * checkpointed * slots)
    )
    return StepFlops(parts)


def window_flops(
    config: DFlashDraftConfig, window: Sequence[Mapping[str, Any]], num_anchors: int
) -> StepFlops:
    """FLOPs of one optimizer window: every micro-batch at its own rows, length and anchor width."""
    total = StepFlops()
    for batch in window:
        rows, length = batch["input_ids"].shape[:2]
        anchors = int(batch.get(ANCHOR_WIDTH, num_anchors))
        total = total + micro_batch_flops(config, int(rows), int(length), anchors)
    return total


def draft_config_of(model: Any) -> DFlashDraftConfig | None:
    """The draft's HF config under its wrappers (DDP/FSDP1 `.module`, compile `_orig_mod`)."""
    for _ in range(4):
        config = getattr(model, "config", None)
        if isinstance(config, DFlashDraftConfig):
            return config
        model = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if model is None:
            return None
    return None


class FlopMeter:
    """This rank's model FLOPs of each optimizer step, as `perf/model_tflops_per_s` and `perf/mfu`.

    Per device: the rank's own micro-batches over the step's wall time (`perf/step_ms`), against
    the device's peak (see peak.py). A model without a draft config (test doubles) logs nothing.
    """

    def __init__(self, config: DFlashDraftConfig | None, peak: Peak | None) -> None:
        self.config = config
        self.peak = peak
        self.last = StepFlops()

    @classmethod
    def for_model(
        cls, model: Any, configured_peak: float | None, device: torch.device | str
    ) -> FlopMeter:
        """A meter for a (wrapped) draft on `device`; the peak is resolved now, once."""
        config = draft_config_of(model)
        if config is None:
            return cls(None, None)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        return cls(config, resolve_peak(configured_peak, device, dtype or torch.float32))

    def count(self, window: Sequence[Mapping[str, Any]], num_anchors: int) -> None:
        """Count the FLOPs of the window about to run."""
        if self.config is not None:
            self.last = window_flops(self.config, window, num_anchors)

    def metrics(self, elapsed_s: float) -> dict[str, float]:
        """The step's FLOP rate and MFU over `elapsed_s` seconds (empty without a config)."""
        if self.config is None or elapsed_s <= 0:
            return {}
        tflops = self.last.model / elapsed_s / 1e12
        assert self.peak is not None
        return {
            "perf/model_tflops": self.last.model / 1e12,
            "perf/model_tflops_per_s": tflops,
            "perf/mfu": tflops / self.peak.tflops,
        }


def plan_line(draft_config: DFlashDraftConfig, config: Any) -> str:
    """`specdraft train --dry-run`'s FLOPs line: a full micro-batch, the step, the peak's bound.

    The micro-batch is the largest the config allows (data.max_length, training.num_anchors);
    the peak is this machine's (the dry run plans where it runs).
    """
    training = config.training
    micro = micro_batch_flops(
        draft_config,
        training.micro_batch_size,
        config.data.max_length,
        training.num_anchors,
        training.logits_chunk_blocks,
    )
    step = micro.model * training.grad_accum_steps
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    peak = resolve_peak(config.tracking.peak_tflops, device, dtype)
    bound_ms = step / (peak.tflops * 1e12) * 1e3
    return (
        f"{format_flops(micro.model)} per full micro-batch (forward+backward model FLOPs; "
        f"+{format_flops(micro.recomputed)} recomputed), {format_flops(step)} per step per "
        f"rank; peak {peak.describe()}: >= {bound_ms:.3g} ms per step at 100% MFU"
    )


def format_flops(flops: float) -> str:
    """`4.2 GFLOP`, `1.3 TFLOP`: a FLOP count in the largest unit under it."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"
