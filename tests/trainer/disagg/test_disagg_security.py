"""The disaggregated runtime against a hostile neighbour on the same machine: the run's secret on
every request, one run per capture server, bounded HTTP input and threads, private run folders
and file modes, and a loopback rendezvous."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
import torch
from disagg_runtime import (
    FakeCapture,
    make_prompts,
    running_producer,
    runtime_config,
    spec_for,
)

from specdraft.trainer.disagg.capture.client import HttpCaptureClient
from specdraft.trainer.disagg.capture.server import build_capture_server
from specdraft.trainer.disagg.consumer.client import WindowClient
from specdraft.trainer.disagg.consumer.fetch import fetch_micro_batches
from specdraft.trainer.disagg.producer import (
    Producer,
    ProducerSettings,
    WindowController,
    ledger_path,
)
from specdraft.trainer.disagg.producer.ledger import read_ledger
from specdraft.trainer.disagg.producer.main import plan_prompts
from specdraft.trainer.disagg.producer.prompts import screen_prompts
from specdraft.trainer.disagg.store import local_store_root
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.wire import CaptureRejected, CaptureRequest
from specdraft.trainer.disagg.wire.windows import controller_address_path, write_controller_address
from specdraft.trainer.runtime.http_client import HttpFailure, call_json
from specdraft.trainer.runtime.http_server import JsonServer, json_too_deep
from specdraft.trainer.runtime.run_secret import (
    SecretError,
    ensure_run_secret,
    read_run_secret,
    run_secret_path,
)
from specdraft.trainer.runtime.service_process import ServiceProcess

SECRET = "s3cret-for-tests"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _raw(url: str, request: bytes, *, timeout: float = 10.0) -> tuple[int, object]:
    """Send raw bytes to a server and read its whole answer: (status, decoded JSON body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data, "the server closed the connection without an answer"
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body or b"null")


def _post(path: str, body: bytes, *, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _length(body: bytes) -> dict[str, str]:
    return {"Content-Length": str(len(body))}


@pytest.fixture
def echo():
    """A JsonServer with the run secret, a small body cap and a route that records calls."""
    calls: list[object] = []

    def record(body: object) -> tuple[int, object]:
        calls.append(body)
        return 200, {"got": body}

    routes = {("POST", "/echo"): record, ("GET", "/health"): lambda _: (200, {"status": "ok"})}
    with JsonServer(routes, secret=SECRET, max_body_bytes=4096) as server:
        yield server, calls


# --------------------------------------------------------------------------- the run's secret


def test_a_request_without_the_secret_gets_401_and_reaches_no_route(echo):
    server, calls = echo
    for secret in (None, "wrong", SECRET + "x", SECRET[:-1]):
        with pytest.raises(HttpFailure) as info:
            call_json("POST", f"{server.url}/echo", {"a": 1}, timeout=10, secret=secret)
        assert info.value.status == 401
        assert "disagg/secret" in str(info.value)
    assert calls == []
    assert call_json("POST", f"{server.url}/echo", {"a": 1}, timeout=10, secret=SECRET) == {
        "got": {"a": 1}
    }
    assert calls == [{"a": 1}]
    # Liveness is the one open route: it changes nothing.
    assert call_json("GET", f"{server.url}/health", timeout=10) == {"status": "ok"}


def test_the_run_secret_is_created_once_private_and_shared(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDRAFT_RUN_SECRET", raising=False)
    assert read_run_secret(tmp_path) is None
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_run_secret(tmp_path)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every racer gets the one secret that won; 256 random bits, hex.
    assert len(set(results)) == 1 and len(results[0]) == 64
    path = run_secret_path(tmp_path)
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert read_run_secret(tmp_path) == results[0]
    monkeypatch.setenv("SPECDRAFT_RUN_SECRET", "from-env")
    assert ensure_run_secret(tmp_path) == "from-env"


def test_a_secret_readable_by_others_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDRAFT_RUN_SECRET", raising=False)
    path = run_secret_path(tmp_path)
    ensure_run_secret(tmp_path)
    path.chmod(0o644)
    with pytest.raises(SecretError, match=r"chmod 600 .*disagg/secret"):
        read_run_secret(tmp_path)


def _loss(cfg, rows: list[dict[str, torch.Tensor]]) -> float:
    """The draft's loss on these rows, with a fixed draft (seeded) and fixed anchors."""
    from specdraft.trainer.models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
    )

    pad = max(len(r["input_ids"]) for r in rows)

    def stack(name: str) -> torch.Tensor:
        padded = []
        for r in rows:
            t = r[name]
            extra = [0, 0] * (t.dim() - 1) + [0, pad - t.shape[0]]
            padded.append(torch.nn.functional.pad(t, extra))
        return torch.stack(padded)

    batch = {
        name: stack(name)
        for name in ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states")
    }
    batch["sample_id"] = torch.stack([r["sample_id"] for r in rows])
    torch.manual_seed(0)
    draft = build_draft(cfg.model, load_target_config(cfg.model.target), dtype=torch.float32)
    head = load_target_head(cfg.model.target, torch.float32)
    with torch.no_grad():
        out = draft(batch, head, DraftTrainSpec(num_anchors=4, loss_decay_gamma=4.0))
    return float(out.numerator / out.denominator)


def _authenticated_run(cfg, run_dir: Path, prompts, secret: str):
    store = LocalFeatureStore(local_store_root(run_dir))
    server = build_capture_server(cfg, store, secret=secret).start()
    good, bad = screen_prompts(prompts, max_length=cfg.data.max_length)
    producer = Producer(
        ProducerSettings.from_config(cfg),
        plan_prompts(cfg, good),
        good,
        store,
        [HttpCaptureClient(server.url, server.spec, secret=secret)],
        run_dir,
        bad_prompts=bad,
    )
    controller = WindowController(producer, secret=secret).start()
    write_controller_address(run_dir, controller.url)
    producer.start()
    return store, server, producer, controller


def _controller_events(run_dir: Path) -> list[dict]:
    return [r for r in read_ledger(ledger_path(run_dir)) if r["ev"] in ("ack", "resume")]


def test_spoofed_window_capture_ack_and_resume_without_the_secret_change_nothing(
    tiny_qwen3_target, tmp_path, monkeypatch
):
    """The spoofing attack: read a window's keys, overwrite its features through
    /capture (the loss moved 7.548 -> 7.988), kill the run with /ack, roll it back with
    /resume. Without the run's secret each is a 401, and the loss stays what it was."""
    monkeypatch.delenv("SPECDRAFT_RUN_SECRET", raising=False)
    cfg = runtime_config(
        tiny_qwen3_target.path,
        tmp_path,
        world_size=1,
        grad_accum_steps=1,
        num_epochs=1,
        algorithm="dspark",
    )
    secret = ensure_run_secret(tmp_path)
    store, server, producer, controller = _authenticated_run(
        cfg, tmp_path, make_prompts(6, vocab=90), secret
    )
    try:
        # A trainer finds the secret in the run folder, as the ranks of a run do.
        trainer = WindowClient(rank=0, timeout_s=30, run_dir=tmp_path)
        refs = trainer.next_window(0)
        rows = [row for micro in fetch_micro_batches(store, refs) for row in micro]
        loss = _loss(cfg, rows)

        window = {"step": 0, "rank": 0, "wait_s": 1.0}
        for spoof in (None, "0" * 64):
            with pytest.raises(HttpFailure) as info:
                call_json("POST", f"{controller.url}/window", window, timeout=10, secret=spoof)
            assert info.value.status == 401
        target = refs[0][0]
        n = target.seq_len
        forged = CaptureRequest(target.run, target.sample_id, target.attempt, [7] * n, [1] * n)
        for spoof in (None, "0" * 64):
            with pytest.raises(CaptureRejected, match="401"):
                HttpCaptureClient(server.url, server.spec, secret=spoof).capture(forged, timeout=30)
        # No capture count here: the producer legitimately captures later windows meanwhile.
        # The forged request targets this window's keys, so its bytes are what must not move.
        after = [row for micro in fetch_micro_batches(store, refs) for row in micro]
        for a, b in zip(rows, after, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)
        assert _loss(cfg, after) == loss
        # The overwrite would have moved the loss: the check above can fail.
        moved = [dict(r, hidden_states=r["hidden_states"] + 1.0) for r in rows]
        assert _loss(cfg, moved) != loss

        events = _controller_events(tmp_path)
        for path, body in (
            ("/ack", {"step": 0, "rank": 0}),
            ("/resume", {"step": 0, "rank": 0, "incarnation": "spoof"}),
        ):
            with pytest.raises(HttpFailure) as info:
                call_json("POST", f"{controller.url}{path}", body, timeout=10)
            assert info.value.status == 401
        assert _controller_events(tmp_path) == events
        # The real rank goes on: its acknowledgement is the first and only one.
        trainer.ack(0)
        assert [r["ev"] for r in _controller_events(tmp_path)] == [e["ev"] for e in events] + [
            "ack"
        ]
    finally:
        controller.stop()
        producer.stop()
        server.stop()


def test_the_capture_server_refuses_another_runs_ids_and_writes_nothing(
    tiny_qwen3_target, tmp_path
):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, world_size=1)
    store = LocalFeatureStore(tmp_path / "fs")
    server = build_capture_server(cfg, store, secret=SECRET).start()
    client = HttpCaptureClient(server.url, server.spec, secret=SECRET)
    try:
        with pytest.raises(CaptureRejected, match=r"403.*'testrun', not 'otherrun'.*run_id"):
            client.capture(CaptureRequest("otherrun", 3, 0, [4, 5, 6], [0, 1, 1]), timeout=30)
        assert store.bytes_resident() == 0 and not (tmp_path / "fs" / "otherrun").exists()
        reply = client.capture(CaptureRequest("testrun", 3, 0, [4, 5, 6], [0, 1, 1]), timeout=30)
        assert reply.run == "testrun" and store.bytes_resident() > 0
    finally:
        server.stop()


# ------------------------------------------------------------------------ hostile HTTP input


@pytest.mark.parametrize(
    ("length", "status"),
    [
        ("-1", 400),  # read to EOF: bypassed the 64 MB cap
        ("abc", 400),  # int() raised: the thread died without a reply
        ("1e3", 400),
        ("0x10", 400),
        ("4097", 413),  # over this server's cap
        ("99999999999999999999999", 400),
    ],
)
def test_a_bad_content_length_gets_a_reply_and_the_server_keeps_serving(echo, length, status):
    server, calls = echo
    auth = {"Authorization": f"Bearer {SECRET}"}
    got, body = _raw(server.url, _post("/echo", b"", headers={**auth, "Content-Length": length}))
    assert got == status
    assert "Content-Length" in body["error"] or "limit" in body["error"]
    assert calls == []
    assert call_json("POST", f"{server.url}/echo", [1], timeout=10, secret=SECRET) == {"got": [1]}


def test_conflicting_lengths_and_chunked_bodies_are_refused(echo):
    server, calls = echo
    auth = {"Authorization": f"Bearer {SECRET}"}
    two = _post("/echo", b"", headers=auth).replace(
        b"\r\n\r\n", b"\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 1
    )
    assert _raw(server.url, two + b"[]")[0] == 400
    chunked = _post(
        "/echo", b"2\r\n[]\r\n0\r\n\r\n", headers={**auth, "Transfer-Encoding": "chunked"}
    )
    assert _raw(server.url, chunked)[0] == 411
    assert calls == []


def test_deeply_nested_json_and_non_finite_numbers_get_a_400_reply(echo):
    server, calls = echo
    auth = {"Authorization": f"Bearer {SECRET}"}
    deep = b"[" * 2000 + b"]" * 2000  # json.loads died of RecursionError, without a reply
    status, body = _raw(server.url, _post("/echo", deep, headers={**auth, **_length(deep)}))
    assert status == 400 and "deeper than" in body["error"]
    for text in (b'{"x": NaN}', b"[Infinity]", b"-Infinity"):
        status, body = _raw(server.url, _post("/echo", text, headers={**auth, **_length(text)}))
        assert status == 400, text
    assert calls == []
    # Brackets inside strings are text, not nesting.
    text = json.dumps({"s": "[[[[" * 50 + '\\"{{{'}).encode()
    assert not json_too_deep(text)
    status, body = _raw(server.url, _post("/echo", text, headers={**auth, **_length(text)}))
    assert status == 200 and body == {"got": json.loads(text)}


def test_idle_connections_hold_no_thread_and_are_closed_after_the_idle_timeout():
    """300 idle connections made 310 threads; now they wait without one, and a real request
    is still answered at once."""
    routes = {("GET", "/health"): lambda _: (200, {"status": "ok"})}
    with JsonServer(routes, max_workers=4, idle_timeout_s=3.0) as server:
        call_json("GET", f"{server.url}/health", timeout=10)
        baseline = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
        try:
            time.sleep(0.5)
            assert threading.active_count() <= baseline + 3
            started = time.monotonic()
            assert call_json("GET", f"{server.url}/health", timeout=10) == {"status": "ok"}
            assert time.monotonic() - started < 2.0
            assert threading.active_count() <= baseline + 3
            assert server.worker_count <= 4
            # The server closes connections that never send a request.
            idle[0].settimeout(10)
            assert idle[0].recv(1) == b""
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.parametrize("wait", [b"NaN", b"1e999", b'"nan"', b"-1", b"true"])
def test_a_window_request_with_a_non_finite_or_bad_wait_is_a_400(tiny_qwen3_target, tmp_path, wait):
    cfg = runtime_config(tiny_qwen3_target.path, tmp_path, world_size=1, num_epochs=1)
    capture = FakeCapture(None, spec_for(cfg, 32))
    with running_producer(cfg, tmp_path, make_prompts(4), [capture]) as rt:
        capture.store = rt.store
        body = b'{"step": 0, "rank": 0, "wait_s": ' + wait + b"}"
        started = time.monotonic()
        status, reply = _raw(rt.controller.url, _post("/window", body, headers=_length(body)))
        assert status == 400
        assert "wait_s" in reply["error"] or "not a number" in reply["error"]
        assert time.monotonic() - started < 5.0


# ----------------------------------------------------------------------------- private files


@pytest.mark.subprocess
def test_the_store_the_address_file_and_the_logs_are_private(tmp_path):
    store = LocalFeatureStore(tmp_path / "run" / "feature-store")
    store.put("testrun/4/g0/input_ids", b"abc")
    assert _mode(tmp_path / "run" / "feature-store") == 0o700
    for folder in ("testrun", "testrun/4", "testrun/4/g0"):
        assert _mode(tmp_path / "run" / "feature-store" / folder) == 0o700, folder
    assert _mode(tmp_path / "run" / "feature-store" / "testrun/4/g0/input_ids") == 0o600
    write_controller_address(tmp_path / "run", "http://127.0.0.1:1")
    assert _mode(controller_address_path(tmp_path / "run")) == 0o600
    assert _mode(controller_address_path(tmp_path / "run").parent) == 0o700
    service = ServiceProcess("echo", ["true"], tmp_path / "run" / "logs" / "echo.log")
    service.popen.wait(timeout=30)
    assert _mode(tmp_path / "run" / "logs") == 0o700
    assert _mode(tmp_path / "run" / "logs" / "echo.log") == 0o600


# --------------------------------------------------------------------------- the rendezvous


@pytest.mark.distributed
def test_the_rendezvous_store_listens_on_loopback_only_for_a_single_node_run():
    """Torch's static rendezvous listened on every interface; ours binds 127.0.0.1."""
    import rendezvous_probe

    from specdraft.trainer.launch import LaunchPlan, launch, rendezvous_host

    # A user's --master-addr does not widen a single-node run; a multi-node one uses it.
    assert rendezvous_host(LaunchPlan(nproc_per_node=2, master_addr="10.1.2.3")) == "127.0.0.1"
    assert rendezvous_host(LaunchPlan(2, nnodes=2, master_addr="10.1.2.3")) == "10.1.2.3"
    seen = launch(LaunchPlan(nproc_per_node=2), rendezvous_probe.probe)
    assert seen["rank"] == 0 and seen["master_addr"] == "127.0.0.1"
    assert seen["listening"] == ["127.0.0.1"], seen
    # The ranks' gloo pairs are kept on loopback too (IPv4 127.0.0.1 in /proc's byte order).
    assert seen["gloo_ifname"] == "lo"
    assert seen["gloo_listening"] and set(seen["gloo_listening"]) == {"0100007F"}, seen


def test_a_master_addr_that_is_not_this_machine_is_named(tmp_path):
    from specdraft.trainer.launch import bind_listener

    with pytest.raises(OSError, match=r"192\.0\.2\.1:.*--master-addr"):
        bind_listener("192.0.2.1", 0)  # TEST-NET-1: never an address of this machine
    sock = bind_listener("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


@pytest.mark.subprocess
def test_a_lone_rank_listens_on_loopback_only(tmp_path):
    """A one-process run made its group's store from tcp://127.0.0.1:PORT, which listened on
    every interface all the same."""
    import subprocess
    import sys

    import rendezvous_probe

    script = (
        "import json, rendezvous_probe as p\n"
        "from specdraft.trainer.runtime.distributed import init_distributed, "
        "shutdown_distributed\n"
        "init_distributed()\n"
        "print(json.dumps(p.own_listening_addresses()))\n"
        "shutdown_distributed()\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
        "PYTHONPATH": str(Path(rendezvous_probe.__file__).parent),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    listening = json.loads(done.stdout.strip().splitlines()[-1])
    # The store on 127.0.0.1 (gloo's pair follows the host name); nothing on a wildcard
    # address (all zeros, IPv4 or IPv6), where the store used to listen.
    assert "0100007F" in listening, listening
    assert not any(set(address) == {"0"} for address in listening), listening
