"""The producer of an anchor-grouped run (data.anchor_grouped) plans the windows the trainers'
own sampler would: the same anchor counts, read from the prompts' loss masks, the same order."""

from __future__ import annotations

from disagg_runtime import make_prompts, runtime_config

from specdraft.collate import sampler_from_config, valid_anchor_count
from specdraft.config import ShapePolicy
from specdraft.trainer.disagg.producer.main import plan_prompts
from specdraft.trainer.disagg.producer.plan import split_windows

GROUPED = {"static_shapes": True, "num_anchors": 32, "static_anchor_buckets": [8, 16]}


def grouped_config(tmp_path, anchor_grouped=True):
    return runtime_config(
        "/nonexistent",
        tmp_path,
        training=GROUPED,
        data={"max_length": 128, "anchor_grouped": anchor_grouped, "mega_batch_multiplier": 4},
    )


def test_the_producer_plans_the_trainers_anchor_grouped_windows(tmp_path):
    cfg = grouped_config(tmp_path)
    prompts = make_prompts(48, longest=60)
    plan = plan_prompts(cfg, prompts)
    counts = [valid_anchor_count(p.loss_mask) for p in prompts]
    assert len(set(counts)) > 10  # varied supervision, so the order matters
    ids = [p.sample_id for p in prompts]
    for epoch in range(cfg.training.num_epochs):
        trainer_plan = sampler_from_config(
            cfg,
            [len(p.input_ids) for p in prompts],
            num_replicas=cfg.deployment.world_size,
            rank=0,
            shapes=ShapePolicy.from_config(cfg),
            anchor_counts=counts,
        ).epoch_plan(epoch)
        expected = split_windows(
            trainer_plan,
            ids,
            epoch=epoch,
            grad_accum_steps=cfg.training.grad_accum_steps,
            world_size=cfg.deployment.world_size,
            first_step=epoch * plan.windows_per_epoch,
        )
        got = [w for w in plan.windows if w.epoch == epoch]
        assert got == expected
    # Without grouping the producer plans another order over the same prompts.
    plain = plan_prompts(grouped_config(tmp_path, anchor_grouped=False), prompts)
    assert [w.ranks for w in plain.windows] != [w.ranks for w in plan.windows]
