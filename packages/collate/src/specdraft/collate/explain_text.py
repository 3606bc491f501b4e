"""Rendering of the explain-buckets report: text for people, JSON for machines."""

from __future__ import annotations

import json
from typing import Any

from specdraft.config import BUCKET_QUANTUM

from .histogram import render_histogram


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
    if any(skipped.values()):
        reasons = " + ".join(f"{r} {n}" for r, n in sorted(skipped.items()) if n)
        notes.append(f"skipped {sum(skipped.values())} = {reasons}")
    if source["dropped_incomplete"]:
        notes.append(f"{source['dropped_incomplete']} incomplete record(s) dropped")
    if source["truncated_to_max_length"]:
        notes.append(f"{source['truncated_to_max_length']} truncated to max_length")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def _sampler_words(report: dict[str, Any]) -> str:
    words = {
        "random": "random order",
        "length_grouped": "length-grouped order",
        "anchor_grouped": "anchor-grouped order (by shape bucket, then anchor count)",
        "bucket_synchronized": "bucket-synchronised ranks",
        "length_grouped_bucket_synchronized": (
            "bucket-synchronised ranks, rows cut from the length-grouped order"
        ),
    }
    if report.get("packing"):
        # Packed plans shuffle windows of documents into rows; the sampler setting is unused.
        return (
            f"micro_batch_size {report['micro_batch_size']} packed rows, "
            f"{report['num_replicas']} rank(s), shuffled first-fit-decreasing windows "
            f"(seed {report['seed']})"
        )
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
        f"  anchors     {policy['anchors']}"
        + (" (num_anchors appended)" if policy["num_anchors_appended"] else ""),
    ]
    if policy["grid"]:
        cells = ", ".join(f"{length}x{width}" for length, width in policy["grid"])
        lines.append(f"  shape grid  {len(policy['grid'])} cell(s) (length x anchors): {cells}")
    lines.append("")
    if report["longest"] is not None:
        lines += _render_longest(report)
    else:
        lines += _render_corpus(report)
        if report.get("packing"):
            lines += _render_packing(report["packing"])
    if report.get("anchors") is not None:
        lines += _render_anchors(report["anchors"], packed=bool(report.get("packing")))
    if report.get("attention") is not None:
        lines += _render_attention(report["attention"])
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
        lines.append(
            "per bucket (the configured buckets without packing, one epoch)"
            if report.get("packing")
            else "per bucket (the configured policy, one epoch)"
        )
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


def _render_attention(attention: dict[str, Any]) -> list[str]:
    windows = ", ".join("full" if w is None else str(w) for w in attention["windows"])
    lines = [
        f"attention per draft query, summed over the layers (windows: {windows}; anchors "
        "uniform over each sample)",
        f"  {'bucket':>7}  {'samples':>7}  {'full: visible keys':>18}  "
        f"{'windowed':>8}  {'saved':>6}  {'dense SDPA scores/layer':>23}",
    ]
    for b in attention["buckets"]:
        lines.append(
            f"  {b['length']:>7}  {b['samples']:>7}  {b['full_keys_per_query']:>18.1f}  "
            f"{b['windowed_keys_per_query']:>8.1f}  {b['saved_share']:>6.1%}  "
            f"{b['dense_keys_per_query']:>23}"
        )
    lines += [
        f"  the windows skip {attention['saved_share']:.1%} of the keys flex visits (GPU, to its "
        "128-key blocks); dense SDPA (CPU) scores every key, masked or not, so on CPU they save "
        "neither time nor memory",
        "",
    ]
    return lines


def _render_packing(packing: list[dict[str, Any]]) -> list[str]:
    """The packed rows: rows per step, fill, positions per real token, anchors per conversation."""
    lines = ["packed rows (one epoch, all ranks; fill = real tokens / computed positions)"]
    names = [p["name"] + (" (configured)" if p["configured"] else "") for p in packing]
    width = max(len("policy"), *map(len, names))
    with_anchors = any(p["anchors"] for p in packing)
    header = (
        f"  {'policy':<{width}}  {'rows/step':>9}  {'docs/row':>8}  {'fill':>6}  "
        f"{'positions/real token':>20}"
    )
    if with_anchors:
        header += f"  {'anchors/conversation':>20}  {'unpacked':>8}  {'anchor occupancy':>16}"
    lines.append(header)
    for name, p in zip(names, packing, strict=True):
        line = (
            f"  {name:<{width}}  {p['rows_per_optimizer_step']:>9.2f}  "
            f"{p['documents_per_row']:>8.2f}  {p['fill']:>6.1%}  "
            f"{p['positions_per_real_token']:>20.3f}"
        )
        anchors = p["anchors"]
        if anchors:
            line += (
                f"  {anchors['anchors_per_conversation']:>20.1f}  "
                f"{anchors['anchors_per_conversation_unpacked']:>8.1f}  "
                f"{anchors['occupancy']:>16.1%}"
            )
        lines.append(line)
    lines.append("")
    return lines


def _render_anchors(anchors: dict[str, Any], *, packed: bool = False) -> list[str]:
    """The second dimension: anchor occupancy per policy, per grid cell, and the suggestion."""
    lines = [
        "anchor blocks side by side (occupancy = valid blocks / computed blocks"
        + (", without packing)" if packed else ")")
    ]
    names = [p["name"] + (" (configured)" if p["configured"] else "") for p in anchors["policies"]]
    width = max(len("policy"), *map(len, names))
    lines.append(
        f"  {'policy':<{width}}  {'computed blocks':>15}  {'occupancy':>9}  "
        f"{'blocks/valid anchor':>19}"
    )
    for name, p in zip(names, anchors["policies"], strict=True):
        lines.append(
            f"  {name:<{width}}  {p['computed_blocks']:>15}  {p['occupancy']:>9.1%}  "
            f"{p['blocks_per_valid_anchor']:>19.3f}"
        )
    if anchors["cells"]:
        lines.append(
            "per grid cell (without packing, one epoch)"
            if packed
            else "per grid cell (the configured policy, one epoch)"
        )
        lines.append(
            f"  {'length':>7}  {'anchors':>7}  {'micro-batches':>13}  {'share':>6}  "
            f"{'occupancy':>9}"
        )
        for c in anchors["cells"]:
            lines.append(
                f"  {c['length']:>7}  {c['width']:>7}  {c['micro_batches']:>13}  "
                f"{c['share']:>6.1%}  {c['occupancy']:>9.1%}"
            )
    suggestion = anchors["suggestion"]
    if suggestion is not None:
        widths = ", ".join(str(w) for w in suggestion["anchor_buckets"])
        lines.append(
            f"suggested anchor buckets (K = {suggestion['k']}, exact): {widths}: occupancy "
            f"{suggestion['occupancy']:.1%}, {suggestion['ratio_to_static']:.3f}x the blocks of "
            f"num_anchors, {suggestion['ratio_to_configured']:.3f}x the configured policy"
        )
        lines.append(f"  set training.static_anchor_buckets = [{widths}]")
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
