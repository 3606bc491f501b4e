"""Render a resolved config (defaults filled in) as TOML or JSON for `specdraft config show`."""

from __future__ import annotations

import json
from typing import Literal

from .schema import Config
from .shape_policy import ShapePolicy
from .toml_writer import dump_toml


def render_config(config: Config, fmt: Literal["toml", "json"] = "toml") -> str:
    """The whole config with every default filled in; TOML also notes the derived values."""
    data = config.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return dump_toml(data, header=derived_summary(config))


def derived_summary(config: Config) -> str:
    """The values a run derives from the config, one per line."""
    # `config show` is its own (dry) run: its one shape policy.
    shapes = ShapePolicy.from_config(config)
    pad = (
        f"buckets {list(shapes.pad_to)}"
        if isinstance(shapes.pad_to, tuple)
        else f"data.max_length ({shapes.pad_to})"
        if shapes.pad_to
        else "the longest sample of each micro-batch (dynamic shapes)"
    )
    anchors = (
        f"anchor buckets {list(shapes.anchor_buckets)}"
        if shapes.anchor_buckets
        else f"num_anchors ({config.training.num_anchors})"
        if shapes.static
        else f"the batch's largest anchor count (at most {config.training.num_anchors})"
    )
    plan = shapes.compile_plan(
        compile_blocks=config.training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )
    grid = f"{len(shapes.grid)} cell(s)" if shapes.grid else "dynamic"
    return "\n".join(
        [
            "specdraft config, resolved (defaults filled in). Derived values:",
            f"  pad to: {pad}",
            f"  anchor width: {anchors}",
            f"  shape grid: {grid}",
            f"  loss_decay_gamma: {config.loss_decay_gamma}",
            f"  optimizer window: {config.optimizer_window} samples "
            f"({config.deployment.world_size} trainer ranks)",
            f"  compile: {plan.describe()}",
        ]
    )
