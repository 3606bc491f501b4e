"""An anchor-grouped run (data.anchor_grouped) trains on the plan the sampler builds from the
corpus's own loss masks, computes each micro-batch at the anchor bucket of its fullest row,
records the setting for resume, and says so in the dry-run plan."""

from __future__ import annotations

import math

import pytest
from train_support import one_rank, single_thread, tiny_run

from specdraft.collate import MicroBatchSampler, valid_anchor_count
from specdraft.config import ShapePolicy, validate_config


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def grouped_config(target, out, **data):
    return validate_config(
        tiny_run(
            target,
            out,
            data={"max_samples": 12, "anchor_grouped": True, "mega_batch_multiplier": 6, **data},
            training={"num_anchors": 64, "static_anchor_buckets": [16, 50], "max_steps": 3},
        )
    )


def test_an_anchor_grouped_run_trains_on_the_plan_of_its_loss_masks(tiny_target_path, tmp_path):
    from specdraft.trainer.data import build_dataset, sample_anchor_counts, sample_lengths
    from specdraft.trainer.train.assembly import build_trainer, run_fingerprint

    config = grouped_config(tiny_target_path, tmp_path / "run")
    dataset, _ = build_dataset(config, split="train", progress=False)
    counts = [valid_anchor_count(row["loss_mask"]) for row in dataset]
    index_of = {int(row["sample_id"]): i for i, row in enumerate(dataset)}
    # The Arrow one-pass count is the per-row count.
    assert sample_anchor_counts(dataset) == counts
    shapes = ShapePolicy.from_config(config)
    expected = MicroBatchSampler(
        sample_lengths(dataset),
        micro_batch_size=2,
        grad_accum_steps=1,
        seed=config.training.seed,
        pad_to=shapes,
        mega_batch_multiplier=6,
        mode="anchor_grouped",
        anchor_counts=counts,
    ).epoch_plan(0)
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        assert trainer.source.sampler.epoch_plan(0) == expected
        widths = []
        for window in trainer.source.windows(0, 0):
            for batch in window:
                rows = [index_of[int(s)] for s in batch["sample_id"].tolist()]
                need = max(min(64, counts[i]) for i in rows)
                assert batch["anchor_width"] == shapes.anchor_width(need)
                widths.append(batch["anchor_width"])
        # The packaged conversations hold some with few supervised pairs: grouped together,
        # their micro-batch computes a narrower bucket.
        assert min(widths) < 64 == max(widths)
        result = trainer.fit()
        trainer.writer.close()
    assert result.final_step == 3
    assert all(math.isfinite(r.loss) for r in result.history)
    assert run_fingerprint(config, "d")["data.anchor_grouped"] is True


def test_the_dry_run_names_the_data_order(tiny_target_path, tmp_path):
    from specdraft.trainer.train.dry_run import dry_run_plan

    grouped = grouped_config(tiny_target_path, tmp_path / "a")
    line = next(s for s in dry_run_plan(grouped, world_size=1).lines if s.startswith("data order"))
    assert "anchor-grouped: shuffled mega-batches of 6 micro-batches" in line
    plain = validate_config(tiny_run(tiny_target_path, tmp_path / "b"))
    line = next(s for s in dry_run_plan(plain, world_size=1).lines if s.startswith("data order"))
    assert line.endswith("random (seeded shuffle)")


def test_every_sampler_mode_names_its_own_data_order(tiny_target_path, tmp_path):
    from specdraft.config.sampler_mode import MODE_FIELDS, SAMPLER_MODES, sampler_mode
    from specdraft.trainer.train.dry_run import dry_run_plan

    lines = {}
    for mode in SAMPLER_MODES:
        raw = tiny_run(tiny_target_path, tmp_path / mode, training={"static_shape_buckets": [128]})
        for field in MODE_FIELDS[mode]:
            section, name = field.split(".")
            raw[section][name] = True
        config = validate_config(raw)
        assert sampler_mode(config) == mode
        plan = dry_run_plan(config, world_size=1).lines
        lines[mode] = next(s for s in plan if s.startswith("data order"))
    assert len(set(lines.values())) == len(SAMPLER_MODES), lines
    both = lines["length_grouped_bucket_synchronized"]
    assert "bucket-synchronized" in both and "sorted by length" in both
