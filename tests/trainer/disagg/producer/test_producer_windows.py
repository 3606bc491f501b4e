"""The producer end to end on one machine: real embedded capture server over HTTP, the local
feature store, the window controller, and trainer ranks with `WindowClient`."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
from disagg_runtime import (
    Delivered,
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

from specdraft.collate import resolve_static_length
from specdraft.config import ShapePolicy
from specdraft.trainer.disagg.consumer.client import (
    EndOfRun,
    WindowClient,
    WindowError,
    new_incarnation,
)
from specdraft.trainer.disagg.consumer.source import WindowBatchSource
from specdraft.trainer.disagg.producer import main as producer_main
from specdraft.trainer.disagg.producer.prompts import Prompt
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.train.sources import BatchBuilder, BatchShape


@pytest.fixture
def capture(tiny_qwen3_target, tmp_path):
    """A real embedded capture server on the tiny target, writing into the run's store."""

    def start(cfg):
        store = LocalFeatureStore(local_store_root(tmp_path))
        server, client = start_capture_server(cfg, store)
        servers.append(server)
        return store, client

    servers = []
    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("algorithm", ["dflash2", "dspark"])
def test_two_ranks_receive_every_sample_once_per_epoch_with_its_features(
    tiny_qwen3_target, tmp_path, capture, algorithm
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, algorithm=algorithm)
    store, client = capture(cfg)
    prompts = make_prompts(11)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors, got.errors
        assert rt.producer.wait(timeout=10)
        stats = rt.client(0).stats()
    per_epoch = got.per_epoch(rt.producer.plan.windows_per_epoch)
    assert per_epoch == expected_once(prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    by_id = {p.sample_id: p for p in prompts}
    layers, hidden = len(cfg.model.target_layer_ids), 32
    for sid, row in got.rows.items():
        prompt = by_id[sid]
        assert row["input_ids"].tolist() == list(prompt.input_ids)
        assert row["loss_mask"].tolist() == list(prompt.loss_mask)
        assert row["hidden_states"].shape == (len(prompt.input_ids), layers * hidden)
        assert ("target_last_hidden_states" in row) == (algorithm == "dspark")
    # The features are the target's: layer 0's output for the first token of one sample.
    sid, row = next(iter(got.rows.items()))
    model = tiny_qwen3_target.model
    with torch.no_grad():
        out = model(torch.tensor([list(by_id[sid].input_ids)]), output_hidden_states=True)
    torch.testing.assert_close(row["hidden_states"][:, :hidden], out.hidden_states[1][0])
    # Acknowledged windows leave nothing behind in the store; the counters reach the trainer.
    assert store.bytes_resident() == 0
    assert stats["producer/trained_steps"] == rt.total_steps
    assert stats["producer/captures"] >= 2 * len(prompts)
    assert stats["producer/capture_latency_ms"] > 0
    assert "store/bytes_resident" in stats and "producer/backpressure_ms" in stats


def test_bad_prompts_are_counted_and_left_out_not_fatal(tiny_qwen3_target, tmp_path, capture):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, num_epochs=1)
    store, client = capture(cfg)
    good = make_prompts(6)
    bad = [
        Prompt(1, (), ()),  # empty
        Prompt(2, tuple([3] * 200), tuple([1] * 200)),  # over data.max_length = 128
        Prompt(3, (4, 5, 6), (0, 0, 0)),  # no assistant turn
    ]
    with running_producer(cfg, tmp_path, good + bad, [client], store=store) as rt:
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors
        stats = rt.producer.stats()
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(good, 1)
    assert stats["producer/bad_prompts"] == 3
    assert stats["producer/bad_prompts_empty"] == 1
    assert stats["producer/bad_prompts_over_long"] == 1
    assert stats["producer/bad_prompts_no_assistant_turn"] == 1


def test_trainer_resume_redelivers_the_windows_after_its_checkpoint(
    tiny_qwen3_target, tmp_path, capture
):
    """A trainer that crashed after acknowledging steps past its last checkpoint gets those
    windows again (re-captured: their objects were removed on ack), and the final accounting
    holds each sample once per epoch."""
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, num_epochs=2)
    store, client = capture(cfg)
    prompts = make_prompts(14)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        total = rt.total_steps
        assert total >= 4
        checkpoint, crashed_at = 1, 3
        first = train_ranks(rt.client, store, world_size=2, steps=range(crashed_at))
        assert not first.errors
        launch = new_incarnation()
        rolled = [rt.client(rank).resume(checkpoint, incarnation=launch) for rank in (0, 1)]
        assert set(range(checkpoint, crashed_at)) <= set(rolled[0])
        assert rolled[1] == []  # one rollback per launch
        second = train_ranks(rt.client, store, world_size=2, steps=range(checkpoint, total))
        assert not second.errors
        assert rt.producer.wait(timeout=10)
        wait_idle(rt.producer)
    # The weights hold steps < checkpoint from the first launch and the rest from the second.
    final = Delivered(
        samples={k: v for k, v in first.samples.items() if k[0] < checkpoint} | second.samples
    )
    assert final.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    # The re-delivered windows hold the same samples as before.
    for step in range(checkpoint, crashed_at):
        for rank in (0, 1):
            assert sorted(second.samples[(step, rank)]) == sorted(first.samples[(step, rank)])
    assert store.bytes_resident() == 0


def test_window_requests_outside_the_run_or_replayed_without_resume_are_refused(
    tiny_qwen3_target, tmp_path, capture
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, num_epochs=1)
    store, client = capture(cfg)
    with running_producer(cfg, tmp_path, make_prompts(6), [client], store=store) as rt:
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors
        trainer = WindowClient(rank=0, timeout_s=5, url=rt.controller.url)
        assert trainer.plan()["total_steps"] == rt.total_steps
        with pytest.raises(EndOfRun, match="outside the run"):
            trainer.next_window(rt.total_steps)
        with pytest.raises(WindowError, match="must call resume"):
            trainer.next_window(0)
        with pytest.raises(WindowError, match="rank 5 is outside"):
            WindowClient(rank=5, timeout_s=5, url=rt.controller.url).next_window(0)


def test_the_window_source_collates_with_the_runs_static_buckets(tiny_qwen3_target, tmp_path):
    """The disaggregated call site pads like the local one: every micro-batch to the smallest
    shape bucket that fits, the batch dimension to micro_batch_size, empties as dummies."""
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        micro_batch_size=3,
        training={"static_shapes": True, "static_shape_buckets": [128]},
        data={"max_length": 256},
    )
    shapes = ShapePolicy.from_config(cfg)
    pad_to = shapes.pad_to
    assert pad_to == (128, 256)
    store = LocalFeatureStore(local_store_root(tmp_path))
    prompts = make_prompts(13, longest=200)
    shape = BatchShape(
        micro_batch_size=3,
        feature_width=2 * 32,
        hidden_size=32,
        with_last_hidden=False,
        feature_dtype=torch.float32,
        static=True,
    )
    batches: dict[int, list[dict]] = {0: [], 1: []}
    with running_producer(
        cfg, tmp_path, prompts, [FakeCapture(store, spec_for(cfg, 32))], store=store
    ) as rt:

        def rank_loop(rank):
            source = WindowBatchSource(
                rt.client(rank),
                store,
                builder=BatchBuilder(shapes=shapes, shape=shape),
                grad_accum_steps=2,
            )
            assert source.micro_batches_per_epoch() == 2 * rt.producer.plan.windows_per_epoch
            for epoch in range(2):
                for window, micro in enumerate(source.windows(epoch, 0)):
                    batches[rank].extend(micro)
                    source.acknowledge(epoch, window)

        threads = [threading.Thread(target=rank_loop, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert rt.producer.wait(timeout=10)
    lengths = {p.sample_id: len(p.input_ids) for p in prompts}
    seen = []
    for batch in batches[0] + batches[1]:
        real = batch["num_real"]
        assert batch["input_ids"].shape[0] == 3  # static: padded rows
        ids = batch["sample_id"][:real].tolist()
        seen += ids
        longest = max((lengths[i] for i in ids), default=1)
        assert batch["input_ids"].shape[1] == resolve_static_length(longest, pad_to)
        assert batch["hidden_states"].shape[1:] == (batch["input_ids"].shape[1], 64)
        assert batch["loss_mask"][real:].sum() == 0  # padding rows carry no loss
    assert Counter(seen) == Counter({p.sample_id: 2 for p in prompts})  # once per epoch
    assert {b["input_ids"].shape[1] for b in batches[0] + batches[1]} == {128, 256}


def test_producer_main_reports_bad_input_with_the_file_and_the_fix(
    tiny_qwen3_target, tmp_path, capsys
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path)
    config = write_config_toml(cfg, tmp_path / "config.toml")
    prompts = write_prompts_jsonl(make_prompts(6), tmp_path / "prompts.jsonl")
    base = ["--config", str(config), "--run-dir", str(tmp_path)]

    assert producer_main.main(["--config", str(tmp_path / "missing.toml"), "--run-dir", "x"]) == 2
    assert "missing.toml" in capsys.readouterr().err

    broken = tmp_path / "broken.jsonl"
    good_row = '{"sample_id": 1, "input_ids": [1, 2], "loss_mask": [0, 1]}'
    broken.write_text(good_row + '\n{"sample_id": 2}\n')
    assert producer_main.main([*base, "--prompts", str(broken)]) == 2
    assert "broken.jsonl:2: missing field 'input_ids'" in capsys.readouterr().err

    assert producer_main.main([*base, "--prompts", str(prompts)]) == 2
    assert "--capture-url or set deployment.disaggregated.capture_urls" in capsys.readouterr().err
