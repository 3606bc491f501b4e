"""Trainer resume against a producer whose watermark is full: the rolled-back windows are
captured again and delivered, however far capture ran ahead, and a second crash resumes the same
way. In-process (the producer's own methods, a fake capture client, the local store): seconds.

The failure this guards against: a resume rolls the trained windows after the checkpoint back to
"not captured", while the windows captured ahead of the crash still hold every slot under the
watermark. Leasing is in step order, so the rolled-back window waited for room that only its own
training could free, and the trainers timed out waiting for it.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from disagg_runtime import (
    FakeCapture,
    expected_once,
    ledger_trained_counts,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    wait_idle,
)

from specdraft.trainer.disagg.producer.ledger import read_ledger, replay
from specdraft.trainer.disagg.producer.producer import ledger_path
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore

WINDOW = 8  # micro_batch_size 2 x grad_accum_steps 2 x 2 ranks
# A window that does not come in this time is the hang (a healthy one comes in milliseconds).
WAIT_S = 6.0


def _train(producer, steps, delivered):
    """Both ranks take each window, then acknowledge it (one optimizer step each)."""
    for step in steps:
        for rank in (0, 1):
            refs = producer.window(step, rank, wait_s=WAIT_S)
            assert refs is not None, (
                f"step {step} was not delivered within {WAIT_S} s: {_where(producer)}"
            )
            delivered[(step, rank)] = [ref.sample_id for micro in refs for ref in micro]
        for rank in (0, 1):
            producer.ack(step, rank)


def _where(producer) -> str:
    stats = producer.stats()
    return (
        f"outstanding {stats['producer/outstanding']:.0f} of "
        f"{stats['producer/high_watermark']:.0f}, {stats['producer/inflight']:.0f} in flight"
    )


def _wait_full(producer, high: int) -> None:
    """Wait until capture ran ahead up to the watermark and nothing is in flight."""
    wait_idle(producer)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        stats = producer.stats()
        if stats["producer/outstanding"] == high and stats["producer/inflight"] == 0:
            return
        time.sleep(0.02)
    pytest.fail(f"capture never filled the watermark: {_where(producer)}")


@pytest.mark.parametrize("ahead_windows", [1, 2])
def test_a_resume_with_the_watermark_full_redelivers_every_rolled_back_window(
    tmp_path, ahead_windows
):
    """Crash 3 windows past the last checkpoint with `ahead_windows` captured ahead (watermark
    full), resume; crash again 3 windows past the next checkpoint, with a restarted producer,
    resume again. Every planned step is delivered, each sample trained once per epoch, the
    re-delivered windows hold the planned samples, the store never held more than the
    watermark, and nothing is left in it."""
    high = ahead_windows * WINDOW
    cfg = runtime_config(
        "/nonexistent",
        tmp_path,
        num_epochs=2,
        disaggregated={"high_watermark": high, "window_timeout_s": 30.0},
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    capture = FakeCapture(store, spec_for(cfg, 32))
    prompts = make_prompts(48)  # 6 windows per epoch, 12 steps
    delivered: dict[tuple[int, int], list[int]] = {}

    with running_producer(cfg, tmp_path, prompts, [capture], store=store) as rt:
        total = rt.total_steps
        assert total == 12
        rt.producer.resume(0, 0, "launch-1")
        _train(rt.producer, range(0, 5), delivered)  # acknowledged 0..4, checkpoint after 2
        _wait_full(rt.producer, high)
        rolled = rt.producer.resume(2, 0, "launch-2")
        assert rolled == [2, 3, 4]
        assert rt.producer.resume(2, 1, "launch-2") == []  # one rollback per launch
        _train(rt.producer, range(2, 8), delivered)  # again to 7, checkpoint after 5
        _wait_full(rt.producer, high)
        first_max = rt.producer.machine.backpressure.max_outstanding

    # The second crash takes the producer with it: the next one replays the ledger.
    with running_producer(cfg, tmp_path, prompts, [capture], store=store) as rt:
        _wait_full(rt.producer, high)
        assert rt.producer.resume(5, 1, "launch-3") == [5, 6, 7]
        _train(rt.producer, range(5, total), delivered)
        assert rt.producer.wait(timeout=10)
        wait_idle(rt.producer)
        plan = rt.producer.plan
        assert max(first_max, rt.producer.machine.backpressure.max_outstanding) <= high
        with rt.producer._cond:  # the evictions replay: the ledger alone gives the live state
            assert replay(read_ledger(ledger_path(tmp_path))) == rt.producer.machine.state

    # What the last delivery of each step held is exactly the plan, and the ledger agrees.
    for step in range(total):
        for rank in (0, 1):
            planned = [sid for micro in plan.windows[step].ranks[rank] for sid in micro]
            assert delivered[(step, rank)] == planned, (step, rank)
    per_epoch: dict[int, Counter[int]] = {}
    for (step, _rank), ids in delivered.items():
        per_epoch.setdefault(step // plan.windows_per_epoch, Counter()).update(ids)
    assert per_epoch == expected_once(rt.prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(rt.prompts, 2)
    assert store.bytes_resident() == 0
    # The rolled-back windows were captured anew (fresh attempts), the rest once.
    records = read_ledger(ledger_path(tmp_path))
    recaptured = {r["sample_id"] for r in records if r["ev"] == "capture" and r["attempt"] > 0}
    rolled_back = {sid for step in (2, 3, 4, 5, 6, 7) for sid in plan.windows[step].sample_ids()}
    assert rolled_back <= recaptured
