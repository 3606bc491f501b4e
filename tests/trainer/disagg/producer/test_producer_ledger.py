"""The producer's ledger: durable JSONL, torn-tail recovery, the replayed state machine, and
exactly-once accounting under capture retries and trainer resumes."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from disagg_runtime import (
    FakeCapture,
    expected_once,
    fake_features,
    ledger_trained_counts,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    train_ranks,
    wait_idle,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.trainer.disagg.producer.ledger import (
    Ledger,
    LedgerError,
    read_ledger,
    replay,
    trained_sample_counts,
)
from specdraft.trainer.disagg.producer.main import plan_prompts
from specdraft.trainer.disagg.producer.producer import ledger_path
from specdraft.trainer.disagg.store import local_store_root, tensors_to_store
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.wire.capture import CaptureRequest


def test_records_are_durable_lines_that_read_back_in_order(tmp_path):
    path = tmp_path / "disagg" / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append("start", pid=1)
    ledger.append("lease", step=0, epoch=0, window=0, sample_id=7, attempt=0, server="a")
    ledger.close()
    records = read_ledger(path)
    assert [r["ev"] for r in records] == ["start", "lease"]
    assert records[1]["sample_id"] == 7
    # One JSON object per line: other tools (jq, grep) can read it.
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_torn_last_line_is_dropped_and_later_appends_stay_readable(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append("start", pid=1)
    ledger.close()
    with open(path, "a") as f:
        f.write('{"ev": "lease", "step": 0, "sam')  # the writer was killed mid-line
    assert [r["ev"] for r in read_ledger(path)] == ["start"]
    ledger = Ledger(path)
    ledger.append("start", pid=2)
    ledger.close()
    assert [r.get("pid") for r in read_ledger(path)] == [1, 2]


def test_a_corrupt_record_inside_the_file_names_file_and_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"ev": "start", "pid": 1}\nnot json\n{"ev": "start", "pid": 2}\n')
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: corrupt ledger record"):
        read_ledger(path)


def _publish(step, sids, attempt=0):
    recs = []
    for sid in sids:
        where = {"step": step, "epoch": 0, "window": step}
        ref = {"sample_id": sid, "attempt": attempt}
        recs.append({"ev": "lease", **where, "sample_id": sid, "attempt": attempt, "server": "s"})
        recs.append({"ev": "capture", **where, "sample_id": sid, "attempt": attempt, "ref": ref})
    refs = [[[{"sample_id": sid, "attempt": attempt} for sid in sids]]]
    recs.append({"ev": "publish", "step": step, "epoch": 0, "window": step, "refs": refs})
    return recs


def test_resume_trains_earlier_steps_and_rolls_later_trained_ones_back_to_uncaptured():
    where = {"epoch": 0}
    records = [
        *_publish(0, [1, 2]),
        *_publish(1, [3, 4]),
        *_publish(2, [5, 6]),
        {"ev": "ack", "step": 0, "window": 0, "rank": 0, **where},
        {"ev": "trained", "step": 0, "window": 0, **where},
        {"ev": "ack", "step": 1, "window": 1, "rank": 0, **where},
        {"ev": "trained", "step": 1, "window": 1, **where},
        {"ev": "ack", "step": 2, "window": 2, "rank": 0, **where},
        # The trainer restored the checkpoint taken after step 0 ... but its ack of step 1 is
        # not in those weights; step 2 was acknowledged by one rank only.
        {"ev": "resume", "step": 1, "rank": 0, "incarnation": "b", "rolled": [1, 2]},
    ]
    state = replay(records)
    assert state.is_trained(0)
    assert not state.is_trained(1) and not state.is_trained(2)
    # Step 1's objects were removed when it was trained: it is captured again.
    assert state.steps[1].published is None and not state.steps[1].slots
    # Step 2 was never trained: its objects are still there, so it keeps its captures and
    # forgets the acknowledgement that is not in the restored weights.
    assert state.steps[2].published is not None and set(state.steps[2].slots) == {5, 6}
    assert not state.steps[2].acks and state.steps[2].delivered
    # Their attempts stay "live" until removed, and the next attempt is fresh.
    assert (3, 0) in state.live and state.next_attempt[3] == 1
    assert trained_sample_counts(state) == {0: Counter({1: 1, 2: 1})}


def test_lost_objects_withdraw_a_published_window_until_recaptured():
    records = [
        *_publish(0, [1, 2]),
        {"ev": "fail", "step": 0, "epoch": 0, "window": 0, "sample_id": 2, "attempt": 0},
    ]
    state = replay(records)
    assert state.steps[0].published is None
    assert state.steps[0].delivered  # acks for it are still accepted
    assert state.steps[0].slots[2].ref is None and state.steps[0].slots[1].ref is not None


def test_an_evicted_window_goes_back_to_uncaptured_and_gets_fresh_attempts():
    records = [
        *_publish(0, [1, 2]),
        {"ev": "evict", "step": 0, "epoch": 0, "window": 0},
    ]
    state = replay(records)
    assert state.steps[0].published is None and not state.steps[0].slots
    assert not state.steps[0].delivered  # an ack for it is refused until it is published again
    assert not state.is_trained(0)
    # Its objects stay "live" until removed; its next capture is a new attempt.
    assert {(1, 0), (2, 0)} <= state.live and state.next_attempt == {1: 1, 2: 1}


# ----------------------------------------------------------------- replay == live, exactly once


def _consume(producer, world_size, steps):
    for step in steps:
        for rank in range(world_size):
            assert producer.window(step, rank, wait_s=20) is not None
        for rank in range(world_size):
            producer.ack(step, rank)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    failures=st.sets(st.tuples(st.integers(0, 11), st.integers(0, 1)), max_size=6),
    checkpoint=st.integers(0, 6),
    crash_after=st.integers(0, 6),
    watermark_windows=st.integers(1, 3),
)
def test_replayed_ledger_equals_the_live_state_and_trains_every_sample_once(
    tmp_path_factory, tiny_qwen3_target, failures, checkpoint, crash_after, watermark_windows
):
    """Whatever fails, wherever the trainer restarts from and whatever the watermark (a small
    one makes the resume evict windows captured ahead), the ledger alone reproduces the
    producer's state, and the acknowledged windows hold each sample once per epoch."""
    run_dir = tmp_path_factory.mktemp("run")
    dis = {"capture_max_retries": 3, "high_watermark": 8 * watermark_windows}
    cfg = runtime_config(tiny_qwen3_target.path, run_dir, disaggregated=dis)
    prompts = make_prompts(12)
    index = {p.sample_id: i for i, p in enumerate(prompts)}
    total = plan_prompts(cfg, prompts).total_steps
    crash_after = min(crash_after, total)
    checkpoint = min(checkpoint, crash_after)

    def fail(sid, attempt):
        return (index[sid], attempt) in failures

    store = LocalFeatureStore(local_store_root(run_dir))
    client = FakeCapture(store, spec_for(cfg, 32), fail=fail)
    with running_producer(cfg, run_dir, prompts, [client], store=store) as rt:
        _consume(rt.producer, 2, range(crash_after))
        # The trainer dies and restarts from the checkpoint after `checkpoint` steps.
        rolled = rt.producer.resume(checkpoint, 0, "second-launch")
        assert set(range(checkpoint, crash_after)) <= set(rolled)
        # The other rank of the same launch: no second rollback.
        assert rt.producer.resume(checkpoint, 1, "second-launch") == []
        _consume(rt.producer, 2, range(checkpoint, total))
        assert rt.producer.wait(timeout=10)
        wait_idle(rt.producer)
        with rt.producer._cond:  # every change is recorded and applied under this lock
            replayed = replay(read_ledger(ledger_path(run_dir)))
            assert replayed == rt.producer.machine.state
    assert trained_sample_counts(replayed) == expected_once(rt.prompts, 2)
    # Every object was removed once its window was trained: nothing leaks.
    assert store.bytes_resident() == 0


def test_a_producer_refuses_a_ledger_written_for_another_plan(tiny_qwen3_target, tmp_path):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path)
    store = LocalFeatureStore(local_store_root(tmp_path))
    prompts = make_prompts(10)
    with running_producer(cfg, tmp_path, prompts, [FakeCapture(store, spec_for(cfg, 32))]):
        pass
    reseeded = runtime_config(tiny_qwen3_target.path, tmp_path, training={"seed": 7})
    with (
        pytest.raises(LedgerError, match=r"ledger.jsonl: epoch 0 was planned differently"),
        running_producer(reseeded, tmp_path, prompts, [FakeCapture(store, spec_for(cfg, 32))]),
    ):
        pass


# ----------------------------------------------------------------- an existing run folder

# Written by the producer before its rules moved into `machine.py` (16 prompts, 2 epochs of 2
# windows, watermark 2 windows): epoch 0 trained after a resume that rolled step 1 back and an
# eviction, a failed capture, and epoch 1's windows captured and published, not trained yet.
OLD_LEDGER = Path(__file__).parent / "data" / "ledger-before-the-state-machine.jsonl"


def test_a_run_folder_of_the_earlier_producer_resumes_and_trains_each_sample_once(tmp_path):
    cfg = runtime_config("/nonexistent", tmp_path, disaggregated={"high_watermark": 16})
    path = ledger_path(tmp_path)
    path.parent.mkdir(parents=True)
    shutil.copy(OLD_LEDGER, path)
    old = replay(read_ledger(path))
    assert [old.is_trained(s) for s in range(4)] == [True, True, False, False]
    store = LocalFeatureStore(local_store_root(tmp_path))
    spec = spec_for(cfg, 32)
    prompts = {p.sample_id: p for p in make_prompts(16)}
    # Step 2's objects are still in the store; step 3's were lost with their holder.
    for sid, slot in old.steps[2].slots.items():
        request = CaptureRequest(
            run=cfg.run_id,
            sample_id=sid,
            attempt=slot.attempt,
            input_ids=list(prompts[sid].input_ids),
            loss_mask=list(prompts[sid].loss_mask),
        )
        tensors_to_store(store, request, spec, fake_features(request, spec))
    client = FakeCapture(store, spec)
    with running_producer(cfg, tmp_path, make_prompts(16), [client], store=store) as rt:
        assert rt.producer.resume(2, 0, "launch-3") == []  # nothing after the checkpoint ran
        got = train_ranks(rt.client, store, world_size=2, steps=range(2, rt.total_steps))
        assert not got.errors, got.errors
        assert rt.producer.wait(timeout=10)
        wait_idle(rt.producer)
        with rt.producer._cond:
            assert replay(read_ledger(path)) == rt.producer.machine.state
    # Step 2 was served from the objects it had; step 3 was captured again, under new attempts.
    recaptured = {sid for sid, _attempt in client.requests}
    assert recaptured == set(old.steps[3].slots)
    assert all(a > old.steps[3].slots[sid].attempt for sid, a in client.requests)
    assert ledger_trained_counts(tmp_path) == expected_once(list(prompts.values()), 2)
    assert store.bytes_resident() == 0
    # The old records are read as they were written; the new producer only appended.
    assert read_ledger(path)[: len(read_ledger(OLD_LEDGER))] == read_ledger(OLD_LEDGER)
