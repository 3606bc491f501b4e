"""Shared cases for the config tests: a small valid config and ways to find things in its text."""

from __future__ import annotations

# A valid, lint-clean config: every test starts here and changes one thing.
BASE = """\
run_id = "t"

[model]
target = "/nonexistent/specdraft-target"
algorithm = "dflash2"
target_layer_ids = [1, 2]
mask_token_id = 100

[model.dflash2]
selector_gold_policy = "insert"

[data]
train_paths = ["train.jsonl"]
max_length = 2048

[training]
static_shapes = true
static_shape_buckets = [512, 1024, 2048]
"""


def position_of(text: str, needle: str, occurrence: int = 0, after: str = "") -> tuple[int, int]:
    """1-based (line, col) of the start of `needle` in `text` (searching after `after`)."""
    offset = text.index(after) + len(after) - 1 if after else -1
    for _ in range(occurrence + 1):
        offset = text.index(needle, offset + 1)
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def replace_once(text: str, old: str, new: str) -> str:
    """`text` with `old` replaced once; fails loudly if `old` is not there."""
    assert old in text, f"{old!r} not in the base config"
    return text.replace(old, new, 1)
