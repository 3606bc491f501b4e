"""The Mooncake feature store against a real `mooncake_master` on loopback.

Some of Mooncake's sockets bind all interfaces, so these tests run inside a private network
namespace: `test_mooncake_store_in_a_network_namespace` re-runs this file under `unshare -n`
(loopback only) with SPECDRAFT_IN_NETNS=1; outside it the namespace tests are skipped, inside
it the wrapper is. Clients bind the transfer engine to 127.0.0.1 (MC_TCP_BIND_ADDRESS).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from disagg_support import build_random_target, make_config, reference_features, unshare_problem
from system_support import require_mooncake, require_namespace_tools

from specdraft.config.stores.mooncake import MooncakeConfig
from specdraft.trainer.disagg.capture import HttpCaptureClient
from specdraft.trainer.disagg.capture.server import build_capture_server
from specdraft.trainer.disagg.store import (
    StoreKeyMissing,
    StoreUnavailable,
    open_store,
    read_sample,
)
from specdraft.trainer.disagg.store.mooncake import MooncakeFeatureStore
from specdraft.trainer.disagg.store.mooncake_master import MooncakeMaster, start_master
from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec, sample_key
from specdraft.trainer.runtime.service_process import ServiceError

pytestmark = pytest.mark.mooncake

IN_NETNS = os.environ.get("SPECDRAFT_IN_NETNS") == "1"
inside = pytest.mark.skipif(not IN_NETNS, reason="runs inside the network namespace wrapper")
outside = pytest.mark.skipif(IN_NETNS, reason="needs no namespace; already run outside it")


@pytest.mark.slow
@pytest.mark.skipif(IN_NETNS, reason="this is the wrapper; its body runs outside the namespace")
def test_mooncake_store_in_a_network_namespace():
    # A missing package fails with the command that installs it (make setup installs them).
    require_mooncake()
    require_namespace_tools()
    problem = unshare_problem()
    if problem:
        pytest.skip(problem)
    env = {**os.environ, "SPECDRAFT_IN_NETNS": "1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
    script = 'ip link set lo up && exec "$0" -m pytest -q -x -p no:cacheprovider "$1"'
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", script, sys.executable, __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" in done.stdout  # the wrapper itself skips


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with MooncakeMaster("127.0.0.1", _free_port(), metrics_port=_free_port(), log_path=log) as m:
        yield m


def _cfg(master: MooncakeMaster, **changes) -> MooncakeConfig:
    values = {
        "master_address": master.address,
        "metrics_port": master.metrics_port,
        "global_segment_size_mb": 64,
        "local_buffer_size_mb": 16,
    }
    return MooncakeConfig(**{**values, **changes})


@inside
def test_put_get_remove_on_loopback(master):
    with (
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="capture") as writer,
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="trainer") as reader,
    ):
        key = sample_key("run", 1, 0, "hidden_states")
        data = os.urandom(100_000)
        assert not reader.exists(key)
        writer.put(key, memoryview(data))
        assert reader.exists(key) and reader.get(key) == data
        writer.put(key, b"replaced")  # a put replaces, as in the local store
        assert reader.get(key) == b"replaced"
        # A reader's lease would block a plain remove; force drops it at once.
        reader.remove(key, force=True)
        reader.remove(key, force=True)  # idempotent
        assert not writer.exists(key)
        with pytest.raises(StoreKeyMissing, match="run/1/g0/hidden_states"):
            reader.get(key)


@inside
def test_objects_larger_than_the_local_buffer_round_trip(master):
    """16 MiB transfer buffers, a 40 MiB object: registered-buffer paths both ways."""
    with (
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="capture") as writer,
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="trainer") as reader,
    ):
        key = sample_key("run", 2, 0, "hidden_states")
        data = os.urandom(40 << 20)
        writer.put(key, data)
        assert reader.get(key) == data
        reader.remove(key)


@inside
def test_bytes_resident_counts_every_writer(master):
    with (
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="capture") as a,
        MooncakeFeatureStore(_cfg(master), timeout_s=10, role="producer") as b,
    ):
        before = a.bytes_resident()
        a.put(sample_key("run", 3, 0, "input_ids"), b"x" * 3000)
        b.put(sample_key("run", 3, 0, "loss_mask"), b"y" * 5000)
        # Both clients read the master's total, not just their own objects.
        assert a.bytes_resident() - before == 8000 == b.bytes_resident() - before
        a.remove(sample_key("run", 3, 0, "loss_mask"))
        assert b.bytes_resident() - before == 3000
        b.remove(sample_key("run", 3, 0, "input_ids"))


@inside
def test_an_unreachable_master_fails_fast_with_the_field_to_fix():
    cfg = MooncakeConfig(master_address=f"127.0.0.1:{_free_port()}")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"not reachable at .*master_address"):
        MooncakeFeatureStore(cfg, timeout_s=1.0, role="trainer")
    assert time.monotonic() - started < 10  # Mooncake's own setup would retry for ~90 s


@inside
def test_the_managed_master_start_refuses_a_taken_port(master, tmp_path):
    cfg = _cfg(master)
    with pytest.raises(ServiceError, match="already taken"):
        start_master(cfg, tmp_path / "second.log", timeout=10)


@inside
def test_embedded_capture_into_mooncake_read_by_a_trainer(master, tmp_path):
    target = build_random_target(tmp_path / "target")
    mooncake = _cfg(master).model_dump()
    cfg = make_config(
        target,
        tmp_path,
        algorithm="dspark",
        disaggregated={"store": "mooncake", "mooncake": mooncake},
    )
    writer = open_store(cfg.deployment.disaggregated, tmp_path, role="capture")
    reader = open_store(cfg.deployment.disaggregated, tmp_path, role="trainer")
    prompt, mask = [5, 6, 7, 8, 9], [0, 1, 1, 1, 1]
    try:
        assert isinstance(writer, MooncakeFeatureStore)
        spec = capture_spec([0, 2], 64, algorithm="dspark")
        with build_capture_server(cfg, writer) as server:
            reply = HttpCaptureClient(server.url, spec).capture(
                CaptureRequest("testrun", 8, 0, prompt, mask), timeout=60
            )
        sample = read_sample(reader, reply)
        hidden, last = reference_features(target, prompt, [0, 2])
        torch.testing.assert_close(sample["hidden_states"], hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sample["target_last_hidden_states"], last, rtol=1e-5, atol=1e-5)
        # Acknowledged: the producer removes with force.
        for key in reply.keys():  # noqa: SIM118 (a reply is no dict)
            reader.remove(key, force=True)
        assert not any(writer.exists(key) for key in reply.keys())  # noqa: SIM118
    finally:
        reader.close()
        writer.close()


@inside
def test_the_sglang_plugin_writes_into_mooncake_and_a_trainer_reads_it(master, tmp_path):
    # SGLang's side: the plugin's own hook (in the SGLang stand-in, prefilling in chunks of 2)
    # writes into Mooncake from a client of its own; the producer's client checks the
    # reference against its store and a trainer reads the sample back.
    import sglang_stub
    from specdraft_sglang_plugin import feature_store

    from specdraft.trainer.disagg.capture.sglang_client import SGLangCaptureClient
    from specdraft.trainer.disagg.capture.sglang_launcher import plugin_environment
    from specdraft.trainer.disagg.capture.target import load_capture_target

    target = build_random_target(tmp_path / "target")
    mooncake = _cfg(master).model_dump()
    cfg = make_config(
        target,
        tmp_path,
        algorithm="dspark",
        disaggregated={"store": "mooncake", "mooncake": mooncake},
    )
    secret = "7d" * 32
    os.environ.update(plugin_environment(cfg, secret))
    producer = open_store(cfg.deployment.disaggregated, tmp_path, role="producer")
    reader = open_store(cfg.deployment.disaggregated, tmp_path, role="trainer")
    prompt, mask = [5, 6, 7, 8, 9], [0, 1, 1, 1, 1]
    try:
        stub = sglang_stub.SGLangStub(
            load_capture_target(target, [0, 2], dtype="float32"),
            model_path=str(target),
            final_state=True,
            chunk_size=2,
            handoff=sglang_stub.prefill_handoff(),
        )
        with stub:
            client = SGLangCaptureClient(
                stub.url, capture_spec([0, 2], 64, algorithm="dspark"), producer, secret=secret
            )
            assert client.verify_server(timeout=30, run="testrun") is True
            reply = client.capture(CaptureRequest("testrun", 8, 0, prompt, mask), timeout=60)
        sample = read_sample(reader, reply)
        hidden, last = reference_features(target, prompt, [0, 2])
        tol = {"rtol": 1e-2, "atol": 1e-2}  # stored as bf16
        torch.testing.assert_close(sample["hidden_states"].float(), hidden, **tol)
        torch.testing.assert_close(sample["target_last_hidden_states"].float(), last, **tol)
        for key in reply.keys():  # noqa: SIM118 (a reply is no dict)
            reader.remove(key, force=True)
        assert not any(producer.exists(key) for key in reply.keys())  # noqa: SIM118
    finally:
        os.environ.pop("SPECDRAFT_SGLANG_CAPTURE", None)
        writer = feature_store._WRITER
        if writer is not None and writer._store is not None:
            writer._store.close()
        feature_store.disable()
        reader.close()
        producer.close()


@outside
def test_master_command_binds_loopback_only():
    from specdraft.trainer.disagg.store.mooncake_master import master_command

    cmd = master_command("127.0.0.1", 50051, metrics_port=9003, binary="mooncake_master")
    assert "-rpc_address=127.0.0.1" in cmd and "-metrics_host=127.0.0.1" in cmd
    assert "-rpc_port=50051" in cmd and "-enable_http_metadata_server=false" in cmd


@outside
def test_a_bad_master_address_names_the_field(tmp_path):
    cfg = make_config(
        Path("/t"),
        tmp_path,
        disaggregated={"store": "mooncake", "mooncake": {"master_address": "nohost"}},
    )
    with pytest.raises(ValueError, match=r"mooncake\.master_address = 'nohost'"):
        open_store(cfg.deployment.disaggregated, tmp_path, role="trainer")
