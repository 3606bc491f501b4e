"""Benchmark sizes: `cpu` (minutes on two cores), `gpu` (the reference note's sizes), `toy`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

TargetKind = Literal["tiny", "qwen3-8b-shaped"]


@dataclass(frozen=True)
class Preset:
    """The sizes of one benchmark setting; everything else comes from the variant and workload."""

    name: str
    target: TargetKind
    max_length: int
    buckets: tuple[int, ...]  # below max_length; max_length is appended as the last bucket
    num_anchors: int
    anchor_buckets: tuple[int, ...]  # below num_anchors; num_anchors is appended
    block_size: int
    num_draft_layers: int
    micro_batch_size: int
    grad_accum_steps: int
    steps: int  # optimizer steps per run
    steady: int  # the last `steady` steps are the measured window
    dtype: str  # draft weights (and features on CPU: fp32, bf16 matmuls are slow there)
    description: str


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        name="cpu",
        target="tiny",
        max_length=1024,
        buckets=(256, 512, 768),
        num_anchors=64,
        # The exact DP of `python bench/anchor_counts.py --suggest 4` on `low-supervision` (1024
        # samples, seed 0): the workload where anchor widths matter (on the others every policy
        # computes ~1.0 block per valid anchor). 16 / 32 sat below most micro-batches' fullest
        # row (docs/benchmarks.md, "Anchor buckets and anchor grouping, counted").
        anchor_buckets=(35, 45, 53),
        block_size=16,
        num_draft_layers=2,
        micro_batch_size=2,
        grad_accum_steps=2,
        steps=10,
        steady=6,
        dtype="float32",
        description="tiny Qwen3 target (hidden 128, vocab 4096), 2-layer draft, max_length 1024",
    ),
    # The context-heavy counterpart of `cpu`: few anchors (8 blocks of 16 = 128 draft tokens per
    # sample) against up to 2048 context positions, so the step is mostly context work and the
    # padding a pad policy adds shows up in the step time instead of hiding behind the fixed
    # per-anchor work (logits) that dominates `cpu`.
    "cpu-context": Preset(
        name="cpu-context",
        target="tiny",
        max_length=2048,
        buckets=(512, 1024, 1536),
        num_anchors=8,
        anchor_buckets=(4,),
        block_size=16,
        num_draft_layers=2,
        micro_batch_size=2,
        grad_accum_steps=2,
        steps=20,
        steady=16,
        dtype="float32",
        description="tiny Qwen3 target, 2-layer draft, max_length 2048, 8 anchors: context-heavy",
    ),
    "gpu": Preset(
        name="gpu",
        target="qwen3-8b-shaped",
        max_length=8192,
        buckets=(1024, 2048, 4096),
        num_anchors=512,
        # As for `cpu`: `anchor_counts.py --preset gpu --workloads low-supervision --suggest 4`.
        anchor_buckets=(286, 369, 435),
        block_size=16,
        num_draft_layers=5,
        micro_batch_size=2,
        grad_accum_steps=4,
        steps=10,
        steady=6,
        dtype="bfloat16",
        description="Qwen3-8B-shaped target (random frozen embedding and LM head, synthetic "
        "features), 5-layer draft, max_length 8192",
    ),
    "toy": Preset(
        name="toy",
        target="tiny",
        max_length=256,
        buckets=(128,),
        num_anchors=8,
        anchor_buckets=(4,),
        block_size=8,
        num_draft_layers=1,
        micro_batch_size=2,
        grad_accum_steps=1,
        steps=2,
        steady=1,
        dtype="float32",
        description="tiny Qwen3 target, 1-layer draft, max_length 256 (smoke tests)",
    ),
}


@dataclass(frozen=True)
class TargetFacts:
    """What a config needs to know about the target folder."""

    path: str
    layer_ids: tuple[int, ...]
    mask_token_id: int
    vocab_size: int


def base_config(
    preset: Preset, algorithm: str, target: TargetFacts, *, seed: int, output_dir: str
) -> dict[str, Any]:
    """The config shared by every variant of a preset (pad-to-longest FSDP2, no compile)."""
    model: dict[str, Any] = {
        "target": target.path,
        "algorithm": algorithm,
        "block_size": preset.block_size,
        "num_draft_layers": preset.num_draft_layers,
        "target_layer_ids": list(target.layer_ids),
        "mask_token_id": target.mask_token_id,
        "dtype": preset.dtype,
    }
    if algorithm == "dflash2":
        model["dflash2"] = {"selector_gold_policy": "insert"}
    return {
        "run_id": "bench",
        "output_dir": output_dir,
        "model": model,
        "data": {
            "train_paths": ["pkg:sharegpt"],
            "max_length": preset.max_length,
            "bad_rows": "skip",
        },
        "training": {
            "backend": "fsdp2",
            "micro_batch_size": preset.micro_batch_size,
            "grad_accum_steps": preset.grad_accum_steps,
            "num_anchors": preset.num_anchors,
            "max_steps": preset.steps,
            # A constant rate: the schedule is not what is measured.
            "lr_scheduler": "constant",
            "warmup_ratio": 0.0,
            "learning_rate": 3e-4,
            "log_interval": 1,
            # Checkpoints are not what is measured either; the child skips the final one.
            "save_interval": 1_000_000,
            "seed": seed,
        },
        "tracking": {"progress_bar": False},
    }


def with_anchor_buckets(preset: Preset, text: str) -> Preset:
    """The preset with the anchor widths of a `--anchor-buckets A,B,...` option.

    Raises ValueError naming the option when the widths are not strictly increasing counts in
    1..num_anchors; num_anchors itself is dropped (the config always appends it)."""
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--anchor-buckets {text!r}: expected integers, e.g. 35,45") from None
    if any(not 0 < w <= preset.num_anchors for w in widths) or list(widths) != sorted(set(widths)):
        raise ValueError(
            f"--anchor-buckets {text}: strictly increasing counts in "
            f"1..num_anchors ({preset.num_anchors}) expected"
        )
    kept = tuple(w for w in widths if w != preset.num_anchors)
    return dataclasses.replace(preset, anchor_buckets=kept)
