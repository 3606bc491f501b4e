"""TensorBoard: each metrics line's numbers as scalars in event files (`tracking.tensorboard`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Backend, SinkContext


class TensorBoardSink:
    """Scalars through torch's `SummaryWriter` into tracking.tensorboard_dir."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    @classmethod
    def open(cls, context: SinkContext) -> TensorBoardSink:
        """Event files under tracking.tensorboard_dir, else <output_dir>/tensorboard."""
        configured = context.config.tracking.tensorboard_dir
        return cls(Path(configured) if configured else context.output_dir / "tensorboard")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One scalar per metric at `step`."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Nothing: TensorBoard has no run summary (summary.json holds it)."""

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


BACKEND = Backend("tensorboard", TensorBoardSink.open, run_files=("tensorboard",))
