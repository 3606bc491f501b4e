"""Assembly of a disaggregated run's trainer: `train.assembly.build_trainer` with the producer's
windows and the store's features as its batch source, after checking the producer's plan fits.

It is `train/assembly.py`'s counterpart, kept here because it opens the store and the window
client (HTTP): `train/` never imports the disaggregated runtime."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist

from specdraft.config import Config, ShapePolicy

from ...backends import backend_options_from_config
from ...runtime import DistContext
from ...train.assembly import batch_shape, build_trainer
from ...train.sources import BatchBuilder
from ...train.trainer import Trainer
from ..store.factory import open_store
from .client import WindowClient, new_incarnation
from .source import WindowBatchSource

log = logging.getLogger(__name__)


def shared_incarnation(ctx: DistContext) -> str:
    """One id for this trainer launch: made on rank 0, broadcast to every rank."""
    box: list[Any] = [new_incarnation() if ctx.is_main else None]
    if dist.is_initialized() and ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return str(box[0])


class PlanMismatch(RuntimeError):
    """The producer plans windows for another run or another number of trainer ranks."""


def check_plan(plan: dict[str, Any], config: Config, ctx: DistContext, url: str | None) -> None:
    """Refuse a producer whose plan does not fit this trainer launch (names the fix)."""
    where = f"the producer at {url}" if url else "the producer"
    if plan.get("run") != config.run_id:
        raise PlanMismatch(
            f"{where} serves run {plan.get('run')!r}, but this config's run_id is "
            f"{config.run_id!r}: the output_dir holds another run's producer; use the same "
            f"config for producer and trainers, or another output_dir"
        )
    if int(plan["world_size"]) != ctx.world_size:
        raise PlanMismatch(
            f"{where} cuts windows for {plan['world_size']} trainer ranks, but this launch has "
            f"{ctx.world_size}: start the producer with the same deployment.nproc_per_node x "
            f"deployment.nnodes as the trainers (or launch {plan['world_size']} ranks)"
        )


def build_disaggregated_trainer(
    config: Config,
    ctx: DistContext,
    *,
    resume: str | None = None,
    progress: bool = True,
    allow_changed: tuple[str, ...] = (),
) -> Trainer:
    """A Trainer whose batches come from the producer's windows (the online path)."""
    from ...models import load_target_config

    run_dir = Path(config.output_dir)
    store = open_store(config.deployment.disaggregated, run_dir, role="trainer")
    client = WindowClient.from_config(config, run_dir, rank=ctx.rank)
    check_plan(client.plan(), config, ctx, client.url)
    # The run's one shape policy: the batch builder here and build_trainer below share it.
    shapes = ShapePolicy.from_config(config)
    options = backend_options_from_config(config, ctx.device, shapes=shapes)
    builder = BatchBuilder(
        shapes=shapes,
        shape=batch_shape(config, load_target_config(config.model.target), options),
        device=ctx.device,
    )
    source = WindowBatchSource(
        client, store, builder=builder, grad_accum_steps=config.training.grad_accum_steps
    )
    trainer = build_trainer(
        config,
        ctx,
        resume=resume,
        progress=progress,
        source=source,
        shapes=shapes,
        allow_changed=allow_changed,
    )
    # Every launch re-synchronises with the producer: windows after the restored step (step 0
    # for a fresh start) are delivered again, recaptured if their features were already freed,
    # so a restart neither skips nor repeats samples.
    source.resume(trainer.epoch, trainer.window, incarnation=shared_incarnation(ctx))
    return trainer


__all__ = ["PlanMismatch", "build_disaggregated_trainer", "check_plan", "shared_incarnation"]
