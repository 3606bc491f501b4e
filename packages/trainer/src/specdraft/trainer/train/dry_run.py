"""`specdraft train --dry-run`: set-up validated without the cluster (the draft built on the
meta device), and the plan it prints: shapes, compile, data order, batch, memory, FLOPs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from specdraft.config import Config, ShapePolicy
from specdraft.config.sampler_mode import SamplerMode, sampler_mode


@dataclass(frozen=True)
class DryRunPlan:
    """What `specdraft train --dry-run` prints."""

    lines: list[str]


def dry_run_plan(config: Config, *, world_size: int) -> DryRunPlan:
    """Validate set-up without the cluster: build the draft on the meta device and plan."""
    from ..models import build_draft, family_of, load_target_config
    from ..models.config import DFlashDraftConfig
    from .flops import plan_line as flops_plan_line

    target_config = load_target_config(config.model.target)
    draft = build_draft(config.model, target_config, dtype=torch.float32, device="meta")
    # Trainable only: a draft vocabulary's head is the target's rows, frozen (counted below).
    params = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    # build_draft made it from a DFlashDraftConfig; the attribute is typed as HF's base class.
    draft_config = cast(DFlashDraftConfig, draft.config)
    training = config.training
    # The dry run's one shape policy: the lines below and the compile plan read it.
    shapes = ShapePolicy.from_config(config)
    plan = shapes.compile_plan(
        compile_blocks=training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )
    # fp32 master weights + fp32 grads + two AdamW moments, sharded over the ranks.
    state_bytes = params * 16 / world_size
    device = "cuda (NCCL)" if torch.cuda.is_available() else "cpu (gloo)"
    text = target_config.get_text_config()
    vocab = int(text.vocab_size)
    hidden = int(text.hidden_size)
    # The draft's logits are as wide as its vocabulary; its own head is frozen rows of the target's.
    logits_width = config.model.draft_vocab_size or vocab
    draft_head = hidden * config.model.draft_vocab_size if config.model.draft_vocab_size else 0
    bs = config.model.block_size
    tokens = training.num_anchors * bs * training.micro_batch_size
    # The largest transient: one chunk of fp32 logits (and its gradient).
    chunk_blocks = min(training.logits_chunk_blocks, training.num_anchors)
    logits_bytes = 2 * chunk_blocks * bs * training.micro_batch_size * logits_width * 4
    dtype_bytes = 2 if device.startswith("cuda") else 4  # bf16 on GPU, fp32 on CPU
    # Tied targets hold one embedding matrix for both (TargetHead shares it).
    target_matrices = 1 if getattr(target_config, "tie_word_embeddings", False) else 2
    frozen_bytes = (target_matrices * vocab * hidden + draft_head) * dtype_bytes
    # Each rank's micro-batch features: [micro, max_length, L*H (+ H for DSpark)].
    width = family_of(config).input_width(hidden, len(config.model.target_layer_ids))
    features_bytes = training.micro_batch_size * config.data.max_length * width * dtype_bytes
    lines = [
        f"config:      {config.run_id} ({config.model.algorithm}, block {bs}, "
        f"{config.model.num_draft_layers} draft layer(s), layers {config.model.target_layer_ids})",
        f"ranks:       {world_size} ({config.deployment.nnodes} node(s) x "
        f"{config.deployment.nproc_per_node}) on {device}",
        f"backend:     {training.backend}, mixed precision {training.mixed_precision}, "
        f"reshard_after_forward={training.reshard_after_forward}",
        f"pad policy:  {shapes.describe_lengths()}",
        f"anchors:     {shapes.describe_anchors()}",
        f"shape grid:  {_grid_line(shapes)}",
        f"compile:     {plan.describe()}",
        f"packing:     {_packing_line(config, shapes)}",
        f"data order:  {_order_line(config)}",
        f"batch:       micro {training.micro_batch_size} x accum {training.grad_accum_steps} x "
        f"{world_size} ranks = {training.micro_batch_size * training.grad_accum_steps * world_size}"
        f" {'rows' if shapes.packing else 'samples'} per optimizer step; {tokens} draft tokens "
        f"per micro-batch",
        f"draft:       {params / 1e6:.1f}M trainable parameters",
        f"vocabulary:  {vocabulary_line(config, vocab)}",
        f"memory/rank: ~{memory(state_bytes)} weights+grads+AdamW (sharded), "
        f"~{memory(frozen_bytes)} frozen embedding+LM head"
        f"{'s' if draft_head else ''}, ~{memory(logits_bytes)} logits "
        f"chunk, ~{memory(features_bytes)} target features per micro-batch",
        f"target:      {in_process_target_line(config, target_config, dtype_bytes)}",
        f"flops:       {flops_plan_line(draft_config, config)}",
        *(
            [f"attention:   {window_line}"]
            if (window_line := attention_line(config, shapes))
            else []
        ),
        f"output:      {config.output_dir}",
    ]
    return DryRunPlan(lines)


def attention_line(config: Config, shapes: ShapePolicy) -> str | None:
    """What the sliding-window layers save at each pad length's longest sample (None: none)."""
    from specdraft.collate.window_savings import draft_attention
    from specdraft.config.attention_layers import layer_windows

    buckets = draft_attention(config, list(shapes.lengths) or [config.data.max_length], shapes)
    if buckets is None:
        return None
    shown = ", ".join("full" if w is None else str(w) for w in layer_windows(config.model))
    saved = ", ".join(f"{b.saved_share:.0%} at {b.length}" for b in buckets)
    return (
        f"windows {shown}: of the keys flex visits (GPU) a full-length sample skips {saved} "
        f"(specdraft explain-buckets: per bucket on the corpus); CPU SDPA scores every key, "
        f"so the window saves no CPU time or memory"
    )


def _order_line(config: Config) -> str:
    """How the sampler orders and groups the samples of an epoch (seeded, same on every rank)."""
    window = f"mega-batches of {config.data.mega_batch_multiplier} micro-batches"
    sync = "bucket-synchronized: every rank draws from one shape bucket per micro-step"
    # One line per sampler mode: the mode already applied the options' precedence.
    lines: dict[SamplerMode, str] = {
        "random": "random (seeded shuffle)",
        "length_grouped": f"length-grouped: shuffled {window}, each sorted by length",
        "anchor_grouped": (
            f"anchor-grouped: shuffled {window}, each sorted by (shape bucket, anchor count), "
            f"optimizer windows shuffled; a micro-batch's rows need similar anchor widths"
        ),
        "bucket_synchronized": sync,
        "length_grouped_bucket_synchronized": (
            f"length-grouped {sync}, its rows cut from shuffled {window}, each sorted by length"
        ),
        "packed": "packed windows: shuffled conversations packed first-fit-decreasing into rows",
    }
    return lines[sampler_mode(config)]


def vocabulary_line(config: Config, target_vocab: int) -> str:
    """The draft's output vocabulary: the target's, or how many of its tokens and how chosen."""
    size = config.model.draft_vocab_size
    if not size:
        return f"the target's {target_vocab:,} tokens (model.draft_vocab_size unset)"
    return (
        f"{size:,} of the target's {target_vocab:,} tokens ({size / target_vocab:.0%}): the "
        f"corpus's most frequent labels, counted when the run starts (a label outside them is "
        f"a miss); coverage per size: specdraft explain-vocab"
    )


def _packing_line(config: Config, shapes: ShapePolicy) -> str:
    """Whether conversations are packed into rows, and what that changes."""
    if not shapes.packing:
        return "off (one conversation per row)"
    return (
        f"on: whole conversations packed into rows of {shapes.row_capacity} tokens "
        f"(first-fit-decreasing, seeded), document-aware attention, "
        f"{config.training.num_anchors} anchors per row shared by its conversations; "
        f"evaluation stays unpacked"
    )


def _grid_line(shapes: ShapePolicy) -> str:
    """The static (length x anchor width) cells, or why there are none."""
    if not shapes.grid:
        return "dynamic (pad to the longest sample, the batch's largest anchor count)"
    cells = ", ".join(f"{length}x{width}" for length, width in shapes.grid)
    return f"{len(shapes.grid)} cell(s) (length x anchors): {cells}"


def memory(num_bytes: float) -> str:
    """A byte count for the plan: GiB, or MiB below a tenth of a GiB (tiny runs stay readable)."""
    if num_bytes >= 2**30 / 10:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def in_process_target_line(config: Config, target_config: Any, dtype_bytes: int) -> str:
    """Where the target runs, and the weight memory it costs each rank when it runs there."""
    if config.deployment.mode == "disaggregated":
        return "on the capture servers (no target weights on the trainer ranks)"
    if config.data.format == "features":
        return "not loaded (offline feature files)"
    try:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            target = AutoModelForCausalLM.from_config(target_config)
        params = sum(p.numel() for p in target.parameters())
    except Exception as exc:  # an architecture transformers cannot build: say so, plan anyway
        return f"in-process on every rank (size unknown: {exc})"
    return (
        f"in-process on every rank for features: {params / 1e6:.1f}M parameters, "
        f"~{memory(params * dtype_bytes)} per rank"
    )
