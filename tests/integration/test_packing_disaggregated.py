"""A managed disaggregated run with sequence packing (embedded capture server, local store,
producer, 2 trainer ranks) against the local path with packing on the same data and seed.

The producer plans packed windows with the trainers' sampler (a micro-batch lists the documents
of its rows), captures each conversation alone, and the trainer ranks pack them with the same
batch builder as the local path, which runs its in-process target per document. So both paths
train the same rows on the same features up to float rounding (the tolerance of
test_disaggregated_managed.py), and the ledger audit holds: every planned conversation is trained
exactly once. Packed windows hold more samples than `micro_batch_size x accum x ranks`; the
producer's watermark is sized to hold the largest.
"""

from __future__ import annotations

from collections import Counter

import pytest
from disagg_runs import (
    BUCKETS,
    EXAMPLE,
    SAMPLES_PER_STEP,
    ledger_state,
    run_settings,
    session_data,
    shared_run,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LOSS_RTOL = 1e-4
PACKED = ("training.packing=true",)


@pytest.fixture(scope="module")
def online(tmp_path_factory):
    return shared_run(tmp_path_factory, "online-packed", PACKED)


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    return shared_run(tmp_path_factory, "offline-packed", (*PACKED, "deployment.mode=local"))


def packed_plan(run_dir, data):
    """The producer's packed plan of the run (the same config and prompts it read)."""
    from specdraft.config import load_config
    from specdraft.trainer.disagg.producer.main import load_prompts, plan_prompts
    from specdraft.trainer.disagg.producer.prompts import screen_prompts

    cfg = load_config(EXAMPLE, (*run_settings(run_dir, data), *PACKED))
    assert cfg.training.packing
    good, _bad = screen_prompts(load_prompts(cfg, None), max_length=cfg.data.max_length)
    return plan_prompts(cfg, good)


def test_every_planned_conversation_trains_exactly_once(online, tmp_path_factory):
    from specdraft.trainer.disagg.producer.ledger import trained_sample_counts

    plan = packed_plan(online.run_dir, session_data(tmp_path_factory))
    steps = plan.total_steps
    assert online.summary["final_step"] == steps
    state = ledger_state(online.run_dir)
    assert all(state.is_trained(step) for step in range(steps))
    planned: dict[int, Counter[int]] = {}
    for window in plan.windows:
        planned.setdefault(window.epoch, Counter()).update(window.sample_ids())
    counts = trained_sample_counts(state)
    assert counts == planned
    assert {n for epoch in counts.values() for n in epoch.values()} == {1}
    # Packed windows: micro-batches of many conversations, more per window than rows.
    micro_sizes = [len(micro) for step in state.steps.values() for micro in step.published[0]]
    assert max(micro_sizes) > 2
    assert max(len(w.sample_ids()) for w in plan.windows) > SAMPLES_PER_STEP
    assert not state.live


def test_the_watermark_holds_a_whole_packed_window(online, tmp_path_factory):
    plan = packed_plan(online.run_dir, session_data(tmp_path_factory))
    largest = max(len(w.sample_ids()) for w in plan.windows)
    for row in online.by_step().values():
        assert row["producer/high_watermark"] >= largest
        assert row["producer/max_outstanding"] <= row["producer/high_watermark"]


def test_the_packed_loss_matches_the_local_packed_path_step_by_step(online, offline):
    got, want = online.by_step(), offline.by_step()
    assert sorted(got) == sorted(want)
    for step in want:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=LOSS_RTOL), step
        assert got[step]["loss_weight"] == pytest.approx(want[step]["loss_weight"], rel=1e-6)
        # The same rows: the same padded lengths, conversations and anchors per conversation.
        assert got[step]["data/pad_lengths"] == want[step]["data/pad_lengths"], step
        assert set(got[step]["data/pad_lengths"]) <= set(BUCKETS)
        assert got[step]["perf/samples_per_s"] > 0
        assert got[step]["data/anchors_per_conversation"] == pytest.approx(
            want[step]["data/anchors_per_conversation"], rel=1e-9
        )
