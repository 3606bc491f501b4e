"""The `specdraft explain-buckets` report: what each pad policy costs on a corpus, as plain data.

`build_report` returns a JSON-ready dict (see `explain_text` to print it and `histogram` to draw
it). Nothing here builds a model: the report needs only sample lengths and the config.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from specdraft.config import BUCKET_QUANTUM, PadTo, ShapePolicy
from specdraft.config.attention_layers import layer_windows
from specdraft.config.sampler_mode import SamplerMode, bucket_free_mode, sampler_mode

from .accounting import PaddingReport, account_padding, plan_micro_batches
from .anchor_accounting import (
    AnchorReport,
    account_anchors,
    anchor_bucket_cost,
    anchor_weights,
    optimal_anchor_buckets,
)
from .histogram import length_histogram
from .length_source import LengthSource
from .packing_accounting import PackingStats, account_packing
from .samplers import MicroBatch
from .suggest import bucket_cost, grid_weights, optimal_buckets
from .window_savings import draft_attention

if TYPE_CHECKING:
    from specdraft.config import Config

# A bucket used by fewer micro-batches than this share is first met, and compiled, mid-run.
RARE_BUCKET_SHARE = 0.02
# Anchor grouping that saves at least this share of the anchor blocks is worth a warning.
GROUPING_HINT_SHARE = 0.05
# Configured buckets that compute this much more than the optimal ones are worth changing.
WORSE_THAN_SUGGESTION = 1.05


def config_sampler(config: Config, *, with_counts: bool = True) -> SamplerMode:
    """The sampler mode the config's unpacked micro-batches are counted in.

    A packed run's rows are reported in their own section; the unpacked policies beside them are
    counted in the bucket-free order of the same mode (random: packing ignores grouping). Anchor
    grouping needs the samples' anchor counts; without them (`with_counts=False`, e.g. a lengths
    file) the bucket-free mode stands in too.
    """
    mode = sampler_mode(config)
    if mode == "packed" or (mode == "anchor_grouped" and not with_counts):
        return bucket_free_mode(mode)
    return mode


def base_sampler(config: Config) -> SamplerMode:
    """The sampler whose micro-batches do not depend on the buckets (for fair comparisons)."""
    return bucket_free_mode(sampler_mode(config))


def _jsonable(pad_to: PadTo) -> Any:
    return list(pad_to) if isinstance(pad_to, tuple) else pad_to


def _policy_kind(pad_to: PadTo) -> str:
    if pad_to is None:
        return "longest"
    return "fixed" if isinstance(pad_to, int) else "buckets"


def build_report(
    config: Config,
    source: LengthSource,
    *,
    shapes: ShapePolicy,
    config_path: str = "",
    suggest_k: int | None = None,
    suggest_anchors_k: int | None = None,
) -> dict[str, Any]:
    """The whole explain-buckets report as plain, JSON-ready data, for the run's `shapes`."""
    data, training = config.data, config.training
    pad_to = shapes.pad_to
    report: dict[str, Any] = {
        "config": config_path,
        "source": {
            "kind": source.kind,
            "description": source.description,
            "samples": len(source.lengths),
            "skipped": dict(source.skipped),
            "dropped_incomplete": source.dropped_incomplete,
            "truncated_to_max_length": source.truncated,
        },
        "max_length": data.max_length,
        "micro_batch_size": training.micro_batch_size,
        "num_replicas": config.deployment.world_size,
        "seed": training.seed,
        "sampler": config_sampler(config, with_counts=source.anchor_counts is not None),
        "pad_policy": {
            "kind": _policy_kind(pad_to),
            "pad_to": _jsonable(pad_to),
            "description": shapes.describe_lengths(),
            "max_length_appended": shapes.lengths_appended,
            "anchors": shapes.describe_anchors(),
            "anchor_widths": list(shapes.anchor_widths),
            "num_anchors_appended": shapes.anchors_appended,
            "grid": [list(cell) for cell in shapes.grid],
        },
        "buckets": [],
        "policies": [],
        "compile_plan": _compile_section(config, shapes),
        "warnings": [],
        "suggestion": None,
        "anchors": None,
        "packing": None,
        "longest": None,
        "histogram": None,
        "attention": None,
    }
    if shapes.packing:
        report["pad_policy"]["packing"] = True  # unpacked reports keep their exact keys
    if source.kind == "longest":
        _explain_longest(report, config, pad_to, source.lengths[0])
        return report

    lengths = source.lengths
    counts = _capped(config, source.anchor_counts)
    if sampler_mode(config) == "anchor_grouped" and counts is None:
        report["warnings"].append(
            {
                "code": "anchor-grouping-unknown",
                "message": "data.anchor_grouped orders micro-batches by anchor count, which "
                f"needs the loss masks; {source.description} has none, so the micro-batches "
                f"are counted in {base_sampler(config).replace('_', '-')} order; run "
                "explain-buckets on the corpus to see the anchor-grouped plan",
            }
        )
    reports = _policy_reports(config, lengths, pad_to, counts)
    longest_cost = reports["pad-to-longest"].computed_positions
    for name, padding in reports.items():
        report["policies"].append(
            {
                "name": name,
                "pad_to": _jsonable(padding.pad_to),
                "description": ShapePolicy.of(padding.pad_to).describe_lengths(),
                "configured": padding.pad_to == pad_to and not shapes.packing,
                "sampler": padding.sampler,
                "micro_batches": padding.micro_batches,
                "real_tokens": padding.real_tokens,
                "computed_positions": padding.computed_positions,
                "positions_per_real_token": padding.positions_per_real_token,
                "ratio_to_longest": padding.computed_positions / longest_cost,
            }
        )
    configured = next(p for p in reports.values() if p.pad_to == pad_to)
    report["buckets"] = [b.to_dict() for b in configured.per_bucket]
    if shapes.packing:
        packed = _packing_stats(config, shapes, lengths, source.anchor_counts)
        report["packing"] = [
            {**stats.to_dict(), "configured": stats.shapes == shapes} for stats in packed
        ]
        for stats in packed:
            report["policies"].append(
                {
                    "name": stats.name,
                    "pad_to": _jsonable(stats.shapes.pad_to),
                    "description": stats.shapes.describe_lengths(),
                    "configured": stats.shapes == shapes,
                    "sampler": "packed",
                    "micro_batches": stats.micro_batches,
                    "real_tokens": stats.real_tokens,
                    "computed_positions": stats.computed_positions,
                    "positions_per_real_token": stats.positions_per_real_token,
                    "ratio_to_longest": stats.computed_positions / longest_cost,
                }
            )

    comparison = _suggestion_comparison(config, lengths, pad_to)
    if comparison is not None:
        report["warnings"].extend(_bucket_warnings(config, configured, comparison))
    if suggest_k is not None:
        report["suggestion"] = _suggestion(config, lengths, suggest_k, longest_cost, comparison)
    if source.anchor_counts is not None:
        report["anchors"] = _anchor_section(
            config, shapes, lengths, source.anchor_counts, suggest_anchors_k, report["warnings"]
        )
    report["attention"] = _attention_section(config, lengths, shapes)
    edges = list(pad_to) if isinstance(pad_to, tuple) else []
    suggested = report["suggestion"]["buckets"] if report["suggestion"] else []
    report["histogram"] = length_histogram(lengths, data.max_length, edges, suggested)
    return report


def _attention_section(
    config: Config, lengths: list[int], shapes: ShapePolicy
) -> dict[str, Any] | None:
    """What the draft's sliding-window layers save per pad length (None: no layer slides)."""
    buckets = draft_attention(config, lengths, shapes)
    if buckets is None:
        return None
    full = sum(b.full_keys * b.samples for b in buckets)
    windowed = sum(b.windowed_keys * b.samples for b in buckets)
    return {
        "windows": list(layer_windows(config.model)),
        "buckets": [b.to_dict() for b in buckets],
        "saved_share": 1.0 - windowed / full if full else 0.0,
    }


def _packing_stats(
    config: Config, shapes: ShapePolicy, lengths: list[int], counts: list[int] | None
) -> list[PackingStats]:
    """Packing at max_length, and with the configured buckets for the last rows if any."""
    training = config.training
    variants = {
        "packing": ShapePolicy.from_parts(
            static_shapes=True,
            max_length=config.data.max_length,
            num_anchors=training.num_anchors,
            anchor_buckets=training.static_anchor_buckets,
            packing=True,
        )
    }
    if isinstance(shapes.pad_to, tuple):
        variants["packing + buckets"] = shapes
    return [
        account_packing(
            lengths,
            policy,
            micro_batch_size=training.micro_batch_size,
            grad_accum_steps=training.grad_accum_steps,
            num_replicas=config.deployment.world_size,
            seed=training.seed,
            mega_batch_multiplier=config.data.mega_batch_multiplier,
            counts=counts,
            name=name,
        )
        for name, policy in variants.items()
    ]


def _capped(config: Config, counts: list[int] | None) -> list[int] | None:
    """Anchor counts as the run uses them: min(num_anchors, valid anchors)."""
    if counts is None:
        return None
    return [min(config.training.num_anchors, c) for c in counts]


def _policy_reports(
    config: Config, lengths: list[int], pad_to: PadTo, counts: list[int] | None = None
) -> dict[str, PaddingReport]:
    """The three policies on the config's micro-batches, keyed by name."""
    data, training = config.data, config.training
    account = partial(
        account_padding,
        micro_batch_size=training.micro_batch_size,
        seed=training.seed,
        num_replicas=config.deployment.world_size,
        mega_batch_multiplier=data.mega_batch_multiplier,
    )
    # Pad-to-longest and the fixed length cannot be bucket-synchronised: they use the base order.
    base = base_sampler(config)
    reports = {
        "pad-to-longest": account(lengths, pad_to=None, sampler=base),
        "static_shapes": account(lengths, pad_to=data.max_length, sampler=base),
    }
    if isinstance(pad_to, tuple):
        reports["buckets"] = account(
            lengths,
            pad_to=pad_to,
            sampler=config_sampler(config, with_counts=counts is not None),
            anchor_counts=counts,
        )
    return reports


def _suggestion_comparison(
    config: Config, lengths: list[int], pad_to: PadTo
) -> dict[str, Any] | None:
    """The configured buckets against the optimal ones of the same count, on the base sampler."""
    if not isinstance(pad_to, tuple) or config.data.max_length % BUCKET_QUANTUM:
        return None
    weights = _weights(config, lengths)
    best = optimal_buckets(weights, min(len(pad_to), len(weights) - 1))
    return {
        "configured_cost": bucket_cost(pad_to, weights),
        "best": best,
        "best_cost": bucket_cost(best, weights),
    }


def _weights(config: Config, lengths: list[int]) -> list[int]:
    micro_batches = plan_micro_batches(
        lengths,
        micro_batch_size=config.training.micro_batch_size,
        sampler=base_sampler(config),
        seed=config.training.seed,
        mega_batch_multiplier=config.data.mega_batch_multiplier,
    )
    return grid_weights(lengths, micro_batches, config.data.max_length)


def _bucket_warnings(
    config: Config, configured: PaddingReport, comparison: dict[str, Any]
) -> list[dict[str, str]]:
    warnings = []
    compiled = config.training.compile_blocks
    for bucket in configured.per_bucket:
        if bucket.micro_batches == 0:
            warnings.append(
                {
                    "code": "unused-bucket",
                    "message": f"bucket {bucket.length} is used by no micro-batch: drop it from "
                    f"training.static_shape_buckets"
                    + (" (each bucket costs a compile warm-up)" if compiled else ""),
                }
            )
        elif bucket.share < RARE_BUCKET_SHARE:
            what = "its compile" if compiled else "its first use"
            warnings.append(
                {
                    "code": "rare-bucket",
                    "message": f"bucket {bucket.length} takes {bucket.share:.1%} of the "
                    f"micro-batches (< {RARE_BUCKET_SHARE:.0%}): {what} lands mid-run; merge it "
                    f"into a neighbour",
                }
            )
    configured_cost, best_cost = comparison["configured_cost"], comparison["best_cost"]
    if best_cost and configured_cost > WORSE_THAN_SUGGESTION * best_cost:
        best = ", ".join(str(b) for b in comparison["best"])
        warnings.append(
            {
                "code": "worse-than-suggestion",
                "message": f"the configured buckets compute {configured_cost / best_cost:.2f}x "
                f"the positions of the best {len(comparison['best'])} buckets ({best}); "
                f"consider static_shape_buckets = [{best}]",
            }
        )
    return warnings


def _suggestion(
    config: Config,
    lengths: list[int],
    k: int,
    longest_cost: int,
    comparison: dict[str, Any] | None,
) -> dict[str, Any]:
    weights = _weights(config, lengths)
    buckets = optimal_buckets(weights, k)
    cost = bucket_cost(buckets, weights)
    real = sum(lengths)
    suggestion = {
        "k": k,
        "buckets": list(buckets),
        "sampler": base_sampler(config),
        "computed_positions": cost,
        "positions_per_real_token": cost / real,
        "ratio_to_longest": cost / longest_cost,
        "ratio_to_configured": None,
    }
    if comparison is not None:
        suggestion["ratio_to_configured"] = cost / comparison["configured_cost"]
    return suggestion


def _anchor_policy(name: str, report: AnchorReport, configured: bool) -> dict[str, Any]:
    return {
        "name": name,
        "description": report.description,
        "configured": configured,
        "valid_blocks": report.valid_blocks,
        "computed_blocks": report.computed_blocks,
        "occupancy": report.occupancy,
        "blocks_per_valid_anchor": report.blocks_per_valid,
    }


def _anchor_section(
    config: Config,
    shapes: ShapePolicy,
    lengths: list[int],
    counts: list[int],
    suggest_k: int | None,
    warnings: list[dict[str, str]],
) -> dict[str, Any]:
    """The second dimension: anchor occupancy per policy and per grid cell, on the run's batches."""
    training = config.training
    num = training.num_anchors
    capped = _capped(config, counts)

    def plan(sampler: SamplerMode) -> list[MicroBatch]:
        return plan_micro_batches(
            lengths,
            micro_batch_size=training.micro_batch_size,
            sampler=sampler,
            seed=training.seed,
            num_replicas=config.deployment.world_size,
            pad_to=shapes.pad_to,
            mega_batch_multiplier=config.data.mega_batch_multiplier,
            anchor_counts=capped,
        )

    mode = sampler_mode(config)
    micro_batches = plan(config_sampler(config))
    # The other order, for the joint effect: with anchor grouping when the run does not group
    # (and can: bucket-synchronised and packed plans cannot), without it when it does.
    grouped = mode == "anchor_grouped"
    other: list[MicroBatch] | None = None
    if mode in ("random", "length_grouped", "anchor_grouped"):
        other = plan(base_sampler(config) if grouped else "anchor_grouped")
    # The run's own policy, and the two without anchor buckets it is compared with.
    static_lengths = shapes.pad_to or config.data.max_length
    candidates = {
        "pad-to-longest": ShapePolicy(pad_to=None, num_anchors=num),
        "static (num_anchors)": ShapePolicy(pad_to=static_lengths, num_anchors=num),
    }
    if shapes.anchor_buckets:
        candidates["anchor buckets"] = shapes
    configured_name = (
        ""  # packed rows are reported in their own section; these are unpacked micro-batches
        if shapes.packing
        else "anchor buckets"
        if shapes.anchor_buckets
        else "static (num_anchors)"
        if shapes.static
        else "pad-to-longest"
    )
    reports = {
        name: account_anchors(lengths, counts, micro_batches, policy)
        for name, policy in candidates.items()
    }
    configured = account_anchors(lengths, counts, micro_batches, shapes)
    policies = [_anchor_policy(name, r, name == configured_name) for name, r in reports.items()]
    if other is not None:
        suffix = " (not anchor-grouped)" if grouped else " + anchor_grouped"
        for name, policy in candidates.items():
            if name != "static (num_anchors)":  # num_anchors blocks whatever the order
                other_report = account_anchors(lengths, counts, other, policy)
                policies.append(_anchor_policy(name + suffix, other_report, False))
        if not grouped:
            _grouping_hint(policies, configured_name, warnings)
    section: dict[str, Any] = {
        "num_anchors": num,
        "widths": list(shapes.anchor_widths),
        "anchor_grouped": grouped,
        "policies": policies,
        "cells": [cell.to_dict() for cell in configured.cells],
        "suggestion": None,
    }
    for cell in configured.cells:
        where = f"grid cell {cell.length} x {cell.width} anchors"
        if cell.micro_batches == 0:
            warnings.append(
                {
                    "code": "unused-cell",
                    "message": f"{where} is used by no micro-batch"
                    + (" but is compiled at warm-up" if training.compile_blocks else ""),
                }
            )
        elif cell.share < RARE_BUCKET_SHARE:
            warnings.append(
                {
                    "code": "rare-cell",
                    "message": f"{where} takes {cell.share:.1%} of the micro-batches "
                    f"(< {RARE_BUCKET_SHARE:.0%}): its graphs are compiled for little use; "
                    f"merge the anchor bucket or length bucket into a neighbour",
                }
            )
    if suggest_k is not None:
        weights = anchor_weights(counts, micro_batches, num)
        best = optimal_anchor_buckets(weights, num, suggest_k)
        cost = anchor_bucket_cost(best, weights)
        valid = reports["pad-to-longest"].valid_blocks
        section["suggestion"] = {
            "k": suggest_k,
            "anchor_buckets": list(best),
            "computed_blocks": cost,
            "occupancy": valid / cost if cost else 0.0,
            "ratio_to_static": cost / reports["static (num_anchors)"].computed_blocks
            if reports["static (num_anchors)"].computed_blocks
            else 0.0,
            "ratio_to_configured": cost / configured.computed_blocks
            if configured.computed_blocks
            else 0.0,
        }
    return section


def _grouping_hint(
    policies: list[dict[str, Any]], configured_name: str, warnings: list[dict[str, str]]
) -> None:
    """Suggest data.anchor_grouped when it would cut the configured policy's anchor blocks."""
    by_name = {p["name"]: p for p in policies}
    mine = by_name.get(configured_name)
    theirs = by_name.get(configured_name + " + anchor_grouped")
    if not mine or not theirs or not mine["computed_blocks"]:
        return
    saved = 1.0 - theirs["computed_blocks"] / mine["computed_blocks"]
    if saved >= GROUPING_HINT_SHARE:
        warnings.append(
            {
                "code": "anchor-grouping",
                "message": f"data.anchor_grouped = true would compute {saved:.1%} fewer anchor "
                f"blocks under {configured_name} (occupancy {mine['occupancy']:.1%} -> "
                f"{theirs['occupancy']:.1%}): micro-batches of samples with similar anchor "
                "counts need narrower widths",
            }
        )


def _compile_section(config: Config, shapes: ShapePolicy) -> dict[str, Any] | None:
    if not config.training.compile_blocks:
        return None
    plan = shapes.compile_plan(
        compile_blocks=True,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )
    return {
        "description": plan.describe(),
        "dynamic": plan.dynamic,
        "num_shapes": plan.num_shapes,
        "num_widths": plan.num_widths,
        "grid": [list(cell) for cell in shapes.grid],
        "graphs_per_shape": plan.graphs_per_shape,
        "graphs_per_block": plan.graphs_per_block,
        "recompile_limit": plan.recompile_limit,
        "accumulated_recompile_limit": plan.accumulated_recompile_limit,
    }


def _explain_longest(report: dict[str, Any], config: Config, pad_to: PadTo, longest: int) -> None:
    """One micro-batch whose longest sample is `longest`: what each policy pads it to."""
    rows = config.training.micro_batch_size
    policies: list[tuple[str, PadTo]] = [
        ("pad-to-longest", None),
        ("static_shapes", config.data.max_length),
    ]
    if isinstance(pad_to, tuple):
        policies.append(("buckets", pad_to))
    pads_to = ShapePolicy.of(pad_to).pad_length(longest)
    report["longest"] = {"longest": longest, "pads_to": pads_to}
    for name, policy in policies:
        padded = ShapePolicy.of(policy).pad_length(longest)
        report["policies"].append(
            {
                "name": name,
                "pad_to": _jsonable(policy),
                "description": ShapePolicy.of(policy).describe_lengths(),
                "configured": policy == pad_to,
                "pads_to": padded,
                "computed_positions": rows * padded,
                "positions_per_real_token": None,
                "ratio_to_longest": padded / longest,
            }
        )
