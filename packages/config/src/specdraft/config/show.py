"""Render a resolved config (defaults filled in) as TOML or JSON for `specdraft config show`."""

from __future__ import annotations

import json
from typing import Literal

from .buckets import compile_plan, effective_buckets, static_lengths
from .schema import Config
from .toml_writer import dump_toml


def render_config(config: Config, fmt: Literal["toml", "json"] = "toml") -> str:
    """The whole config with every default filled in; TOML also notes the derived values."""
    data = config.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return dump_toml(data, header=derived_summary(config))


def derived_summary(config: Config) -> str:
    """The values a run derives from the config, one per line."""
    buckets = effective_buckets(config)
    lengths = static_lengths(config)
    pad = (
        f"buckets {list(buckets)}"
        if buckets
        else f"data.max_length ({lengths[0]})"
        if lengths
        else "the longest sample of each micro-batch (dynamic shapes)"
    )
    return "\n".join(
        [
            "specdraft config, resolved (defaults filled in). Derived values:",
            f"  pad to: {pad}",
            f"  loss_decay_gamma: {config.loss_decay_gamma}",
            f"  optimizer window: {config.optimizer_window} samples "
            f"({config.deployment.world_size} trainer ranks)",
            f"  compile: {compile_plan(config).describe()}",
        ]
    )
