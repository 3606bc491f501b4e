"""The explain-layers report for people: the ranking table, the selection, the line to paste."""

from __future__ import annotations

import math
from typing import Any

# Said with every report (text and JSON).
NOTES = (
    "rankings of layers by probes on a small sample match those on far more data in public "
    "work (early-exit losses and next-token probes; speculators RFC 1015), so a few dozen "
    "conversations are enough to rank; the probe is linear and reads one position, the draft "
    "attends over the context and trains: confirm a suggestion with training curves "
    "(`specdraft curves`) before adopting it",
    "the same data, seed and settings give the same ranking and suggestion",
)


def _pct(value: float | None) -> str:
    return "-" if value is None or value != value else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render_layers_text(report: dict[str, Any], config_path: str) -> str:
    """The report as text: setup, table, greedy steps, suggestion, notes and time."""
    offsets = report["offsets"]
    fit, held = report["fit"], report["held_out"]
    weights = " ".join(f"{w:.2f}" for w in report["offset_weights"])
    lines = [
        f"{config_path}: target layers by measurement ({report['target']}: "
        f"{report['num_layers']} decoder layers, hidden {report['hidden_size']})",
        f"  fitted on {fit['conversations']} training conversations ({fit['positions']:,} "
        f"positions), scored on {held['conversations']} held-out ({held['positions']:,} "
        f"positions) from {report['held_out_source']}; seed {report['seed']}",
        "  a draft anchored at j+1 reads the target's features at positions <= j and the anchor "
        "token x(j+1); block slot k predicts x(j+1+k)",
        f"  offsets {' '.join(f'+{d}' for d in offsets)} = slots "
        f"{' '.join(str(s) for s in report['slots'])}, weighted {weights} in the score "
        f"(the draft's loss decay, gamma {report['loss_decay_gamma']:g})",
        f"  probe: ridge from layer l's state at j and the anchor's embedding (at most "
        f"{report['probe']['components']} principal components each, strength by GCV) to the "
        "target's final state at j+d-1, read by its frozen head over the "
        f"{report['vocab']['size']:,} most frequent training labels "
        f"({_pct(report['vocab']['held_out_coverage'])} of held-out labels; the rest count as "
        "misses)",
        "  early exit: the target's own final norm and head on layer l's state at j, against "
        "x(j+1); score: the probe's weighted held-out CE (lower is better)",
        "",
    ]
    header = f"  {'layer':>5}  {'rank':>4}  {'exit CE':>7}  {'acc':>6}"
    for d in offsets:
        header += f"  {f'+{d} CE':>7}  {'acc':>6}"
    lines.append(header + f"  {'score':>6}")
    for row in report["layers"]:
        rank = "-" if row["rank"] is None else str(row["rank"])
        line = f"  {row['layer']:>5}  {rank:>4}  {_num(row['early_exit']['ce']):>7}"
        line += f"  {_pct(row['early_exit']['accuracy']):>6}"
        probe = row["probe"]
        for ce, accuracy in zip(probe["ce"], probe["accuracy"], strict=True):
            line += f"  {_num(ce):>7}  {_pct(accuracy):>6}"
        line += f"  {_num(probe['score']):>6}"
        if not row["tap_allowed"]:
            line += "  last layer (HF's normed final state): not a tap"
        lines.append(line)
    lines += [
        "",
        "  greedy forward selection (each step adds the layer whose concatenation with those "
        "chosen most lowers the joint probe's score):",
    ]
    for number, step in enumerate(report["selection"], start=1):
        lines.append(f"    {number}. layer {step['layer']:>3}  score {_num(step['score'])}")
    lines.append("")
    compared = [("suggested", report["suggested"]), ("configured", report["configured"])]
    compared.append(("depth spread (lint --target)", report["depth_spread"]))
    width = max(len(name) for name, _ in compared)
    for name, entry in compared:
        if entry["layers"] is None:
            continue
        score = entry["score"]
        detail = "not scored: a layer is out of range or the last" if score is None else ""
        if score is not None:
            accuracy = " ".join(_pct(a) for a in entry["accuracy"])
            detail = f"score {_num(score)}, accuracy {accuracy}"
        lines.append(f"  {name:<{width}}  {entry['layers']!s:<24} {detail}")
    lines += [
        "",
        "  paste into [model]:",
        f"    {report['config_line']}",
        "",
    ]
    lines += [f"  note: {note}" for note in report["notes"]]
    seconds = report["seconds"]
    parts = ", ".join(
        f"{name.replace('_', ' ')} {_duration(seconds[name])}"
        for name in ("data", "target_forward", "probes", "selection")
    )
    threads = report["threads"]
    where = f"{threads} CPU thread{'s' if threads != 1 else ''}"
    if report["device"] != "cpu":
        where = report["device"]
    cpu = report["cpu_seconds"]["total"]
    lines.append(
        f"  time: {_duration(seconds['total'])} in all ({parts}) on {where}; "
        f"{_duration(cpu)} of CPU time"
    )
    return "\n".join(lines) + "\n"


def finite(value: float) -> float | None:
    """`value`, or None for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value
