"""Optimizer windows: the epoch plan cut into the units the producer publishes.

An epoch plan is `[rank][micro_step] -> dataset indices` (`MicroBatchSampler.epoch_plan`);
window w of an epoch is micro-steps [w*accum, (w+1)*accum) of every rank, and global step
`epoch * windows_per_epoch + w` names it everywhere (ledger, controller, trainer acks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EpochPlan = list[list[list[int]]]
EpochPlanner = Callable[[int], EpochPlan]


class PlanError(ValueError):
    """An epoch plan that cannot be cut into whole optimizer windows, or repeats a sample."""


@dataclass(frozen=True)
class WindowPlan:
    """One optimizer step's samples: `ranks[rank][micro]` holds sample ids."""

    step: int
    epoch: int
    window: int
    ranks: tuple[tuple[tuple[int, ...], ...], ...]

    def sample_ids(self) -> list[int]:
        """Every sample id of the window, rank-major, in micro-batch order."""
        return [sid for rank in self.ranks for micro in rank for sid in micro]


def split_windows(
    plan: EpochPlan,
    sample_ids: Sequence[int],
    *,
    epoch: int,
    grad_accum_steps: int,
    world_size: int,
    first_step: int,
) -> list[WindowPlan]:
    """Cut one epoch plan (dataset indices) into windows of sample ids."""
    if len(plan) != world_size:
        raise PlanError(f"epoch {epoch} plan has {len(plan)} ranks, expected {world_size}")
    micro_steps = {len(rank) for rank in plan}
    if len(micro_steps) != 1:
        raise PlanError(
            f"epoch {epoch} plan gives ranks different micro-step counts: {micro_steps}"
        )
    (count,) = micro_steps
    if count % grad_accum_steps:
        raise PlanError(
            f"epoch {epoch} plan has {count} micro-steps per rank, not a multiple of "
            f"grad_accum_steps = {grad_accum_steps}"
        )
    seen: set[int] = set()
    windows = []
    for w in range(count // grad_accum_steps):
        lo, hi = w * grad_accum_steps, (w + 1) * grad_accum_steps
        ranks = []
        for rank in plan:
            micros = []
            for micro in rank[lo:hi]:
                ids = tuple(int(sample_ids[i]) for i in micro)
                for sid in ids:
                    # Store keys carry no epoch: a repeat would collide and train twice.
                    if sid in seen:
                        raise PlanError(f"epoch {epoch} plan repeats sample_id {sid}")
                    seen.add(sid)
                micros.append(ids)
            ranks.append(tuple(micros))
        windows.append(WindowPlan(first_step + w, epoch, w, tuple(ranks)))
    return windows


def plan_digest(windows: Sequence[WindowPlan]) -> str:
    """A short hash of an epoch's windows, so a restarted producer detects a changed plan."""
    payload = json.dumps([[list(map(list, r)) for r in w.ranks] for w in windows])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunPlan:
    """Every window of the run, in step order, with each epoch's plan digest."""

    windows: tuple[WindowPlan, ...]
    windows_per_epoch: int
    digests: dict[int, str]

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run."""
        return len(self.windows)


def plan_run(
    planner: EpochPlanner,
    sample_ids: Sequence[int],
    *,
    num_epochs: int,
    max_steps: int | None,
    grad_accum_steps: int,
    world_size: int,
) -> RunPlan:
    """All windows of the run (epochs in order, cut at max_steps)."""
    windows: list[WindowPlan] = []
    digests: dict[int, str] = {}
    per_epoch = None
    for epoch in range(num_epochs):
        if max_steps is not None and len(windows) >= max_steps:
            break
        epoch_windows = split_windows(
            planner(epoch),
            sample_ids,
            epoch=epoch,
            grad_accum_steps=grad_accum_steps,
            world_size=world_size,
            first_step=len(windows),
        )
        if per_epoch is None:
            per_epoch = len(epoch_windows)
        elif len(epoch_windows) != per_epoch:
            # Steps are epoch * windows_per_epoch + window: every epoch must have the same count.
            raise PlanError(
                f"epoch {epoch} has {len(epoch_windows)} windows, epoch 0 had {per_epoch}"
            )
        digests[epoch] = plan_digest(epoch_windows)
        windows.extend(epoch_windows)
    if not per_epoch:
        raise PlanError("the epoch plan has no optimizer window: too few samples for one step")
    if max_steps is not None:
        windows = windows[:max_steps]
    return RunPlan(tuple(windows), per_epoch, digests)
