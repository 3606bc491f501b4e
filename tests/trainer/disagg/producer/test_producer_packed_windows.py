"""The producer with packed windows: a packed micro-batch lists the conversations of its rows, so
a window holds more samples than `micro_batch_size x accum x ranks`. The watermark (in samples)
is sized to hold the largest window, the producer captures and serves every window, and each
planned conversation is trained exactly once."""

from __future__ import annotations

from disagg_runtime import (
    FakeCapture,
    expected_once,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    train_ranks,
)

from specdraft.trainer.disagg.producer.backpressure import resolve_high_watermark
from specdraft.trainer.disagg.producer.main import plan_prompts
from specdraft.trainer.disagg.producer.producer import ProducerSettings, largest_window
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore

PACKED = {"packing": True, "static_shapes": True}


def packed_config(target, run_dir, **disaggregated):
    # Rows of 128 tokens; the prompts have 3..60 tokens, so a row holds several.
    return runtime_config(
        target,
        run_dir,
        training=PACKED,
        data={"max_length": 128},
        disaggregated=disaggregated,
    )


def test_packed_windows_hold_more_samples_than_rows_and_size_the_watermark(tmp_path):
    cfg = packed_config("/nonexistent", tmp_path)
    plan = plan_prompts(cfg, make_prompts(40, longest=60))
    largest = largest_window(plan)
    assert largest > cfg.optimizer_window  # 8 rows per window hold more than 8 prompts
    # Four of the largest windows by default; a configured watermark is raised to one of them.
    assert resolve_high_watermark(cfg, largest) == 4 * largest
    assert ProducerSettings.from_config(cfg, plan).high_watermark == 4 * largest
    one = packed_config("/nonexistent", tmp_path, high_watermark=cfg.optimizer_window)
    assert resolve_high_watermark(one, largest) == largest
    # Unpacked (or without a plan) nothing changes.
    assert resolve_high_watermark(cfg) == 4 * cfg.optimizer_window


def test_a_packed_run_trains_every_conversation_once_under_a_one_window_watermark(
    tiny_qwen3_target, tmp_path
):
    # The configured watermark is one window of rows (8 samples), below a packed window: the
    # producer raises it to the largest window instead of waiting forever for room.
    cfg = packed_config(tiny_qwen3_target.path, tmp_path, high_watermark=8)
    store = LocalFeatureStore(local_store_root(tmp_path))
    client = FakeCapture(store, spec_for(cfg, 32))
    prompts = make_prompts(40, longest=60)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        largest = largest_window(rt.producer.plan)
        assert largest > 8
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors, got.errors
        stats = rt.producer.stats()
    assert stats["producer/high_watermark"] == largest
    assert stats["producer/max_outstanding"] <= largest
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 2)
