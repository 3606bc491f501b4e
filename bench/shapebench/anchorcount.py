"""The counted part of the anchor benchmark: positions and anchor blocks, no training, no timing.

Each workload's samples and loss masks are the ones a benchmark run trains on (synthetic rows, or
ShareGPT tokenised and masked by `build_dataset`); its micro-batches come from the run's own
`sampler_from_config` and `ShapePolicy.from_config`, built from the same config the harness writes
for the variant. Every number is an exact count, so a loaded machine does not change it.

Per length stack (static, buckets) four anchor policies run over the same micro-batches:
num_anchors, the preset's anchor buckets, the exact-DP suggestion with K widths from these
micro-batches (`optimal_anchor_buckets`, as `explain-buckets --suggest-anchors K`), and the exact
width (each micro-batch's largest per-sample anchor count: what pad-to-longest computes, the floor
no width beats for these micro-batches). Every stack is counted twice: in the random order and in
anchor-grouped order (`data.anchor_grouped`), whose micro-batches pair samples of similar anchor
counts, so the exact width comes close to one block per valid anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import EMPTY_BLOCKS_TARGET, empty_share_removed, removable_share_removed
from .presets import Preset, TargetFacts
from .runner import BenchSettings, PlannedRun, run_config
from .variants import BY_KEY
from .workloads import is_synthetic, synthetic_rows, synthetic_samples

# The length stacks counted, as harness variant keys (their anchor-bucket rows are added here).
STACKS = ("static", "buckets")
# Suffix of a stack counted in anchor-grouped order (data.anchor_grouped).
GROUPED = "+grouped"


@dataclass(frozen=True)
class PolicyCount:
    """What one (length stack, anchor policy) computes on a workload's micro-batches."""

    stack: str
    policy: str
    widths: tuple[int, ...]  # () = exact width per micro-batch
    computed_positions: int
    real_tokens: int
    computed_blocks: int
    valid_blocks: int

    @property
    def positions_per_real_token(self) -> float:
        """Computed positions per real token."""
        return self.computed_positions / self.real_tokens if self.real_tokens else 0.0

    @property
    def blocks_per_valid(self) -> float:
        """Computed anchor blocks per valid anchor (1.0 = no empty block)."""
        return self.computed_blocks / self.valid_blocks if self.valid_blocks else 0.0


def count_blocks(
    counts: Sequence[int],
    micro_batches: Sequence[Sequence[int]],
    num_anchors: int,
    widths: Sequence[int] | None,
) -> tuple[int, int]:
    """(computed, valid) anchor blocks; widths None = exact width (the batch's largest count)."""
    computed = valid = 0
    for batch in micro_batches:
        if not batch:
            continue
        per_sample = [min(num_anchors, counts[i]) for i in batch]
        # Never below 1: a batch without an anchor still runs one masked block.
        need = max(1, max(per_sample))
        width = need if widths is None else next(w for w in widths if w >= need)
        computed += len(batch) * width
        valid += sum(per_sample)
    return computed, valid


def workload_samples(
    settings: BenchSettings, workload: str, target: TargetFacts, num_samples: int
) -> tuple[list[int], list[int]]:
    """(lengths, valid anchor counts) of the samples a run of `workload` trains on."""
    import torch

    from specdraft.collate import anchor_counts

    if is_synthetic(workload):
        samples = synthetic_samples(
            workload,
            max_length=settings.preset.max_length,
            count=num_samples,
            seed=settings.seed,
        )
        rows = synthetic_rows(samples, vocab_bound=target.vocab_size, seed=settings.seed)
        lengths = [sample.length for sample in samples]
    else:
        from specdraft.config import validate_config
        from specdraft.trainer.data import build_dataset, sample_lengths

        run = PlannedRun(workload, "dspark", BY_KEY["fsdp2"], settings.work_dir / "count")
        raw = run_config(settings, run, target)
        raw["data"]["max_samples"] = num_samples
        rows, _ = build_dataset(validate_config(raw), split="train", progress=False)
        lengths = sample_lengths(rows)
    counts = [
        anchor_counts(torch.as_tensor(rows[i]["loss_mask"], dtype=torch.long)[None])[0]
        for i in range(len(lengths))
    ]
    return lengths, counts


def count_workload(
    settings: BenchSettings,
    workload: str,
    target: TargetFacts,
    *,
    lengths: Sequence[int],
    counts: Sequence[int],
    suggest_k: Sequence[int],
) -> list[PolicyCount]:
    """Per stack (pad-to-longest, static, buckets; each in random and anchor-grouped order):
    num_anchors, preset, suggested and exact widths."""
    from specdraft.collate import sampler_from_config
    from specdraft.collate.anchor_accounting import anchor_weights, optimal_anchor_buckets
    from specdraft.config import ShapePolicy, validate_config

    preset: Preset = settings.preset
    num = preset.num_anchors
    out = []
    for grouped in (False, True):
        for key in ("fsdp2", *STACKS):
            run = PlannedRun(workload, "dspark", BY_KEY[key], settings.work_dir / "count")
            raw = run_config(settings, run, target)
            raw["data"]["anchor_grouped"] = grouped
            config = validate_config(raw)
            shapes = ShapePolicy.from_config(config)
            sampler = sampler_from_config(
                config,
                list(lengths),
                num_replicas=settings.ranks,
                rank=0,
                shapes=shapes,
                anchor_counts=list(counts),
            )
            micro_batches = [b for rank in sampler.epoch_plan(0) for b in rank if b]
            positions = sum(
                len(b) * shapes.pad_length(max(lengths[i] for i in b)) for b in micro_batches
            )
            real = sum(lengths[i] for b in micro_batches for i in b)
            if key == "fsdp2":
                policies: list[tuple[str, tuple[int, ...] | None]] = [
                    ("exact (pad to longest)", None)
                ]
            else:
                # The DP of `explain-buckets --suggest-anchors K`, on these very micro-batches.
                weights = anchor_weights(counts, micro_batches, num)
                policies = [
                    # num_anchors blocks whatever the order: counted once, in random order.
                    *([] if grouped else [("num_anchors", (num,))]),
                    ("preset anchor buckets", (*preset.anchor_buckets, num)),
                    *(
                        (
                            f"suggested anchor buckets (K = {k})",
                            optimal_anchor_buckets(weights, num, k),
                        )
                        for k in suggest_k
                    ),
                    ("exact width", None),
                ]
            stack = key + (GROUPED if grouped else "")
            for name, widths in policies:
                computed, valid = count_blocks(counts, micro_batches, num, widths)
                out.append(PolicyCount(stack, name, widths or (), positions, real, computed, valid))
    return out


def check_lines(workload: str, rows: Sequence[PolicyCount]) -> list[str]:
    """The >= 90% target per anchor-bucket row, against the same length stack at num_anchors.

    Judged two ways: on the *removable* empty blocks (down to the exact width of the row's own
    micro-batches: a width must hold the fullest row) and, as the target is worded, on *all* empty
    blocks. Random pairs leave most empty blocks unremovable; anchor-grouped order
    (data.anchor_grouped) brings the exact width close to one block per valid anchor.
    """
    lines = []
    for base in STACKS:
        plain = next(r for r in rows if r.stack == base and r.policy == "num_anchors")
        for stack in (base, base + GROUPED):
            by_policy = {r.policy: r for r in rows if r.stack == stack}
            if not by_policy:
                continue
            exact = by_policy["exact width"]
            for name, row in by_policy.items():
                if name not in ("num_anchors", "exact width"):
                    lines.append(_check_line(workload, stack, name, row, plain, exact))
    return lines


def _verdict(share: float | None) -> str:
    if share is None:
        return "nothing to remove"
    if share >= EMPTY_BLOCKS_TARGET:
        return "met"
    return f"missed by {100 * (EMPTY_BLOCKS_TARGET - share):.1f} pts"


def _check_line(
    workload: str,
    stack: str,
    name: str,
    row: PolicyCount,
    plain: PolicyCount,
    exact: PolicyCount,
) -> str:
    share = removable_share_removed(
        plain.computed_blocks, row.computed_blocks, exact.computed_blocks
    )
    raw = empty_share_removed(plain.blocks_per_valid, row.blocks_per_valid)
    removable = (
        "no removable empty block"
        if share is None
        else f"{100 * share:.1f}% of the removable empty blocks removed ("
        f"{plain.computed_blocks - exact.computed_blocks} of {plain.computed_blocks} "
        "computed blocks removable)"
    )
    widths = "/".join(str(w) for w in row.widths)
    target = f"{100 * EMPTY_BLOCKS_TARGET:.0f}%"
    return (
        f"{workload} / {stack_label(stack)} + {name} ({widths}): blocks per valid anchor "
        f"{plain.blocks_per_valid:.3f} (num_anchors, random order) -> "
        f"{row.blocks_per_valid:.3f} (exact width {exact.blocks_per_valid:.3f}): {removable}, "
        f"{100 * (raw or 0.0):.1f}% of all empty blocks; target (>= {target} of the removable): "
        f"{_verdict(share)}; as worded (>= {target} of all empty blocks): {_verdict(raw)}"
    )


def stack_label(stack: str) -> str:
    """A stack key as the tables name it."""
    base, grouped, _ = stack.partition(GROUPED)
    name = {"fsdp2": "pad to longest", "static": "static", "buckets": "buckets"}[base]
    return name + (", anchor-grouped" if grouped else "")


def count_table(rows: Sequence[PolicyCount]) -> str:
    """A markdown table of one workload's counts."""
    lines = [
        "| length stack | anchor policy | widths | computed positions per real token "
        "| computed anchor blocks per valid anchor | anchor occupancy |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        widths = "/".join(str(w) for w in r.widths) if r.widths else "per batch"
        occupancy = r.valid_blocks / r.computed_blocks if r.computed_blocks else 0.0
        lines.append(
            f"| {stack_label(r.stack)} | {r.policy} | {widths} | "
            f"{r.positions_per_real_token:.3f} | {r.blocks_per_valid:.3f} | {occupancy:.1%} |"
        )
    return "\n".join(lines)


def to_json(rows: Sequence[PolicyCount]) -> list[dict[str, Any]]:
    """Plain data for counts.json."""
    return [
        {
            "stack": r.stack,
            "policy": r.policy,
            "widths": list(r.widths),
            "computed_positions": r.computed_positions,
            "real_tokens": r.real_tokens,
            "computed_blocks": r.computed_blocks,
            "valid_blocks": r.valid_blocks,
        }
        for r in rows
    ]


def default_work_dir(preset: Preset) -> Path:
    """Where counting configs point their (never written) output folders."""
    from .runner import REPO_ROOT

    return REPO_ROOT / "build" / "bench" / preset.name / "count"
