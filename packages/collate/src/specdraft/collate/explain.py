"""The `specdraft explain-buckets` report: what each pad policy costs on a corpus, as plain data.

`build_report` returns a JSON-ready dict; `render_text` and `render_json` print it and
`save_plot` draws the length histogram (matplotlib is imported only there). Nothing here builds a
model: the report needs only sample lengths and the config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdraft.config import BUCKET_QUANTUM, compile_plan, max_length_appended

from .accounting import PaddingReport, account_padding, plan_micro_batches
from .lengths import PadTo, describe_pad_to, pad_policy_from_config, resolve_static_length
from .suggest import bucket_cost, grid_weights, optimal_buckets

if TYPE_CHECKING:
    from specdraft.config import Config

# A bucket used by fewer micro-batches than this share is first met, and compiled, mid-run.
RARE_BUCKET_SHARE = 0.02
# Configured buckets that compute this much more than the optimal ones are worth changing.
WORSE_THAN_SUGGESTION = 1.05
HISTOGRAM_MAX_ROWS = 32
HISTOGRAM_BAR_WIDTH = 40


@dataclass
class LengthSource:
    """Where the sample lengths come from, and what was dropped or cut on the way."""

    kind: str  # "corpus" | "lengths_file" | "longest"
    description: str
    lengths: list[int]
    skipped: dict[str, int] = field(default_factory=dict)
    dropped_incomplete: int = 0
    truncated: int = 0  # lengths above max_length cut to it, as training truncates


def read_lengths_file(path: str | Path, max_length: int) -> LengthSource:
    """One positive length per line ('#' comments and blank lines allowed), cut to max_length."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the lengths file: {exc}") from exc
    lengths: list[int] = []
    truncated = 0
    for number, line in enumerate(text.splitlines(), start=1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value <= 0:
            raise ValueError(
                f"{path}:{number}: {item!r} is not a positive integer; the lengths file holds "
                f"one token count per line"
            )
        if value > max_length:
            truncated += 1
            value = max_length
        lengths.append(value)
    if not lengths:
        raise ValueError(f"{path}: no lengths in the file; write one token count per line")
    return LengthSource("lengths_file", path, lengths, truncated=truncated)


def config_sampler(config: Config) -> str:
    """The sampler name of a config, for accounting: bucket sync wins over length grouping."""
    if config.data.bucket_synchronized:
        return "bucket_synchronized"
    return "length_grouped" if config.data.length_grouped else "random"


def base_sampler(config: Config) -> str:
    """The sampler whose micro-batches do not depend on the buckets (for fair comparisons)."""
    return "length_grouped" if config.data.length_grouped else "random"


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
    config_path: str = "",
    suggest_k: int | None = None,
) -> dict[str, Any]:
    """The whole explain-buckets report as plain, JSON-ready data."""
    data, training = config.data, config.training
    pad_to = pad_policy_from_config(config)
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
        "sampler": config_sampler(config),
        "pad_policy": {
            "kind": _policy_kind(pad_to),
            "pad_to": _jsonable(pad_to),
            "description": describe_pad_to(pad_to),
            "max_length_appended": max_length_appended(config),
        },
        "buckets": [],
        "policies": [],
        "compile_plan": _compile_section(config),
        "warnings": [],
        "suggestion": None,
        "longest": None,
        "histogram": None,
    }
    if source.kind == "longest":
        _explain_longest(report, config, pad_to, source.lengths[0])
        return report

    lengths = source.lengths
    reports = _policy_reports(config, lengths, pad_to)
    longest_cost = reports["pad-to-longest"].computed_positions
    for name, padding in reports.items():
        report["policies"].append(
            {
                "name": name,
                "pad_to": _jsonable(padding.pad_to),
                "description": describe_pad_to(padding.pad_to),
                "configured": padding.pad_to == pad_to,
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

    comparison = _suggestion_comparison(config, lengths, pad_to)
    if comparison is not None:
        report["warnings"].extend(_bucket_warnings(config, configured, comparison))
    if suggest_k is not None:
        report["suggestion"] = _suggestion(config, lengths, suggest_k, longest_cost, comparison)
    edges = list(pad_to) if isinstance(pad_to, tuple) else []
    suggested = report["suggestion"]["buckets"] if report["suggestion"] else []
    report["histogram"] = length_histogram(lengths, data.max_length, edges, suggested)
    return report


def _policy_reports(config: Config, lengths: list[int], pad_to: PadTo) -> dict[str, PaddingReport]:
    """The three policies on the config's micro-batches, keyed by name."""
    data, training = config.data, config.training
    common = {
        "micro_batch_size": training.micro_batch_size,
        "seed": training.seed,
        "num_replicas": config.deployment.world_size,
        "mega_batch_multiplier": data.mega_batch_multiplier,
    }
    # Pad-to-longest and the fixed length cannot be bucket-synchronised: they use the base order.
    base = base_sampler(config)
    reports = {
        "pad-to-longest": account_padding(lengths, pad_to=None, sampler=base, **common),
        "static_shapes": account_padding(lengths, pad_to=data.max_length, sampler=base, **common),
    }
    if isinstance(pad_to, tuple):
        reports["buckets"] = account_padding(
            lengths, pad_to=pad_to, sampler=config_sampler(config), **common
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


def _compile_section(config: Config) -> dict[str, Any] | None:
    if not config.training.compile_blocks:
        return None
    plan = compile_plan(config)
    return {
        "description": plan.describe(),
        "dynamic": plan.dynamic,
        "num_shapes": plan.num_shapes,
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
    report["longest"] = {"longest": longest, "pads_to": resolve_static_length(longest, pad_to)}
    for name, policy in policies:
        padded = resolve_static_length(longest, policy)
        report["policies"].append(
            {
                "name": name,
                "pad_to": _jsonable(policy),
                "description": describe_pad_to(policy),
                "configured": policy == pad_to,
                "pads_to": padded,
                "computed_positions": rows * padded,
                "positions_per_real_token": None,
                "ratio_to_longest": padded / longest,
            }
        )


# ------------------------------------------------------------------------------- histogram


def _bin_width(max_length: int, edges: Sequence[int]) -> int:
    """The narrowest multiple of 128 that fits the rows and on which every edge falls."""
    cells = -(-max_length // BUCKET_QUANTUM)
    for factor in range(1, cells + 1):
        width = factor * BUCKET_QUANTUM
        if all(edge % width == 0 for edge in edges) and -(-max_length // width) <= (
            HISTOGRAM_MAX_ROWS
        ):
            return width
    # No width both aligns every edge and fits the rows: keep the edges exact.
    return BUCKET_QUANTUM


def length_histogram(
    lengths: Sequence[int], max_length: int, edges: Sequence[int], suggested: Sequence[int] = ()
) -> dict[str, Any]:
    """Sample counts per length bin, with the bucket edges (configured and suggested)."""
    width = _bin_width(max_length, [*edges, *suggested])
    rows = -(-max_length // width)
    counts = [0] * rows
    for length in lengths:
        counts[min(rows - 1, max(0, (length - 1) // width))] += 1
    return {
        "bin_width": width,
        "bins": [
            {"start": i * width + 1, "end": min((i + 1) * width, max_length), "count": counts[i]}
            for i in range(rows)
        ],
        "edges": list(edges),
        "suggested_edges": list(suggested),
    }


def render_histogram(histogram: dict[str, Any]) -> list[str]:
    """The histogram as terminal lines; a rule after each bin that ends on a bucket edge."""
    bins = histogram["bins"]
    peak = max((b["count"] for b in bins), default=0) or 1
    edges, suggested = set(histogram["edges"]), set(histogram["suggested_edges"])
    label_width = len(f"{bins[-1]['start']}-{bins[-1]['end']}") if bins else 0
    lines = [
        f"length histogram (samples per {histogram['bin_width']} tokens; "
        f"'--- bucket' = configured edge, '... suggested' = suggested edge)"
    ]
    for b in bins:
        label = f"{b['start']}-{b['end']}".rjust(label_width)
        bar = "#" * round(HISTOGRAM_BAR_WIDTH * b["count"] / peak)
        if b["count"] and not bar:
            bar = "."
        lines.append(f"  {label} | {bar.ljust(HISTOGRAM_BAR_WIDTH)} {b['count']}")
        marks = []
        if b["end"] in edges:
            marks.append(f"--- bucket {b['end']}")
        if b["end"] in suggested:
            marks.append(f"... suggested {b['end']}")
        if marks:
            lines.append(f"  {' ' * label_width} +{'  '.join(marks)}")
    return lines


# -------------------------------------------------------------------------------- rendering


def render_json(report: dict[str, Any]) -> str:
    """The report as indented JSON."""
    return json.dumps(report, indent=2)


def _source_line(source: dict[str, Any]) -> str:
    if source["kind"] == "longest":
        return f"{source['description']} (no corpus: one micro-batch)"
    count = source["samples"]
    line = f"{source['description']}: {count} sample{'' if count == 1 else 's'}"
    notes = []
    skipped = source["skipped"]
    if skipped:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items()))
        notes.append(f"skipped {sum(skipped.values())} ({reasons})")
    if source["dropped_incomplete"]:
        notes.append(f"{source['dropped_incomplete']} incomplete record(s) dropped")
    if source["truncated_to_max_length"]:
        notes.append(f"{source['truncated_to_max_length']} truncated to max_length")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def _sampler_words(report: dict[str, Any]) -> str:
    words = {
        "random": "random order",
        "length_grouped": "length-grouped order",
        "bucket_synchronized": "bucket-synchronised ranks",
    }
    return (
        f"micro_batch_size {report['micro_batch_size']}, {report['num_replicas']} rank(s), "
        f"{words[report['sampler']]} (seed {report['seed']})"
    )


def render_text(report: dict[str, Any]) -> str:
    """The report for people: policy, per-bucket table, policies side by side, warnings."""
    policy = report["pad_policy"]
    appended = (
        f" (max_length {report['max_length']} appended)" if policy["max_length_appended"] else ""
    )
    lines = [
        f"explain-buckets: {report['config']}",
        f"  data        {_source_line(report['source'])}",
        f"  batching    {_sampler_words(report)}",
        f"  pad policy  {policy['description']}{appended}",
        "",
    ]
    if report["longest"] is not None:
        lines += _render_longest(report)
    else:
        lines += _render_corpus(report)
    if report["compile_plan"] is not None:
        lines += ["compile plan", f"  {report['compile_plan']['description']}", ""]
    if report["histogram"] is not None:
        lines += [*render_histogram(report["histogram"]), ""]
    if report["warnings"]:
        lines.append("warnings")
        lines += [f"  ! [{w['code']}] {w['message']}" for w in report["warnings"]]
        lines.append("")
    if report["suggestion"] is not None:
        lines += _render_suggestion(report["suggestion"])
    return "\n".join(lines).rstrip() + "\n"


def _render_corpus(report: dict[str, Any]) -> list[str]:
    lines = []
    if report["buckets"]:
        lines.append("per bucket (the configured policy, one epoch)")
        lines.append(
            f"  {'bucket':>7}  {'micro-batches':>13}  {'share':>6}  "
            f"{'mean real tokens/sample':>23}  {'padding':>7}"
        )
        for b in report["buckets"]:
            if not b["micro_batches"]:
                lines.append(f"  {b['length']:>7}  {0:>13}  {0:>6.1%}  {'-':>23}  {'-':>7}")
                continue
            lines.append(
                f"  {b['length']:>7}  {b['micro_batches']:>13}  {b['share']:>6.1%}  "
                f"{b['mean_real_tokens']:>23.1f}  {b['padding_share']:>7.1%}"
            )
        lines.append("")
    lines.append("policies side by side (computed positions = rows x padded length)")
    names = [p["name"] + (" (configured)" if p["configured"] else "") for p in report["policies"]]
    name_width = max(len("policy"), *map(len, names))
    pads_width = max(len("pads to"), *(len(p["description"]) for p in report["policies"]))
    lines.append(
        f"  {'policy':<{name_width}}  {'pads to':<{pads_width}}  {'positions/real token':>20}  "
        f"{'vs longest':>10}"
    )
    for name, p in zip(names, report["policies"], strict=True):
        lines.append(
            f"  {name:<{name_width}}  {p['description']:<{pads_width}}  "
            f"{p['positions_per_real_token']:>20.3f}  {p['ratio_to_longest']:>9.3f}x"
        )
    lines.append("")
    return lines


def _render_longest(report: dict[str, Any]) -> list[str]:
    longest = report["longest"]["longest"]
    lines = [f"one micro-batch whose longest sample has {longest} tokens"]
    lines.append(f"  {'policy':<22}  {'pads to':>8}  {'positions':>10}  {'vs longest':>10}")
    for p in report["policies"]:
        name = p["name"] + (" (configured)" if p["configured"] else "")
        lines.append(
            f"  {name:<22}  {p['pads_to']:>8}  {p['computed_positions']:>10}  "
            f"{p['ratio_to_longest']:>9.3f}x"
        )
    lines.append("")
    return lines


def _render_suggestion(suggestion: dict[str, Any]) -> list[str]:
    buckets = ", ".join(str(b) for b in suggestion["buckets"])
    line = (
        f"  {buckets}: {suggestion['positions_per_real_token']:.3f} positions/real token, "
        f"{suggestion['ratio_to_longest']:.3f}x pad-to-longest"
    )
    if suggestion["ratio_to_configured"] is not None:
        line += f", {suggestion['ratio_to_configured']:.3f}x the configured buckets"
    return [
        f"suggested buckets (k={suggestion['k']}, exact over the {BUCKET_QUANTUM}-token grid, "
        f"{suggestion['sampler'].replace('_', '-')} micro-batches)",
        line,
        f"  static_shape_buckets = [{buckets}]",
    ]


def save_plot(report: dict[str, Any], path: str | Path) -> None:
    """Draw the length histogram with the bucket edges into a PNG file."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes or in CI
    import matplotlib.pyplot as plt

    histogram = report["histogram"]
    if histogram is None:
        raise ValueError("--plot needs sample lengths (a corpus or --lengths), not --longest")
    bins = histogram["bins"]
    figure, axes = plt.subplots(figsize=(9, 4))
    axes.bar(
        [b["start"] - 1 for b in bins],
        [b["count"] for b in bins],
        width=histogram["bin_width"],
        align="edge",
        color="#4c72b0",
        label="samples",
    )
    for i, edge in enumerate(histogram["edges"]):
        axes.axvline(edge, color="#c44e52", label="configured bucket" if i == 0 else None)
    for i, edge in enumerate(histogram["suggested_edges"]):
        axes.axvline(
            edge, color="#55a868", linestyle="--", label="suggested bucket" if i == 0 else None
        )
    axes.set_xlabel("sample length (tokens)")
    axes.set_ylabel("samples")
    axes.set_title(
        f"{report['source']['description']}: lengths at max_length {report['max_length']}"
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
