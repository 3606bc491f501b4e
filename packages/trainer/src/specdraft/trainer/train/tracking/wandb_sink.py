"""Weights & Biases: each metrics line's numbers logged to a W&B run (`tracking.backends`).

W&B's own environment variables apply as usual: WANDB_MODE=offline keeps the run in
<output_dir>/wandb/offline-run-* for a later `wandb sync`, WANDB_API_KEY / WANDB_ENTITY /
WANDB_RUN_ID and WANDB_RESUME (continue a run across a resume) are read by `wandb.init`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .base import Backend, SinkContext, scalar_metrics


class WandbSink:
    """A W&B run: the config as its config, metrics at the trainer's step, the summary."""

    def __init__(self, run: Any) -> None:
        self._run = run

    @classmethod
    def open(cls, context: SinkContext) -> WandbSink:
        """Start the run (tracking.project, tracking.run_name); files under output_dir/wandb."""
        import wandb

        project = context.config.tracking.project or os.environ.get("WANDB_PROJECT") or "specdraft"
        run = wandb.init(
            project=project,
            name=context.run_name,
            # WANDB_DIR, when set, wins: a cluster may keep W&B's files elsewhere.
            dir=os.environ.get("WANDB_DIR") or str(context.output_dir),
            config=context.params(),
            # specdraft's own logs stay as they are: W&B does not wrap stdout / stderr.
            settings=wandb.Settings(console="off"),
        )
        return cls(run)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log at the trainer's step (train and eval lines of one step land on the same row)."""
        self._run.log(dict(metrics), step=step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The summary's numbers into the run's summary, under `summary/`."""
        numbers = scalar_metrics(summary)
        self._run.summary.update({f"summary/{k}": v for k, v in numbers.items()})

    def close(self) -> None:
        """Finish the run (offline: its folder is complete on disk)."""
        self._run.finish()


BACKEND = Backend("wandb", WandbSink.open, run_files=("wandb",))
