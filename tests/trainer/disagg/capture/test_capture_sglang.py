"""The SGLang capture path: the launch command, the managed launcher (driving the stub through
the same code path as real SGLang), and the client's parsing and checks of SGLang replies."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import sglang_stub
import torch
from disagg_support import build_random_target, make_config, reference_features
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_stub import SGLangStub

from specdraft.trainer.disagg.capture import ManagedSGLang, SGLangCaptureClient, sglang_command
from specdraft.trainer.disagg.capture.sglang_client import generate_payload, split_sglang_hidden
from specdraft.trainer.disagg.capture.target import load_capture_target
from specdraft.trainer.disagg.store import LocalFeatureStore, local_store_root, read_sample
from specdraft.trainer.disagg.store.base import StoreError
from specdraft.trainer.disagg.wire import (
    CaptureMismatch,
    CaptureRejected,
    CaptureRequest,
    capture_spec,
)
from specdraft.trainer.runtime.http_client import call_json
from specdraft.trainer.runtime.service_process import ServiceError, ServiceProcess

# The stub stands in for `sglang.launch_server`: the launcher starts it as `python -m sglang_stub`.
STUB = "sglang_stub"
PROMPT = [3, 17, 42, 99, 7, 250, 1, 64]
MASK = [0, 0, 1, 1, 1, 0, 1, 1]


@pytest.fixture(autouse=True)
def stub_importable(monkeypatch):
    """Child Pythons (the launched stub, the interface probe) find the stub in tests/support."""
    support = str(Path(sglang_stub.__file__).parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [support, os.environ.get("PYTHONPATH")]))
    )


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("target"))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------ launch command


@pytest.mark.parametrize(
    ("algorithm", "flag"), [("dflash", "DFLASH"), ("dflash2", "DFLASH"), ("dspark", "DSPARK")]
)
def test_the_launch_command_asks_sglang_0_5_23_for_the_tapped_layers(tmp_path, algorithm, flag):
    cfg = make_config(
        Path("/models/qwen3-8b"),
        tmp_path,
        algorithm=algorithm,
        layer_ids=(9, 1, 17),
        disaggregated={"capture": "sglang", "sglang_args": ["--tp-size", "2"]},
    )
    cmd = sglang_command(cfg, port=31000, interface="0.5.23")
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    assert "--model-path /models/qwen3-8b --host 127.0.0.1 --port 31000" in joined
    for needed in (
        "--enable-return-hidden-states",
        "--enable-return-aux-hidden-states",
        "--disable-radix-cache",
    ):
        assert needed in cmd
    assert cmd[cmd.index("--speculative-algorithm") + 1] == flag
    # The layers, ascending: the order SGLang returns them in whatever it is given.
    assert "--return-aux-hidden-state-layer-ids 1 9 17 --tp-size 2" in joined
    # The user's sglang_args come last, so they can override anything before them.
    assert cmd[-2:] == ["--tp-size", "2"]
    assert sglang_command(cfg, port=1, module="my.stub", interface="0.5.23")[:3] == [
        sys.executable,
        "-m",
        "my.stub",
    ]


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_the_later_interface_names_the_capture_without_a_speculative_algorithm(tmp_path, algorithm):
    cfg = make_config(
        Path("/m"),
        tmp_path,
        algorithm=algorithm,
        layer_ids=(3, 1),
        disaggregated={"capture": "sglang", "sglang_interface": "aux-capture"},
    )
    cmd = sglang_command(cfg, port=1)  # forced by the config: nothing is detected
    joined = " ".join(cmd)
    method = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}[algorithm]
    assert f"--aux-hidden-state-capture {method} --aux-hidden-state-layer-ids 1 3" in joined
    assert "--speculative-algorithm" not in cmd
    assert "--enable-return-aux-hidden-states" not in cmd


# ------------------------------------------------------ the managed launcher, with the stub


@pytest.mark.slow
def test_managed_launch_serves_captures_through_the_sglang_api(target, tmp_path):
    # Unsorted layers: SGLang returns them in layer order, the client restores config order.
    layer_ids = (2, 0)
    cfg = make_config(
        target,
        tmp_path,
        layer_ids=layer_ids,
        disaggregated={"capture": "sglang", "health_timeout_s": 120},
    )
    log = tmp_path / "logs" / "sglang.log"
    store = LocalFeatureStore(tmp_path / "fs")
    with ManagedSGLang(cfg, port=_free_port(), log_path=log, module=STUB) as server:
        assert server.healthy()
        for path in ("/health_generate", "/get_model_info", "/get_server_info"):
            call_json("GET", server.url + path, timeout=30)
        client = SGLangCaptureClient(
            server.url, capture_spec(layer_ids, 64, algorithm="dflash2"), store, dtype="float32"
        )
        client.verify_server(timeout=10)
        assert client.health(timeout=5)
        reply = client.capture(CaptureRequest("testrun", 4, 0, PROMPT, MASK), timeout=60)
    assert not server.alive()
    assert "serving" in log.read_text()  # the server's own output streams to the log file
    sample = read_sample(store, reply)
    hidden, _ = reference_features(target, PROMPT, list(layer_ids))
    torch.testing.assert_close(sample["hidden_states"], hidden, rtol=1e-5, atol=1e-5)
    assert sample["input_ids"].tolist() == PROMPT and sample["loss_mask"].tolist() == MASK


@pytest.mark.slow
def test_a_server_that_exits_fails_the_launch_with_its_log_tail(target, tmp_path):
    # A draft path: the stub refuses it at once, as SGLang's validation hook does.
    cfg = make_config(
        target,
        tmp_path,
        disaggregated={
            "capture": "sglang",
            "sglang_args": ["--speculative-draft-model-path", "/models/draft"],
        },
    )
    server = ManagedSGLang(cfg, port=_free_port(), log_path=tmp_path / "s.log", module=STUB)
    with pytest.raises(ServiceError, match=r"exited with code 1(.|\n)*speculative-draft-model"):
        server.start()


@pytest.mark.slow
def test_the_launcher_detects_the_later_interface_of_the_stub(target, tmp_path, monkeypatch):
    # The stub speaks the post-0.5.23 flags; the launcher must find that out by itself.
    monkeypatch.setenv("SPECDRAFT_SGLANG_STUB_INTERFACE", "aux-capture")
    cfg = make_config(
        target,
        tmp_path,
        layer_ids=(2, 0),
        disaggregated={"capture": "sglang", "health_timeout_s": 120},
    )
    log = tmp_path / "sglang.log"
    with ManagedSGLang(cfg, port=_free_port(), log_path=log, module=STUB) as server:
        assert "--aux-hidden-state-capture" in server.command
        client = SGLangCaptureClient(
            server.url, capture_spec((2, 0), 64, algorithm="dflash2"), LocalFeatureStore(tmp_path)
        )
        reply = client.capture(CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60)
    assert reply.sample_id == 1


@pytest.mark.subprocess
def test_a_service_that_never_gets_healthy_times_out_and_is_stopped(tmp_path):
    service = ServiceProcess(
        "sleeper",
        [sys.executable, "-c", "print('starting'); import time; time.sleep(60)"],
        tmp_path / "sleeper.log",
    )
    with pytest.raises(ServiceError, match=r"not ready within 0.5 s(.|\n)*starting"):
        service.wait_ready(lambda: False, timeout=0.5, what="ready")
    assert not service.alive()


# ------------------------------------------------- the client against the in-process stub


@pytest.fixture(scope="module")
def stub_target(target):
    return load_capture_target(target, [0, 2], dtype="float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dspark_capture_takes_the_final_state_after_the_layers(
    target, stub_target, tmp_path, dtype
):
    store = LocalFeatureStore(tmp_path)
    spec = capture_spec([0, 2], 64, algorithm="dspark")
    with SGLangStub(
        stub_target, model_path=str(target), speculative_algorithm="DSPARK", final_state=True
    ) as stub:
        reply = SGLangCaptureClient(stub.url, spec, store, dtype=dtype).capture(
            CaptureRequest("testrun", 1, 3, PROMPT, MASK), timeout=60
        )
    sample = read_sample(store, reply)
    hidden, last = reference_features(target, PROMPT, [0, 2])
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-2, "atol": 1e-2}
    assert sample["target_last_hidden_states"].dtype == getattr(torch, dtype)
    torch.testing.assert_close(sample["target_last_hidden_states"].float(), last, **tol)
    torch.testing.assert_close(sample["hidden_states"].float(), hidden, **tol)


def test_dspark_refuses_a_server_that_returns_only_the_layers(target, stub_target, tmp_path):
    store = LocalFeatureStore(tmp_path)
    spec = capture_spec([0, 2], 64, algorithm="dspark")
    # Stock SGLang with --speculative-algorithm DSPARK: the tapped layers only.
    with (
        SGLangStub(stub_target, model_path=str(target), speculative_algorithm="DSPARK") as stub,
        pytest.raises(CaptureMismatch, match=r"final hidden state(.|\n)*specdraft-sglang-plugin"),
    ):
        SGLangCaptureClient(stub.url, spec, store).capture(
            CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60
        )
    assert store.bytes_resident() == 0


@pytest.mark.parametrize("plugin", [False, True])
def test_a_dspark_run_on_sglang_stops_before_training_without_the_final_state(
    target, stub_target, tmp_path, plugin
):
    from specdraft.trainer.disagg.producer.main import ProducerSetupError, capture_clients

    cfg = make_config(target, tmp_path, algorithm="dspark", disaggregated={"capture": "sglang"})
    store = LocalFeatureStore(tmp_path / "fs")
    with SGLangStub(
        stub_target, model_path=str(target), speculative_algorithm="DSPARK", final_state=plugin
    ) as stub:
        if plugin:
            # The start-up probe proved the final state: the producer gets its client.
            (client,) = capture_clients(cfg, [stub.url], store)
            assert client.url == stub.url
        else:
            with pytest.raises(ProducerSetupError) as caught:
                capture_clients(cfg, [stub.url], store)
            message = str(caught.value)
            assert "stops before training" in message
            assert "pip install --no-deps specdraft-sglang-plugin" in message
            assert "capture = 'embedded'" in message
    assert store.bytes_resident() == 0  # the probe stores nothing


def test_a_server_without_aux_capture_is_rejected_by_width(target, stub_target, tmp_path):
    spec = capture_spec([0, 2], 64, algorithm="dflash2")
    with (
        SGLangStub(stub_target, model_path=str(target), aux_capture=False) as stub,
        pytest.raises(CaptureMismatch, match="rows of 64 values, expected 2 layers"),
    ):
        SGLangCaptureClient(stub.url, spec, LocalFeatureStore(tmp_path)).capture(
            CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60
        )


def test_a_server_without_hidden_states_is_named_with_the_flag(target, stub_target, tmp_path):
    spec = capture_spec([0, 2], 64, algorithm="dflash2")
    with SGLangStub(stub_target, model_path=str(target), return_hidden_states=False) as stub:
        client = SGLangCaptureClient(stub.url, spec, LocalFeatureStore(tmp_path))
        with pytest.raises(CaptureRejected, match="--enable-return-hidden-states"):
            client.verify_server(timeout=10)
        with pytest.raises(CaptureRejected, match="400"):
            client.capture(CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60)


# ------------------------------------------------------ parsing SGLang's meta_info.hidden_states

SPEC = capture_spec([3, 1], 2, algorithm="dflash2")
REQUEST = CaptureRequest("run", 7, 1, [10, 11, 12], [0, 1, 1])
# Rows as SGLang sends them: layer 1 then layer 3 (ascending), 2 values each.
ROWS = [[1.0, 1.5, 3.0, 3.5], [2.0, 2.5, 4.0, 4.5], [5.0, 5.5, 6.0, 6.5]]


def _body(**meta):
    base = {"id": "run/7/g1", "prompt_tokens": 3, "hidden_states": [ROWS]}
    return {"text": "", "meta_info": {**base, **meta}}


def test_the_request_asks_for_one_token_and_the_hidden_states():
    payload = generate_payload(REQUEST)
    assert payload["input_ids"] == [10, 11, 12]
    assert payload["sampling_params"]["max_new_tokens"] == 1
    assert payload["return_hidden_states"] is True
    assert payload["rid"] == "run/7/g1"


def test_layers_come_back_in_config_order():
    hidden, last = split_sglang_hidden(_body(), REQUEST, SPEC)
    assert last is None
    assert hidden.tolist() == [[3.0, 3.5, 1.0, 1.5], [4.0, 4.5, 2.0, 2.5], [6.0, 6.5, 5.0, 5.5]]


def test_decode_rows_after_the_prompt_are_ignored_and_batch_answers_accepted():
    body = _body(hidden_states=[ROWS, [9.0, 9.0, 9.0, 9.0]])
    hidden, _ = split_sglang_hidden([body], REQUEST, SPEC)
    assert hidden.shape == (3, 4)


def test_a_separate_last_hidden_states_field_is_used_for_dspark():
    spec = capture_spec([3, 1], 2, algorithm="dspark")
    final = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]
    _, last = split_sglang_hidden(_body(last_hidden_states=final), REQUEST, spec)
    assert torch.allclose(last, torch.tensor(final))


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"id": "run/7/g0"}, "answers request"),
        ({"prompt_tokens": 4}, "saw 4 prompt tokens"),
        ({"hidden_states": [ROWS[:2]]}, "2 hidden-state rows for a 3-token prompt"),
        ({"hidden_states": [[r[:3] for r in ROWS]]}, "rows of 3 values"),
        ({"hidden_states": [[ROWS[0], ROWS[1][:2], ROWS[2]]]}, "ragged"),
        ({"hidden_states": None}, "--enable-return-hidden-states"),
        ({"last_hidden_states": [[0.0, 0.0]]}, "last_hidden_states has shape"),
    ],
)
def test_wrong_sglang_replies_are_mismatches(meta, message):
    with pytest.raises(CaptureMismatch, match=message):
        split_sglang_hidden(_body(**meta), REQUEST, SPEC)


def test_an_answer_without_meta_info_is_a_mismatch():
    with pytest.raises(CaptureMismatch, match="no meta_info"):
        split_sglang_hidden({"text": "hi"}, REQUEST, SPEC)


# ------------------------------------------------- payloads of SGLang 0.5.23's real shape
# batch_result_processor appends one 2-D entry per prefill chunk, decode steps extend the list
# with 1-D rows, and output_streamer cuts the entries to finished_len.


def test_several_prefill_chunks_are_joined_and_decode_rows_dropped():
    # Chunked prefill of 2 + 1 rows, then one decode row: finished_len = 3 keeps all of it.
    body = _body(hidden_states=[ROWS[:2], ROWS[2:], [7.0, 7.0, 7.0, 7.0]])
    hidden, _ = split_sglang_hidden(body, REQUEST, SPEC)
    assert hidden.tolist() == [[3.0, 3.5, 1.0, 1.5], [4.0, 4.5, 2.0, 2.5], [6.0, 6.5, 5.0, 5.5]]


def test_chunks_cut_away_by_finished_len_are_a_mismatch_naming_the_flags():
    # finished_len = 1 (one generated token) keeps only the first of two prefill chunks.
    chunks = [ROWS[:2], ROWS[2:]]
    body = _body(hidden_states=chunks[:1])
    with pytest.raises(CaptureMismatch, match="2 hidden-state rows for a 3-token prompt") as err:
        split_sglang_hidden(body, REQUEST, SPEC)
    assert "--chunked-prefill-size -1" in str(err.value)


def test_without_the_plugin_the_launch_command_prefills_each_prompt_in_one_chunk(tmp_path):
    cfg = make_config(Path("/m"), tmp_path, disaggregated={"capture": "sglang"})
    for interface in ("0.5.23", "aux-capture"):
        # This interpreter has no plugin installed: detected, not assumed.
        cmd = sglang_command(cfg, port=1, interface=interface)
        assert cmd[cmd.index("--chunked-prefill-size") + 1] == "-1"
        # The plugin collects every chunk itself: SGLang keeps its own chunk size.
        with_plugin = sglang_command(cfg, port=1, interface=interface, plugin=True)
        assert "--chunked-prefill-size" not in with_plugin
        assert "--enable-return-hidden-states" in with_plugin


# ------------------------------------------------ the fast JSON path: no Python list of lists


def _dumps(body, spaced: bool) -> bytes:
    import json

    import orjson

    return json.dumps(body).encode() if spaced else orjson.dumps(body)


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    decode_rows=st.integers(0, 2),
    spaced=st.booleans(),
    scale=st.sampled_from([1.0, 1e-6, 3e7]),
)
def test_the_fast_json_path_reads_what_json_loads_reads(chunks, decode_rows, spaced, scale):
    from specdraft.trainer.disagg.capture.sglang_client import decode_reply

    torch.manual_seed(len(chunks))
    seq = sum(chunks)
    request = CaptureRequest("run", 7, 1, list(range(seq)), [1] * seq)
    rows = (torch.randn(seq, 4) * scale).to(torch.bfloat16).float().tolist()
    entries, at = [], 0
    for size in chunks:
        entries.append(rows[at : at + size])
        at += size
    entries += [[9.5, -1.0, 2e-08, 0.0]] * decode_rows
    body = {
        "text": 'a "hidden_states": [1]',
        "meta_info": {"id": "run/7/g1", "hidden_states": entries},
    }
    raw = _dumps(body, spaced)
    decoded, numeric = decode_reply(raw, "reply")
    assert set(numeric) == {"hidden_states"} and decoded["text"] == body["text"]
    fast, _ = split_sglang_hidden(decoded, request, SPEC, numeric=numeric)
    slow, _ = split_sglang_hidden(body, request, SPEC)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([[[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]]], "rows of 4 and 3 values"),
        ([[[1.0, None, 3.0, 4.0]]], "other than numbers"),
        ([[[[1.0, 2.0, 3.0, 4.0]]]], "nested"),
        (b"[[[1.0,,3.0,4.0]]]", "3 numbers where the layout holds 4"),
        (b"[[[1.0,2-0,3.0,4.0]]]", "not a number"),
        (b"[[[1.0,2.0,3.0,4.0] [5.0]]]", "not a list of rows"),
    ],
)
def test_bad_json_rows_are_mismatches(entries, message):
    from specdraft.trainer.disagg.capture.sglang_client import decode_reply

    if isinstance(entries, bytes):  # what no JSON encoder writes, but a broken server might
        raw = b'{"meta_info":{"hidden_states":' + entries + b"}}"
    else:
        raw = _dumps({"meta_info": {"hidden_states": entries}}, False)
    with pytest.raises(CaptureMismatch, match=message):
        decode_reply(raw, "reply")


# --------------------------------------------- the plugin path: SGLang writes, the client checks

SECRET = "c0" * 32


@pytest.fixture
def plugin_handoff(tmp_path, monkeypatch, target):
    """A plugin-equipped hand-off for run `testrun` (DSpark layers 2, 0 of the tiny target),
    writing into tmp_path/run's local store; disarmed after the test."""
    from specdraft_sglang_plugin import feature_store

    from specdraft.trainer.disagg.capture.sglang_launcher import plugin_environment

    cfg = make_config(target, tmp_path / "run", algorithm="dspark", layer_ids=(2, 0))
    monkeypatch.setenv(*next(iter(plugin_environment(cfg, SECRET).items())))
    yield sglang_stub.prefill_handoff()
    feature_store.disable()


def test_with_the_plugin_sglang_writes_every_chunk_and_the_reply_is_a_reference(
    target, tmp_path, plugin_handoff, caplog
):
    spec = capture_spec((2, 0), 64, algorithm="dspark")
    store = LocalFeatureStore(local_store_root(tmp_path / "run"))
    stub_target = load_capture_target(target, [0, 2], dtype="float32")
    with SGLangStub(
        stub_target, model_path=str(target), final_state=True, chunk_size=3, handoff=plugin_handoff
    ) as stub:
        client = SGLangCaptureClient(stub.url, spec, store, secret=SECRET)
        with caplog.at_level("INFO"):
            assert client.verify_server(timeout=30, run="testrun") is True
        assert "the specdraft plugin writes this run's features" in caplog.text
        reply = client.capture(CaptureRequest("testrun", 4, 2, PROMPT, MASK), timeout=60)
        # A client without the run's secret is a stranger: the stock answer (the last chunk's
        # rows only), and nothing written into the run's store for it.
        stranger = SGLangCaptureClient(stub.url, spec, LocalFeatureStore(tmp_path / "other"))
        with pytest.raises(CaptureMismatch, match="2 hidden-state rows for a 8-token"):
            stranger.capture(CaptureRequest("testrun", 5, 0, PROMPT, MASK), timeout=60)
    assert [t.name for t in reply.tensors] == [
        "input_ids",
        "loss_mask",
        "hidden_states",
        "target_last_hidden_states",
    ]
    sample = read_sample(store, reply)
    hidden, last = reference_features(target, PROMPT, [2, 0])
    tol = {"rtol": 1e-2, "atol": 1e-2}  # the plugin stores bf16, as the run's features are
    torch.testing.assert_close(sample["hidden_states"].float(), hidden, **tol)
    torch.testing.assert_close(sample["target_last_hidden_states"].float(), last, **tol)
    assert sample["input_ids"].tolist() == PROMPT and sample["loss_mask"].tolist() == MASK
    assert not any(k.startswith("testrun/5/") for k in _keys(store))


def _keys(store: LocalFeatureStore) -> list[str]:
    return [str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file()]


def test_a_write_that_fails_inside_sglang_is_a_capture_error_and_leaves_nothing(
    target, tmp_path, plugin_handoff
):
    from specdraft_sglang_plugin import feature_store

    spec = capture_spec((2, 0), 64, algorithm="dspark")
    store = LocalFeatureStore(local_store_root(tmp_path / "run"))
    broken = LocalFeatureStore(local_store_root(tmp_path / "run"))
    broken.put = lambda key, data: (_ for _ in ()).throw(StoreError(f"{key}: segment full"))
    stub_target = load_capture_target(target, [0, 2], dtype="float32")
    with SGLangStub(
        stub_target, model_path=str(target), final_state=True, handoff=plugin_handoff
    ) as stub:
        client = SGLangCaptureClient(stub.url, spec, store, secret=SECRET)
        feature_store._WRITER._store = broken
        with pytest.raises(CaptureRejected, match=r"503(.|\n)*segment full"):
            client.capture(CaptureRequest("testrun", 4, 0, PROMPT, MASK), timeout=60)
        assert store.bytes_resident() == 0
        feature_store._WRITER._store = store  # the retry, on the same server
        reply = client.capture(CaptureRequest("testrun", 4, 1, PROMPT, MASK), timeout=60)
    assert reply.attempt == 1 and store.exists(reply.tensors[-1].key)


def test_a_reference_to_another_store_is_a_mismatch_and_the_token_rows_are_removed(
    target, tmp_path, plugin_handoff
):
    spec = capture_spec((2, 0), 64, algorithm="dspark")
    elsewhere = LocalFeatureStore(tmp_path / "not-the-runs-store")
    stub_target = load_capture_target(target, [0, 2], dtype="float32")
    with SGLangStub(
        stub_target, model_path=str(target), final_state=True, handoff=plugin_handoff
    ) as stub:
        client = SGLangCaptureClient(stub.url, spec, elsewhere, secret=SECRET)
        with pytest.raises(CaptureMismatch, match="writes into another store"):
            client.capture(CaptureRequest("testrun", 4, 0, PROMPT, MASK), timeout=60)
    assert elsewhere.bytes_resident() == 0


def test_a_stock_server_logs_the_json_cost_once_and_one_that_chunks_stops_the_run_early(
    target, stub_target, tmp_path, caplog
):
    spec = capture_spec([0, 2], 64, algorithm="dflash2")
    store = LocalFeatureStore(tmp_path)
    with SGLangStub(stub_target, model_path=str(target)) as stub:
        client = SGLangCaptureClient(stub.url, spec, store, secret=SECRET)
        with caplog.at_level("WARNING"):
            assert client.verify_server(timeout=30, run="testrun") is False
        assert "sends hidden states as JSON" in caplog.text and "per 1,000-token" in caplog.text
        assert "pip install --no-deps specdraft-sglang-plugin" in caplog.text
        assert client.capture(CaptureRequest("testrun", 1, 0, PROMPT, MASK), timeout=60)
    # Stock 0.5.23 with chunked prefill keeps the last chunk's rows only: the start-up probe
    # finds out, before any window is planned, and names both fixes.
    with SGLangStub(stub_target, model_path=str(target), chunk_size=4) as stub:
        client = SGLangCaptureClient(stub.url, spec, store, secret=SECRET)
        with pytest.raises(CaptureRejected, match=r"probe failed(.|\n)*size -1(.|\n)*plugin"):
            client.verify_server(timeout=30, run="testrun")


@pytest.mark.slow
def test_managed_launch_with_the_plugin_writes_features_from_inside_the_server(target, tmp_path):
    # The launcher writes the plugin's settings (0600) and hands them over in the environment;
    # the server prefills in chunks of 4 (no --chunked-prefill-size -1 with the plugin).
    cfg = make_config(
        target,
        tmp_path,
        layer_ids=(2, 0),
        disaggregated={"capture": "sglang", "health_timeout_s": 120},
    )
    log = tmp_path / "logs" / "sglang.log"
    store = LocalFeatureStore(local_store_root(tmp_path))
    with ManagedSGLang(
        cfg, port=_free_port(), log_path=log, module=STUB, secret=SECRET, plugin=True
    ) as server:
        assert "--chunked-prefill-size" not in server.command
        settings = Path(server.env["SPECDRAFT_SGLANG_CAPTURE"])
        assert settings.stat().st_mode & 0o077 == 0 and SECRET in settings.read_text()
        client = SGLangCaptureClient(
            server.url, capture_spec((2, 0), 64, algorithm="dflash2"), store, secret=SECRET
        )
        assert client.verify_server(timeout=30, run="testrun") is True
        reply = client.capture(CaptureRequest("testrun", 4, 0, PROMPT, MASK), timeout=60)
    sample = read_sample(store, reply)
    hidden, _ = reference_features(target, PROMPT, [2, 0])
    torch.testing.assert_close(sample["hidden_states"].float(), hidden, rtol=1e-2, atol=1e-2)
    assert SECRET not in log.read_text()  # the secret travels in the 0600 file only
