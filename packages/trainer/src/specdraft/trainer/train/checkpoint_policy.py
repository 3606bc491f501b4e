"""When the trainer saves, what it keeps, and when it stops: the checkpoint policy of a run.

- A save that fails (a full disk, an I/O error) is logged in one line and the run goes on to the
  next save; a second failure in a row stops the run cleanly, after checking that the last good
  checkpoint still verifies (so the message can say what a resume gets).
- After each successful save the old checkpoints beyond `training.keep_last_checkpoints` are
  removed, except every `training.keep_every_n_steps`-th one and the one this run resumed from.
- A stop signal (train/preempt.py) that every rank agreed on at a step boundary makes the
  trainer save that step and return.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .checkpoint import STEP_PREFIX, TMP_PREFIX, checkpoint_root, find_latest, verify_checkpoint
from .preempt import stop_requested, stop_signal_name
from .save_errors import CheckpointSaveFailed

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger(__name__)

# Saves that may fail in a row before the run stops.
MAX_FAILED_SAVES = 2


@dataclass
class CheckpointPolicy:
    """Retention settings, the save-failure streak and the stop decision of one run."""

    keep_last: int | None = None  # training.keep_last_checkpoints (None: keep every one)
    keep_every: int | None = None  # training.keep_every_n_steps
    protected: Path | None = None  # the checkpoint this run resumed from: never pruned
    saved_step: int | None = None
    last_saved: Path | None = None
    failed_in_a_row: int = 0
    stopped: str | None = None  # "signal" or "save_failed"
    stop_message: str = ""
    pruned: list[Path] = field(default_factory=list)

    @property
    def stopping(self) -> bool:
        """True once the run must end (a stop every rank agreed on, or failed saves)."""
        return self.stopped is not None

    def stop_flag(self, device: torch.device) -> torch.Tensor:
        """This rank's vote for a stop, added to the step's all-reduce (1.0: a signal came)."""
        return torch.tensor([1.0 if stop_requested() else 0.0], device=device)

    def agree_on_stop(self, votes: float) -> None:
        """The all-reduced votes of every rank: any vote stops the run at this step."""
        if votes > 0 and self.stopped is None:
            self.stopped = "signal"
            self.stop_message = f"stopped by {stop_signal_name() or 'a signal on another rank'}"

    def save(self, trainer: Trainer) -> Path | None:
        """Save the trainer's step; on failure log it and go on, or stop after the second."""
        ctx = trainer.ctx
        try:
            path = trainer.save()
        except CheckpointSaveFailed as exc:
            self.failed_in_a_row += 1
            final = self.stopped is not None or trainer.step >= trainer.total_steps()
            if self.failed_in_a_row >= MAX_FAILED_SAVES or final:
                self._stop_after_failures(trainer, str(exc))
            elif ctx.is_main:
                interval = trainer.settings.save_interval
                log.error(
                    "%s; training goes on, the next save is at step %d",
                    exc,
                    (trainer.step // interval + 1) * interval,
                )
            return None
        self.failed_in_a_row = 0
        self.saved_step = trainer.step
        self.last_saved = path
        if ctx.is_main:
            self.prune(trainer.output_dir, current=path)
        return path

    def _stop_after_failures(self, trainer: Trainer, error: str) -> None:
        """Stop the run: say what failed and which checkpoint a resume would get (verified)."""
        latest = find_latest(trainer.output_dir)
        if latest is None:
            good = "no checkpoint of this run was saved"
        else:
            try:
                verify_checkpoint(latest, trainer.ctx)  # a collective: every rank is here
                good = f"the last good checkpoint {latest} verifies"
            except Exception as exc:  # what a resume would meet: say it
                good = f"the last checkpoint {latest} does not verify either ({exc})"
        self.stopped = "save_failed"
        self.stop_message = (
            f"{error}; {self.failed_in_a_row} save(s) in a row failed, so the run stopped at "
            f"step {trainer.step}; {good}: free space there and resume with --resume latest"
        )
        if trainer.ctx.is_main:
            log.error("%s", self.stop_message)

    def prune(self, output_dir: Path, *, current: Path) -> list[Path]:
        """Remove the checkpoints retention does not keep (rank 0, after a save); return them."""
        if self.keep_last is None:
            return []
        root = checkpoint_root(output_dir)
        steps = sorted(
            (p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)),
            key=lambda p: int(p.name[len(STEP_PREFIX) :]),
        )
        keep = set(steps[-self.keep_last :]) | {current}
        if self.protected is not None:
            keep.add(self.protected)
        if self.keep_every:
            keep |= {p for p in steps if int(p.name[len(STEP_PREFIX) :]) % self.keep_every == 0}
        removed = []
        for path in steps:
            if path in keep or (self.protected and path.resolve() == self.protected.resolve()):
                continue
            # Renamed first, so a crash mid-removal never leaves a step folder that looks whole.
            trash = root / f"{TMP_PREFIX}pruned-{path.name}"
            try:
                path.rename(trash)
                shutil.rmtree(trash)
            except OSError as exc:
                log.warning("could not remove the old checkpoint %s: %s", path, exc)
                continue
            removed.append(path)
        if removed:
            self.pruned += removed
            log.info(
                "removed %d old checkpoint(s) (%s): %s",
                len(removed),
                self.describe(),
                ", ".join(p.name for p in removed),
            )
        return removed

    def describe(self) -> str:
        """The retention rule in words, for the log."""
        text = f"training.keep_last_checkpoints = {self.keep_last}"
        if self.keep_every:
            text += f", every {self.keep_every}-th step kept"
        return text
