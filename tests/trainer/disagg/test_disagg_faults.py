"""Faults of the disaggregated runtime: failed captures, a killed capture server, a killed
producer (restarted by the supervisor, resuming from its ledger), lost store objects, and
timeouts that end in clear errors. Nothing is lost and nothing is trained twice."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from disagg_runtime import (
    FakeCapture,
    expected_once,
    ledger_trained_counts,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    start_capture_server,
    train_ranks,
    wait_idle,
    write_config_toml,
    write_prompts_jsonl,
)

from specdraft.trainer.disagg.consumer.client import WindowClient, WindowTimeout
from specdraft.trainer.disagg.managed.supervisor import Supervisor, producer_service
from specdraft.trainer.disagg.producer.ledger import read_ledger
from specdraft.trainer.disagg.producer.producer import ledger_path
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore

ONE_WINDOW = 8  # micro_batch 2 x accum 2 x 2 ranks: the producer may not run further ahead


def _events(run_dir, ev):
    return [r for r in read_ledger(ledger_path(run_dir)) if r["ev"] == ev]


def test_failed_captures_are_retried_under_new_attempts_and_the_old_objects_removed(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, num_epochs=1)
    store = LocalFeatureStore(local_store_root(tmp_path))
    prompts = make_prompts(8)
    flaky = {prompts[1].sample_id, prompts[4].sample_id}
    client = FakeCapture(
        store, spec_for(cfg, 32), fail=lambda sid, attempt: sid in flaky and attempt < 2
    )
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors
        wait_idle(rt.producer)
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 1)
    fails = {(r["sample_id"], r["attempt"]) for r in _events(tmp_path, "fail")}
    assert fails == {(sid, a) for sid in flaky for a in (0, 1)}
    captured = {r["sample_id"]: r["attempt"] for r in _events(tmp_path, "capture")}
    assert all(captured[sid] == 2 for sid in flaky)
    # The delivered rows are the third attempts; the half-written first ones are gone.
    assert all(got.rows[sid]["input_ids"].numel() > 1 for sid in flaky)
    assert store.bytes_resident() == 0


def test_a_sample_that_keeps_failing_on_a_healthy_server_stops_the_producer_clearly(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        num_epochs=1,
        disaggregated={"capture_max_retries": 1, "window_timeout_s": 1.5},
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    prompts = make_prompts(4)
    bad = prompts[0].sample_id
    client = FakeCapture(store, spec_for(cfg, 32), fail=lambda sid, attempt: sid == bad)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        with pytest.raises(WindowTimeout) as info:
            rt.client(0).next_window(0)
        assert rt.producer.failure is not None
    message = str(info.value)
    assert "window_timeout_s" in message
    assert f"sample {bad}" in message and "capture_max_retries" in message


def test_a_killed_capture_server_is_dropped_and_training_goes_on(tiny_qwen3_target, tmp_path):
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        disaggregated={"high_watermark": ONE_WINDOW, "health_timeout_s": 1.0},
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    server_a, client_a = start_capture_server(cfg, store)
    server_b, client_b = start_capture_server(cfg, store)
    prompts = make_prompts(14)

    def kill_b(step, rank):
        if step == 0 and rank == 0:
            server_b.stop()  # refuses connections from now on

    try:
        with running_producer(cfg, tmp_path, prompts, [client_a, client_b], store=store) as rt:
            got = train_ranks(
                rt.client, store, world_size=2, steps=range(rt.total_steps), on_step=kill_b
            )
            assert not got.errors, got.errors
            deadline = time.monotonic() + 10
            while rt.producer.stats()["producer/servers_dropped"] < 1:
                assert time.monotonic() < deadline, "the dead server was never dropped"
                time.sleep(0.1)
            stats = rt.producer.stats()
    finally:
        server_a.stop()
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    assert stats["producer/servers_up"] == 1
    assert [r["server"] for r in _events(tmp_path, "drop_server")] == [server_b.url]
    # B's refused captures were leased again, on A, under new attempts.
    failed_on_b = [r for r in _events(tmp_path, "fail") if r["server"] == server_b.url]
    assert failed_on_b
    assert store.bytes_resident() == 0


def test_with_every_capture_server_gone_the_producer_and_trainers_fail_with_its_names(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        num_epochs=1,
        disaggregated={"health_timeout_s": 0.5, "window_timeout_s": 1.5},
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    clients = [FakeCapture(store, spec_for(cfg, 32), url=f"http://cap-{i}:1") for i in (0, 1)]
    for client in clients:
        client.down = True
    with (
        running_producer(cfg, tmp_path, make_prompts(4), clients, store=store) as rt,
        pytest.raises(WindowTimeout) as info,
    ):
        rt.client(1).next_window(0)
    message = str(info.value)
    assert "the producer stopped" in message and "capture server" in message
    assert "http://cap-0:1" in message and "http://cap-1:1" in message


def test_a_window_that_does_not_come_in_time_names_the_step_and_the_setting(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, num_epochs=1)
    store = LocalFeatureStore(local_store_root(tmp_path))
    slow = FakeCapture(store, spec_for(cfg, 32), delay_s=2.0)
    with running_producer(cfg, tmp_path, make_prompts(4), [slow], store=store):
        started = time.monotonic()
        with pytest.raises(WindowTimeout, match=r"window of step 0 within 0.5 s") as info:
            WindowClient(rank=0, timeout_s=0.5, run_dir=tmp_path).next_window(0)
        assert time.monotonic() - started < 5
    assert "deployment.disaggregated.window_timeout_s" in str(info.value)


def test_without_a_producer_the_trainer_times_out_naming_the_address_file(tmp_path):
    with pytest.raises(WindowTimeout, match=r"controller\.json"):
        WindowClient(rank=0, timeout_s=0.3, run_dir=tmp_path).next_window(0)


def test_a_restarted_producer_resumes_from_its_ledger_and_recaptures_lost_objects(
    tiny_qwen3_target, tmp_path
):
    """In-process restart: acknowledged windows are never published again; a published but
    unacknowledged window whose objects vanished (a restarted store) is captured again."""
    cfg = runtime_config(
        tiny_qwen3_target.path, tmp_path, disaggregated={"high_watermark": 2 * ONE_WINDOW}
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    prompts = make_prompts(14)
    first = FakeCapture(store, spec_for(cfg, 32))
    with running_producer(cfg, tmp_path, prompts, [first], store=store) as rt:
        before = train_ranks(rt.client, store, world_size=2, steps=range(1))
        assert not before.errors
        # Step 1 is published and fetched by rank 0, but not acknowledged when the producer dies.
        assert rt.client(0).next_window(1)
        wait_idle(rt.producer)
    published_before = {r["step"] for r in _events(tmp_path, "publish")}
    assert {0, 1} <= published_before
    step1 = next(r for r in _events(tmp_path, "publish") if r["step"] == 1)
    lost = step1["refs"][0][0][0]
    for meta in lost["tensors"]:
        store.remove(meta["key"])
    second = FakeCapture(store, spec_for(cfg, 32))
    with running_producer(cfg, tmp_path, prompts, [second], store=store) as rt:
        after = train_ranks(rt.client, store, world_size=2, steps=range(1, rt.total_steps))
        assert not after.errors
        wait_idle(rt.producer)
    samples = before.samples | after.samples
    per_epoch: dict = {}
    for (step, _rank), ids in samples.items():
        per_epoch.setdefault(step // rt.producer.plan.windows_per_epoch, []).extend(ids)
    assert {e: sorted(v) for e, v in per_epoch.items()} == {
        e: sorted(c.elements()) for e, c in expected_once(prompts, 2).items()
    }
    starts = [i for i, r in enumerate(read_ledger(ledger_path(tmp_path))) if r["ev"] == "start"]
    records = read_ledger(ledger_path(tmp_path))[starts[1] :]
    republished = [r["step"] for r in records if r["ev"] == "publish"]
    assert 0 not in republished  # acknowledged: never published again
    lost_again = [
        r for r in records if r.get("step") == 1 and r.get("sample_id") == lost["sample_id"]
    ]
    assert lost_again[0]["ev"] == "fail" and "missing" in lost_again[0]["error"]
    assert any(r["ev"] == "capture" and r["attempt"] > lost["attempt"] for r in lost_again)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    assert store.bytes_resident() == 0


@pytest.mark.slow  # three producer processes start (torch + transformers imports): ~30 s
def test_a_killed_producer_is_restarted_by_the_supervisor_and_nothing_is_lost_or_repeated(
    tiny_qwen3_target, tmp_path
):
    """The producer runs as its own process; it is SIGKILLed twice mid-run (once between a
    window's delivery and its ack); the supervisor restarts it, it resumes from the ledger, and
    the trainer ranks (which find it again through the run folder) train every sample once."""
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        disaggregated={
            "high_watermark": ONE_WINDOW,
            "max_producer_restarts": 2,
            "window_timeout_s": 90.0,
            "health_timeout_s": 90.0,
        },
    )
    store = LocalFeatureStore(local_store_root(tmp_path))
    server, _client = start_capture_server(cfg, store)
    prompts = make_prompts(14)
    config_path = write_config_toml(cfg, tmp_path / "config.toml")
    prompts_path = write_prompts_jsonl(prompts, tmp_path / "prompts.jsonl")
    spec = producer_service(
        config_path,
        tmp_path,
        max_restarts=2,
        capture_urls=[server.url],
        extra_args=["--prompts", str(prompts_path)],
    )
    supervisor = Supervisor(tmp_path, health_timeout_s=90, shutdown_timeout_s=5)
    kill_at = {(0, 0), (2, 1)}  # (step, rank) after whose delivery the producer is killed
    killed: list[int] = []

    def kill_producer(step, rank):
        if (step, rank) in kill_at:
            pid = supervisor.services[0].process.pid
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    try:
        with supervisor:
            supervisor.start(spec)
            plan = WindowClient(rank=0, timeout_s=60, run_dir=tmp_path).plan()
            result: dict = {}
            trainer = threading.Thread(
                target=lambda: result.setdefault(
                    "got",
                    train_ranks(
                        lambda rank: WindowClient(rank=rank, timeout_s=90, run_dir=tmp_path),
                        store,
                        world_size=2,
                        steps=range(plan["total_steps"]),
                        on_step=kill_producer,
                    ),
                )
            )
            trainer.start()
            supervisor.watch(lambda: not trainer.is_alive(), timeout=240)
            restarts = supervisor.services[0].restarts
    finally:
        server.stop()
    got = result["got"]
    assert not got.errors, got.errors
    assert len(killed) == 2 and restarts == 2
    assert supervisor.stop_order == ["producer"]
    assert got.per_epoch(plan["windows_per_epoch"]) == expected_once(prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    assert len(_events(tmp_path, "start")) == 3
    # Every step's acknowledgement was recorded once per rank, across the restarts.
    acks = [(r["step"], r["rank"]) for r in _events(tmp_path, "ack")]
    assert sorted(acks) == sorted({(s, r) for s in range(plan["total_steps"]) for r in (0, 1)})
    log = supervisor.log_path("producer").read_text()
    assert log.count("window controller at") == 3
