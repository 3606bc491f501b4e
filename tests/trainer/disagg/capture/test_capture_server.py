"""The capture contract through the embedded capture server and its HTTP client."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from disagg_support import build_random_target, make_config, reference_features
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.disagg.capture import HttpCaptureClient
from specdraft.trainer.disagg.capture.server import build_capture_server
from specdraft.trainer.disagg.store import LocalFeatureStore, StoreError, read_sample
from specdraft.trainer.disagg.wire import (
    CaptureMismatch,
    CaptureRejected,
    CaptureReply,
    CaptureRequest,
    CaptureTimeout,
    CaptureUnavailable,
    TensorMeta,
    capture_spec,
    check_reply,
    sample_key,
)
from specdraft.trainer.disagg.wire.capture import (
    reply_from_json,
    reply_to_json,
    request_from_json,
    request_to_json,
)
from specdraft.trainer.models.family import FAMILIES
from specdraft.trainer.runtime.http_server import JsonServer

PROMPT = [3, 17, 42, 99, 7, 250, 1, 64, 12]
MASK = [0, 0, 0, 1, 1, 1, 0, 1, 1]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("target"))


def _serve(target: Path, tmp_path: Path, store=None, **kwargs):
    cfg = make_config(target, tmp_path, **kwargs)
    store = store or LocalFeatureStore(tmp_path / "fs")
    server = build_capture_server(cfg, store)
    spec = capture_spec(
        cfg.model.target_layer_ids, server.target.hidden_size, algorithm=cfg.model.algorithm
    )
    return server.start(), store, spec


@pytest.mark.parametrize(("algorithm", "layer_ids"), [("dflash2", (0, 2)), ("dspark", (2, 0, 1))])
def test_embedded_capture_stores_the_targets_features_before_replying(
    target, tmp_path, algorithm, layer_ids
):
    server, store, spec = _serve(target, tmp_path, algorithm=algorithm, layer_ids=layer_ids)
    client = HttpCaptureClient(server.url, spec)
    try:
        assert client.health(timeout=5)
        request = CaptureRequest("testrun", 11, 1, PROMPT, MASK)
        reply = client.capture(request, timeout=60)
        # The reply is only sent once every object is written.
        assert all(store.exists(key) for key in reply.keys())  # noqa: SIM118 (a reply is no dict)
        sample = read_sample(store, reply)
    finally:
        server.stop()
    assert reply.seq_len == len(PROMPT) and reply.layer_ids == layer_ids
    assert sample["input_ids"].tolist() == PROMPT
    assert sample["loss_mask"].tolist() == MASK
    hidden, last = reference_features(target, PROMPT, list(layer_ids))
    assert sample["hidden_states"].shape == (len(PROMPT), len(layer_ids) * 64)
    torch.testing.assert_close(sample["hidden_states"], hidden, rtol=1e-5, atol=1e-5)
    if algorithm == "dspark":
        torch.testing.assert_close(sample["target_last_hidden_states"], last, rtol=1e-5, atol=1e-5)
    else:
        assert "target_last_hidden_states" not in sample
        assert not store.exists(sample_key("testrun", 11, 1, "target_last_hidden_states"))


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (CaptureRequest("testrun", 1, 0, [1, 2, 3], [0, 1]), "400"),  # mask length differs
        (CaptureRequest("testrun", 1, 0, [1] * 129, [1] * 129), "413"),  # over max_length
        (CaptureRequest("testrun", 1, 0, [1, 9999], [0, 1]), "422"),  # outside the vocabulary
    ],
)
def test_embedded_server_refuses_bad_prompts_and_writes_nothing(target, tmp_path, request_, status):
    server, store, spec = _serve(target, tmp_path)
    try:
        with pytest.raises(CaptureRejected, match=status):
            HttpCaptureClient(server.url, spec).capture(request_, timeout=60)
    finally:
        server.stop()
    assert store.bytes_resident() == 0


class _BrokenStore(LocalFeatureStore):
    def put(self, key, data):
        raise StoreError("no space left")


def test_a_store_failure_is_an_error_reply_not_a_sample(target, tmp_path):
    server, _, spec = _serve(target, tmp_path, store=_BrokenStore(tmp_path / "fs"))
    try:
        with pytest.raises(CaptureRejected, match=r"503.*no space left"):
            HttpCaptureClient(server.url, spec).capture(
                CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60
            )
    finally:
        server.stop()


def test_a_stopped_server_is_unhealthy_and_unavailable(target, tmp_path):
    server, _, spec = _serve(target, tmp_path)
    client = HttpCaptureClient(server.url, spec)
    server.stop()
    assert not client.health(timeout=2)
    with pytest.raises(CaptureUnavailable):
        client.capture(CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=5)


def test_a_slow_server_times_out():
    def slow(_body):
        time.sleep(2)
        return 200, {}

    spec = capture_spec([0], 8, algorithm="dflash2")
    with (
        JsonServer({("POST", "/capture"): slow}) as fake,
        pytest.raises(CaptureTimeout, match="timed out"),
    ):
        HttpCaptureClient(fake.url, spec).capture(CaptureRequest("r", 1, 0, [1], [1]), timeout=0.3)


# ----------------------------------------------------------------- the client's reply checks

SPEC = capture_spec([1, 3], 16, algorithm="dspark")
REQUEST = CaptureRequest("run", 5, 2, [4, 5, 6, 7], [0, 1, 1, 1])


def _good_reply(spec=SPEC, request=REQUEST) -> CaptureReply:
    dtypes = {"input_ids": "int64", "loss_mask": "int64"}
    return CaptureReply(
        run=request.run,
        sample_id=request.sample_id,
        attempt=request.attempt,
        seq_len=len(request.input_ids),
        layer_ids=spec.layer_ids,
        hidden_size=spec.hidden_size,
        tensors=tuple(
            TensorMeta(
                name,
                sample_key(request.run, request.sample_id, request.attempt, name),
                spec.shape_of(name, len(request.input_ids)),
                dtypes.get(name, "bfloat16"),
            )
            for name in spec.tensor_names()
        ),
    )


def _with_tensor(reply: CaptureReply, name: str, **changes) -> CaptureReply:
    tensors = tuple(
        dataclasses.replace(t, **changes) if t.name == name else t for t in reply.tensors
    )
    return dataclasses.replace(reply, tensors=tensors)


BAD_REPLIES = {
    "other sample": lambda r: dataclasses.replace(r, sample_id=6),
    "other attempt": lambda r: dataclasses.replace(r, attempt=1),
    "other run": lambda r: dataclasses.replace(r, run="other"),
    "short sequence": lambda r: dataclasses.replace(r, seq_len=3),
    "other layers": lambda r: dataclasses.replace(r, layer_ids=(1, 2)),
    "reordered layers": lambda r: dataclasses.replace(r, layer_ids=(3, 1)),
    "other width": lambda r: dataclasses.replace(r, hidden_size=32),
    "narrow hidden_states": lambda r: _with_tensor(r, "hidden_states", shape=(4, 16)),
    "short hidden_states": lambda r: _with_tensor(r, "hidden_states", shape=(3, 32)),
    "wrong key": lambda r: _with_tensor(r, "loss_mask", key="run/5/g1/loss_mask"),
    "float token ids": lambda r: _with_tensor(r, "input_ids", dtype="float32"),
    "unknown dtype": lambda r: _with_tensor(r, "hidden_states", dtype="float8"),
    "missing final state": lambda r: dataclasses.replace(r, tensors=r.tensors[:3]),
}


def test_the_good_reply_passes_the_checks():
    check_reply(_good_reply(), REQUEST, SPEC)


@pytest.mark.parametrize("mutation", sorted(BAD_REPLIES))
def test_the_client_rejects_a_wrong_reply_from_the_server(mutation):
    """A server answering with a tampered reply: the client raises, it does not pass it on."""
    bad = BAD_REPLIES[mutation](_good_reply())
    with JsonServer({("POST", "/capture"): lambda _body: (200, reply_to_json(bad))}) as fake:
        client = HttpCaptureClient(fake.url, SPEC)
        with pytest.raises(CaptureMismatch):
            client.capture(REQUEST, timeout=10)


def test_a_reply_that_is_not_a_reply_is_a_mismatch():
    with (
        JsonServer({("POST", "/capture"): lambda _body: (200, {"ok": True})}) as fake,
        pytest.raises(CaptureMismatch, match="missing field"),
    ):
        HttpCaptureClient(fake.url, SPEC).capture(REQUEST, timeout=10)


requests = st.builds(
    CaptureRequest,
    run=st.from_regex(r"[A-Za-z0-9._-]{1,8}", fullmatch=True),
    sample_id=st.integers(0, 10**9),
    attempt=st.integers(0, 50),
    input_ids=st.lists(st.integers(0, 10**6), min_size=1, max_size=20),
    loss_mask=st.just([]),
).map(lambda r: dataclasses.replace(r, loss_mask=[i % 2 for i in range(len(r.input_ids))]))
specs = st.builds(
    capture_spec,
    st.lists(st.integers(0, 60), min_size=1, max_size=5, unique=True),
    st.integers(1, 8192),
    algorithm=st.sampled_from(sorted(FAMILIES)),
)


@settings(max_examples=60)
@given(requests, specs, st.sampled_from(sorted(BAD_REPLIES)))
def test_every_single_field_error_is_caught_whatever_the_sample(req, spec, mutation):
    good = _good_reply(spec, req)
    check_reply(good, req, spec)
    # Round trip through JSON keeps a reply and a request intact.
    assert reply_from_json(reply_to_json(good)) == good
    assert request_from_json(request_to_json(req)) == req
    if mutation == "missing final state" and not spec.with_last_hidden:
        return
    bad = BAD_REPLIES[mutation](good)
    if bad == good:  # e.g. the mutation's value happens to be the right one
        return
    with pytest.raises(CaptureMismatch):
        check_reply(bad, req, spec)
