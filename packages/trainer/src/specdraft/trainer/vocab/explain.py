"""`specdraft explain-vocab`: what a draft vocabulary of each size covers, before any training.

The vocabulary of size D is the D most frequent supervised labels of the training corpus (as
training chooses it, choice.py); its coverage is the share of supervised labels it holds, on the
training corpus and on the held-out one (data.eval_paths), whose labels the draft never chose
from. A label outside the vocabulary can never be accepted, so held-out coverage bounds every
block position's acceptance from above. The head's cost falls with D: its matmuls, its logits
and (DSpark) the Markov head's output rows are D instead of V wide.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .choice import coverage, ranked_tokens, smallest_covering

# Coverage targets explain-vocab suggests a size for.
SHARES = (0.95, 0.98, 0.99)
# Sizes shown besides the configured one and the suggestions (the peers' usual choices).
DEFAULT_SIZES = (8192, 16384, 32768)
# vLLM pads its head's rows to a multiple of this (lint SD323).
PADDING = 64


def round_up(size: int, multiple: int = PADDING) -> int:
    """`size` rounded up to a multiple of `multiple`."""
    return int(math.ceil(size / multiple) * multiple)


def vocab_report(
    train: np.ndarray,
    held_out: np.ndarray | None,
    *,
    configured: int | None,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    hidden_size: int | None = None,
) -> dict[str, Any]:
    """The coverage table and suggestions as a JSON-ready dict."""
    vocab = int(train.shape[0])
    ranking = ranked_tokens(train)

    def row(size: int, why: str) -> dict[str, Any]:
        ids = ranking[:size]
        out: dict[str, Any] = {"size": size, "why": why, "train": coverage(train, ids)}
        out["held_out"] = None if held_out is None else coverage(held_out, ids)
        if hidden_size is not None:
            out["head_params"] = size * hidden_size
        return out

    suggestions = []
    for share in SHARES:
        basis = held_out if held_out is not None else train
        exact = smallest_covering(basis, share, ranking)
        suggestions.append(
            {
                "share": share,
                "measured_on": "held_out" if held_out is not None else "train",
                "size": exact,
                "size_padded": min(vocab, round_up(exact)),
            }
        )
    wanted: dict[int, str] = {}
    if configured is not None:
        wanted[min(configured, vocab)] = "model.draft_vocab_size"
    for suggestion in suggestions:
        wanted.setdefault(suggestion["size_padded"], f"covers {suggestion['share']:.0%}")
    for size in sizes:
        if size < vocab:
            wanted.setdefault(size, "common size")
    wanted.setdefault(vocab, "full vocabulary")
    return {
        "target_vocab_size": vocab,
        "train_labels": int(train.sum()),
        "train_distinct": int((train > 0).sum()),
        "held_out_labels": None if held_out is None else int(held_out.sum()),
        "held_out_distinct": None if held_out is None else int((held_out > 0).sum()),
        "configured": configured,
        "rows": [row(size, why) for size, why in sorted(wanted.items())],
        "suggestions": suggestions,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def render_vocab_text(report: dict[str, Any], config_path: str) -> str:
    """The report for people: a table of sizes, then the suggestions."""
    lines = [
        f"{config_path}: draft vocabulary (the most frequent supervised labels of the training "
        "corpus)",
        f"  target vocabulary {report['target_vocab_size']:,} tokens; training corpus "
        f"{report['train_labels']:,} supervised labels, {report['train_distinct']:,} distinct",
    ]
    if report["held_out_labels"] is None:
        lines.append("  held-out corpus: none (data.eval_paths is empty): coverage on training")
    else:
        lines.append(
            f"  held-out corpus {report['held_out_labels']:,} supervised labels, "
            f"{report['held_out_distinct']:,} distinct"
        )
    has_params = any("head_params" in row for row in report["rows"])
    header = f"  {'size':>8}  {'train':>8}  {'held-out':>8}"
    header += f"  {'head params':>12}" if has_params else ""
    lines += ["", header + "  why"]
    for row in report["rows"]:
        line = f"  {row['size']:>8,}  {_pct(row['train']):>8}  {_pct(row['held_out']):>8}"
        if has_params:
            line += f"  {row['head_params']:>12,}"
        lines.append(line + f"  {row['why']}")
    lines.append("")
    for suggestion in report["suggestions"]:
        where = "held-out" if suggestion["measured_on"] == "held_out" else "training"
        lines.append(
            f"  covers {suggestion['share']:.0%} of {where} labels: draft_vocab_size = "
            f"{suggestion['size_padded']:,} (exactly {suggestion['size']:,}; a multiple of "
            f"{PADDING}, as vLLM pads the head)"
        )
    lines.append(
        "  a label outside the vocabulary is never accepted: held-out coverage bounds the "
        "acceptance of every block position"
    )
    return "\n".join(lines) + "\n"
