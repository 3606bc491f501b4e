"""The environment every trainer rank inherits, set by the process that launches them."""

from __future__ import annotations

import os


def launch_environment_defaults() -> None:
    """Environment every rank inherits: offline hub, quiet tokenizers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
