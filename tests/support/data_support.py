"""Shared checks of the data tests: the supervised spans of a sample, decoded, against the
assistant turns they should hold."""

from __future__ import annotations

import itertools
import unicodedata


def masked_runs(tokenizer, input_ids, loss_mask) -> list[str]:
    """Decode each maximal run of supervised tokens."""
    runs = []
    pairs = zip(input_ids, loss_mask, strict=True)
    for supervised, group in itertools.groupby(pairs, key=lambda p: bool(p[1])):
        if supervised:
            runs.append(tokenizer.decode([i for i, _ in group]))
    return runs


def assistant_turns(messages, end_of_turn: str = "<|im_end|>") -> list[str]:
    """What the supervised runs must be: each assistant content and its end-of-turn token."""
    return [
        unicodedata.normalize("NFC", m["content"]) + end_of_turn
        for m in messages
        if m["role"] == "assistant"
    ]
