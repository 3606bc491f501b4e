"""Silence `datasets`' own progress bars (JSON loading, saving) while the pipeline shows its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """Disable `datasets` progress bars inside the block and restore the setting after it."""
    from datasets.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
