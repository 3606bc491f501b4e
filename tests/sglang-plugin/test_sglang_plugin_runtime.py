"""The disaggregated runtime's guarantees on the SGLang plugin path: a producer whose captures go
through SGLang's /generate (the stub, prefilling in chunks, with the plugin's own hook writing
into the run's store from inside the server) trains every sample exactly once, retries a write
that failed inside SGLang under a new attempt with nothing left behind, and a restarted
producer resumes from its ledger without losing or repeating a sample."""

from __future__ import annotations

import pytest
import sglang_stub
from disagg_runtime import (
    expected_once,
    ledger_trained_counts,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
    train_ranks,
    wait_idle,
)
from sglang_stub import SGLangStub

from specdraft.trainer.disagg.capture.sglang_client import SGLangCaptureClient
from specdraft.trainer.disagg.capture.sglang_launcher import plugin_environment
from specdraft.trainer.disagg.capture.target import load_capture_target
from specdraft.trainer.disagg.producer.ledger import read_ledger
from specdraft.trainer.disagg.producer.producer import ledger_path
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.base import StoreError
from specdraft.trainer.disagg.store.local import LocalFeatureStore

SECRET = "9a" * 32
ONE_WINDOW = 8


class FlakyStore(LocalFeatureStore):
    """The run's store as SGLang's plugin sees it: the first attempt of some samples fails."""

    def __init__(self, root, flaky: set[int]) -> None:
        super().__init__(root)
        self.flaky = flaky

    def put(self, key, data):
        _run, sample, attempt, name = key.split("/")
        if int(sample) in self.flaky and attempt == "g0" and name == "target_last_hidden_states":
            raise StoreError(f"cannot put {key!r}: the segment is full")
        super().put(key, data)


@pytest.fixture
def plugin_server(tiny_qwen3_target, tmp_path, monkeypatch):
    """A plugin-equipped SGLang stand-in for a DSpark run in tmp_path; its writer's store."""
    from specdraft_sglang_plugin import feature_store

    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        algorithm="dspark",
        disaggregated={"capture": "sglang", "high_watermark": 2 * ONE_WINDOW},
    )
    monkeypatch.setenv(*next(iter(plugin_environment(cfg, SECRET).items())))
    handoff = sglang_stub.prefill_handoff()
    target = load_capture_target(
        tiny_qwen3_target.path, sorted(cfg.model.target_layer_ids), dtype="float32"
    )
    stub = SGLangStub(
        target,
        model_path=str(tiny_qwen3_target.path),
        final_state=True,
        chunk_size=5,
        handoff=handoff,
    ).start()
    try:
        yield cfg, stub, feature_store._WRITER
    finally:
        stub.stop()
        feature_store.disable()


def _events(run_dir, ev):
    return [r for r in read_ledger(ledger_path(run_dir)) if r["ev"] == ev]


def test_exactly_once_with_failed_writes_inside_sglang_retried(plugin_server, tmp_path):
    cfg, stub, writer = plugin_server
    prompts = make_prompts(8, vocab=90)
    flaky = {prompts[1].sample_id, prompts[6].sample_id}
    writer._store = FlakyStore(local_store_root(tmp_path), flaky)
    store = LocalFeatureStore(local_store_root(tmp_path))
    client = SGLangCaptureClient(stub.url, spec_for(cfg, 32), store, secret=SECRET)
    assert client.verify_server(timeout=10, run=cfg.run_id) is True
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        got = train_ranks(rt.client, store, world_size=2, steps=range(rt.total_steps))
        assert not got.errors
        wait_idle(rt.producer)
    assert got.per_epoch(rt.producer.plan.windows_per_epoch) == expected_once(prompts, 2)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    fails = {(r["sample_id"], r["attempt"]) for r in _events(tmp_path, "fail")}
    assert fails == {(sid, 0) for sid in flaky}
    assert all("503" in r["error"] for r in _events(tmp_path, "fail"))
    # The rows trained on are SGLang's features of the prompt, the final state included.
    for prompt in prompts:
        row = got.rows[prompt.sample_id]
        assert row["input_ids"].tolist() == list(prompt.input_ids)
        assert row["target_last_hidden_states"].shape == (len(prompt.input_ids), 32)
    assert store.bytes_resident() == 0  # trained windows removed, failed attempts left nothing


def test_a_restarted_producer_resumes_on_the_plugin_path(plugin_server, tmp_path):
    cfg, stub, _writer = plugin_server
    prompts = make_prompts(14, vocab=90)
    store = LocalFeatureStore(local_store_root(tmp_path))
    client = SGLangCaptureClient(stub.url, spec_for(cfg, 32), store, secret=SECRET)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        before = train_ranks(rt.client, store, world_size=2, steps=range(1))
        assert not before.errors
        assert rt.client(0).next_window(1)  # fetched, never acknowledged: the producer dies
        wait_idle(rt.producer)
    with running_producer(cfg, tmp_path, prompts, [client], store=store) as rt:
        after = train_ranks(rt.client, store, world_size=2, steps=range(1, rt.total_steps))
        assert not after.errors
        wait_idle(rt.producer)
    assert ledger_trained_counts(tmp_path) == expected_once(prompts, 2)
    starts = [i for i, r in enumerate(read_ledger(ledger_path(tmp_path))) if r["ev"] == "start"]
    republished = [
        r["step"] for r in read_ledger(ledger_path(tmp_path))[starts[1] :] if r["ev"] == "publish"
    ]
    assert 0 not in republished  # acknowledged before the crash: never delivered again
    assert store.bytes_resident() == 0
