"""Shared by the training tests (offline features, accumulation, resume, export, quickstart): a
tiny run config on the tiny target, written as TOML, and a one-rank process group in this
process that leaves no torch.distributed variables behind for later subprocess tests."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# torch.distributed's environment: a `specdraft train` subprocess that inherited it would try to
# join a group that no longer exists, so tests never leave it behind or pass it on.
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `update` into a copy of `base`."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def tiny_run(target: str | Path, output_dir: str | Path, **sections: Any) -> dict[str, Any]:
    """A small DFlash2 run on the tiny target (block 8, 8 anchors, 128 tokens, two steps)."""
    base = {
        "run_id": "tiny",
        "output_dir": str(output_dir),
        "model": {
            "target": str(target),
            "algorithm": "dflash2",
            "block_size": 8,
            "num_draft_layers": 1,
            "target_layer_ids": [0, 2],
            "mask_token_id": 4095,
            "dtype": "float32",
            "dflash2": {"selector_gold_policy": "insert", "selector_rank": 16, "selector_top_k": 4},
        },
        "data": {"train_paths": ["pkg:sharegpt"], "max_length": 128, "max_samples": 8},
        "training": {
            "micro_batch_size": 2,
            "grad_accum_steps": 1,
            "num_anchors": 8,
            "max_steps": 2,
            "log_interval": 1,
            "learning_rate": 3e-3,
            "warmup_ratio": 0.0,
            "static_shapes": True,
        },
        "tracking": {"progress_bar": False},
    }
    return merge(base, sections)


def write_config(path: Path, data: Mapping[str, Any]) -> Path:
    """Write a config mapping as TOML; returns the path."""
    from specdraft.config.toml_writer import dump_toml

    path.write_text(dump_toml(data))
    return path


@contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread while a tiny model runs: its matmuls are too small to split, and
    threads spinning on two shared cores make it several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def one_rank() -> Iterator[Any]:
    """A one-rank gloo group in this process (FSDP needs one), undone afterwards."""
    from specdraft.trainer.runtime import init_distributed, shutdown_distributed

    saved = {key: os.environ.get(key) for key in DIST_ENV}
    for key in DIST_ENV:
        os.environ.pop(key, None)
    try:
        yield init_distributed()
    finally:
        shutdown_distributed()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fit_run(settings: Mapping[str, Any], **kwargs: Any) -> Any:
    """Build the trainer of a config mapping on one in-process rank, fit it, close its metrics;
    the FitResult (`kwargs` go to build_trainer: resume=, allow_changed=)."""
    from specdraft.config import validate_config
    from specdraft.trainer.train.assembly import build_trainer

    with one_rank() as ctx:
        trainer = build_trainer(validate_config(dict(settings)), ctx, progress=False, **kwargs)
        result = trainer.fit()
        trainer.writer.close()
        return result
