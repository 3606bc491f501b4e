"""Backpressure: the producer never holds more unacknowledged samples than the watermark, the
watermark defaults to four windows and never drops below one, and trainers that stop
acknowledging end the producer with a clear error instead of a hang."""

from __future__ import annotations

import threading
import time

import pytest
from disagg_runtime import (
    FakeCapture,
    expected_once,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    train_ranks,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from specdraft.trainer.disagg.producer.backpressure import (
    Backpressure,
    BackpressureTimeout,
    resolve_high_watermark,
)
from specdraft.trainer.disagg.producer.producer import ProducerError
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore


def test_watermark_defaults_to_four_windows_and_keeps_a_configured_one(tmp_path):
    cfg = runtime_config("/nonexistent", tmp_path, micro_batch_size=3, grad_accum_steps=2)
    assert cfg.optimizer_window == 12
    assert resolve_high_watermark(cfg) == 48
    cfg = runtime_config("/nonexistent", tmp_path, disaggregated={"high_watermark": 9})
    assert resolve_high_watermark(cfg) == 9


def test_a_watermark_below_one_window_is_rejected_with_the_fix(tmp_path):
    with pytest.raises(ValidationError, match=r"at least one optimizer window .* = 8"):
        runtime_config("/nonexistent", tmp_path, disaggregated={"high_watermark": 7})


def test_reservations_stop_at_the_watermark_and_resume_on_release():
    gate = Backpressure(3)
    assert all(gate.try_reserve(1, timeout=5) for _ in range(3))
    assert not gate.try_reserve(1, timeout=5)
    gate.release(2)
    assert gate.try_reserve(2, timeout=5)
    assert gate.outstanding == 3 and gate.max_outstanding == 3
    assert gate.blocked_s > 0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_without_any_acknowledgement_times_out_naming_the_setting():
    clock = Clock()
    gate = Backpressure(1, clock=clock)
    assert gate.try_reserve(1, timeout=5)
    assert not gate.try_reserve(1, timeout=5)  # the hold starts
    clock.now += 4.9
    assert not gate.try_reserve(1, timeout=5)
    clock.now += 0.1
    with pytest.raises(BackpressureTimeout, match="window_timeout_s"):
        gate.try_reserve(1, timeout=5)


def test_a_release_restarts_the_timeout_and_ends_the_hold_at_the_next_reservation():
    clock = Clock()
    gate = Backpressure(2, clock=clock)
    assert gate.try_reserve(2, timeout=5)
    assert not gate.try_reserve(1, timeout=5)
    clock.now += 4.0
    gate.release(1)  # trainers are alive: the timeout counts from here
    clock.now += 4.0
    assert gate.try_reserve(1, timeout=5)
    assert gate.outstanding == 2 and gate.blocked_s == pytest.approx(8.0)
    clock.now += 3.0
    assert gate.blocked_s == pytest.approx(8.0)  # no hold now
    with pytest.raises(ValueError, match="only 2 are taken"):
        gate.release(3)


class ResidentCounter:
    """Counts the samples whose objects are in the store, as each capture lands."""

    def __init__(self, store):
        self.store = store
        self.max_resident = 0
        self._lock = threading.Lock()

    def wrap(self, client):
        capture = client.capture

        def counted(request, *, timeout):
            reply = capture(request, timeout=timeout)
            with self._lock:
                attempts = list(self.store.root.glob("*/*/g*"))
                self.max_resident = max(self.max_resident, len(attempts))
            return reply

        client.capture = counted
        return client


@pytest.mark.parametrize("windows", [1, 2])
def test_unacknowledged_samples_never_exceed_the_watermark(tiny_qwen3_target, tmp_path, windows):
    """Slow trainers: the producer runs ahead exactly up to the watermark and waits there."""
    cfg = runtime_config(
        tiny_qwen3_target.path, tmp_path, disaggregated={"high_watermark": 8 * windows}
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    counter = ResidentCounter(store)
    client = counter.wrap(FakeCapture(store, spec_for(cfg, 32)))
    prompts = make_prompts(30)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        got = train_ranks(
            rt.client,
            store,
            world_size=2,
            steps=range(rt.total_steps),
            on_step=lambda step, rank: time.sleep(0.05),  # a slow optimizer step
        )
        assert not got.errors
        stats = rt.producer.stats()
    high = 8 * windows
    print(f"max unacknowledged samples {stats['producer/max_outstanding']:.0f} (watermark {high})")
    assert stats["producer/max_outstanding"] == high  # reached: the producer did run ahead
    assert counter.max_resident <= high
    assert stats["producer/backpressure_ms"] > 0
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 2)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    world=st.integers(1, 3),
    micro=st.integers(1, 3),
    accum=st.integers(1, 3),
    extra=st.integers(0, 5),
    n=st.integers(4, 24),
)
def test_the_watermark_bound_holds_for_any_batch_geometry(
    tmp_path_factory, tiny_qwen3_target, world, micro, accum, extra, n
):
    run_dir = tmp_path_factory.mktemp("run")
    window = world * micro * accum
    cfg = runtime_config(
        tiny_qwen3_target.path,
        run_dir,
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        disaggregated={"high_watermark": window + extra, "max_inflight_captures": 4},
    )
    store = LocalFeatureStore(local_store_root(run_dir))
    counter = ResidentCounter(store)
    prompts = make_prompts(n, seed=n)
    client = counter.wrap(FakeCapture(store, spec_for(cfg, 32)))
    with running_producer(cfg, run_dir, prompts, [client], store=store) as rt:
        for step in range(rt.total_steps):
            for rank in range(world):
                assert rt.producer.window(step, rank, wait_s=20) is not None
            time.sleep(0.005)
            for rank in range(world):
                rt.producer.ack(step, rank)
        stats = rt.producer.stats()
    assert stats["producer/max_outstanding"] <= window + extra
    assert counter.max_resident <= window + extra


def test_trainers_that_stop_acknowledging_stop_the_producer_with_a_clear_error(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        disaggregated={"high_watermark": 8, "window_timeout_s": 0.5},
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    client = FakeCapture(store, spec_for(cfg, 32))
    with running_producer(cfg, tmp_path, make_prompts(30), [client], store=store) as rt:
        deadline = time.monotonic() + 10
        while rt.producer.failure is None:
            assert time.monotonic() < deadline, "the producer waited forever"
            time.sleep(0.05)
        with pytest.raises(ProducerError, match=r"acknowledgement .*window_timeout_s"):
            rt.producer.window(0, 0, wait_s=0)
