"""`specdraft regenerate --endpoint`: a local OpenAI-compatible chat server backed by the tiny
target stands in for SGLang; its answers must be the ones the in-process path writes."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time

import pytest
import torch
from click.testing import CliRunner
from train_support import single_thread

from specdraft.cli.main import cli
from specdraft.trainer.runtime.http_server import JsonServer


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


CHATS = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "Hi! What can you do?"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": "Show me an example in python."},
            {"from": "gpt", "value": "old"},
        ],
    },
    {
        "id": "b",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three colours."},
            {"role": "assistant", "content": "old"},
        ],
    },
    {
        "id": "c",
        "conversations": [{"from": "human", "value": "Why?"}, {"from": "gpt", "value": "x"}],
    },
]


class ChatServer:
    """/v1/models and /v1/chat/completions over the tiny target: the tokenizer's chat template,
    greedy decoding (temperature 0 only), one request at a time, like a one-model server."""

    def __init__(self, target_path: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(target_path)
        self.model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.server = JsonServer(
            {
                ("GET", "/v1/models"): lambda _: (200, {"data": [{"id": "tiny-target"}]}),
                ("POST", "/v1/chat/completions"): self.complete,
            }
        )

    def complete(self, body):
        if body.get("temperature") != 0 or body.get("model") != "tiny-target":
            return 400, {"error": "this server only decodes greedily, for model tiny-target"}
        self.requests.append(body)
        text = self.tokenizer.apply_chat_template(
            body["messages"], tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        eos = self.model.generation_config.eos_token_id
        with self.lock, torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=int(body["max_tokens"]),
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=self.model.generation_config.pad_token_id,
            )
        new = out[0, ids.shape[1] :].tolist()
        finish = "stop" if eos in new else "length"
        new = new[: new.index(eos)] if eos in new else new
        content = self.tokenizer.decode(new, skip_special_tokens=True)
        choice = {"index": 0, "message": {"role": "assistant", "content": content}}
        return 200, {"object": "chat.completion", "choices": [{**choice, "finish_reason": finish}]}


@pytest.fixture(scope="module")
def chat_server(tiny_target_path):
    server = ChatServer(str(tiny_target_path))
    with server.server:
        yield server


@pytest.fixture
def config_file(tiny_target_path, tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    path = tmp_path / "regen.toml"
    path.write_text(
        f"""
output_dir = "{tmp_path / "run"}"
[model]
target = "{tiny_target_path}"
algorithm = "dflash2"
block_size = 8
target_layer_ids = [0, 2]
mask_token_id = 4095
[model.dflash2]
selector_gold_policy = "insert"
[data]
train_paths = ["{chats}"]
max_length = 128
cache_dir = "{tmp_path / "cache"}"
"""
    )
    return path


def regenerate(args, *, progress=False):
    quiet = [] if progress else ["--no-progress"]
    result = CliRunner().invoke(cli, ["regenerate", *map(str, args), *quiet])
    return result


def test_endpoint_answers_equal_the_in_process_ones(chat_server, config_file, tmp_path):
    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    common = [config_file, "--max-new-tokens", 16, "--batch-size", 1]
    done = regenerate([*common, "--out", local])
    assert done.exit_code == 0, done.output
    done = regenerate([*common, "--out", remote, "--endpoint", chat_server.server.url])
    assert done.exit_code == 0, done.output
    assert "3 conversation(s) written" in done.output

    assert remote.read_text() == local.read_text()
    # Turn by turn: the second question of 'a' was asked after the regenerated first answer.
    first_answer = json.loads(remote.read_text().splitlines()[0])["conversations"][1]["value"]
    asked = [r["messages"] for r in chat_server.requests if len(r["messages"]) == 3]
    assert any(m[1] == {"role": "assistant", "content": first_answer} for m in asked)
    assert {r["max_tokens"] for r in chat_server.requests} <= set(range(1, 17))


def test_endpoint_runs_resume_and_accept_a_full_url(chat_server, config_file, tmp_path):
    out = tmp_path / "remote.jsonl"
    url = f"{chat_server.server.url}/v1/chat/completions"
    common = [
        config_file,
        "--max-new-tokens",
        8,
        "--out",
        out,
        "--endpoint",
        url,
        "--batch-size",
        1,
    ]
    assert regenerate([*common, "--count", 1]).exit_code == 0
    before = len(chat_server.requests)
    done = regenerate(common)
    assert done.exit_code == 0, done.output
    assert "1 already there" in done.output
    # Chunks of one conversation: 'a' is not asked again, 'b' and 'c' need one answer each.
    assert len(chat_server.requests) - before == 2
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b", "c"]


def test_an_unreachable_or_refusing_endpoint_is_a_clear_error(chat_server, config_file, tmp_path):
    from specdraft.trainer.runtime.distributed import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    done = regenerate([config_file, "--out", tmp_path / "x.jsonl", "--endpoint", dead])
    assert done.exit_code == 1
    assert f"--endpoint {dead}: cannot list its models" in done.output
    assert "--model NAME" in done.output

    url = chat_server.server.url
    args = ["--out", tmp_path / "y.jsonl", "--endpoint", url, "--model", "another-model"]
    done = regenerate([config_file, *args])
    assert done.exit_code == 1
    assert "answered 400: this server only decodes greedily" in done.output


# ------------------------------------------- canned servers: keys, bad answers, timeouts, Ctrl-C

API_KEY = "sk-specdraft-test-5f3c9a1e"


class CannedChat:
    """/v1/models and /v1/chat/completions answering from a table keyed by the last user turn:
    a string, or anything else (None, a list, a number) to send as `content` verbatim."""

    def __init__(self, answers, *, secret=None, delay_s=0.0):
        self.answers = answers
        self.delay_s = delay_s
        self.asked = threading.Event()
        self.release = threading.Event()
        self.headers_seen: list[str] = []
        self.server = JsonServer(
            {
                ("GET", "/v1/models"): lambda _: (200, {"data": [{"id": "canned"}]}),
                ("POST", "/v1/chat/completions"): self.complete,
            },
            secret=secret,
        )

    def complete(self, body):
        self.asked.set()
        if self.delay_s:
            self.release.wait(self.delay_s)
        question = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        content = self.answers.get(question, "Fine.")
        return 200, {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]
        }


def _files_text(folder):
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_an_api_key_is_sent_as_bearer_and_never_written(config_file, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    canned = CannedChat({}, secret=API_KEY)
    with canned.server:
        url = canned.server.url
        refused = regenerate([config_file, "--out", tmp_path / "no.jsonl", "--endpoint", url])
        assert refused.exit_code == 1
        assert "refused (401)" in refused.output and "--api-key" in refused.output
        assert "OPENAI_API_KEY" in refused.output

        out = tmp_path / "with-flag.jsonl"
        done = regenerate([config_file, "--out", out, "--endpoint", url, "--api-key", API_KEY])
        assert done.exit_code == 0, done.output
        assert "3 conversation(s) written" in done.output

        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        env_out = tmp_path / "with-env.jsonl"
        done = regenerate([config_file, "--out", env_out, "--endpoint", url])
        assert done.exit_code == 0, done.output
    assert env_out.read_text() == out.read_text()
    assert API_KEY not in done.output + refused.output
    # Not in the output files, their metadata, or anything else the runs left behind.
    assert API_KEY not in _files_text(tmp_path)


def test_null_or_non_string_content_is_a_counted_bad_answer(config_file, tmp_path):
    # 'a' gets null for its second question, 'b' a list of parts; 'c' a real answer.
    answers = {"Show me an example in python.": None, "Name three colours.": [{"text": "red"}]}
    canned = CannedChat(answers)
    out = tmp_path / "out.jsonl"
    with canned.server:
        done = regenerate([config_file, "--out", out, "--endpoint", canned.server.url])
    assert done.exit_code == 0, done.output
    assert "1 conversation(s) written" in done.output
    assert "2 bad_answer" in done.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["c"]
    assert rows[0]["conversations"][-1] == {"from": "gpt", "value": "Fine."}


def test_the_request_timeout_is_an_option(config_file, tmp_path):
    import time

    canned = CannedChat({}, delay_s=30)
    with canned.server:
        args = [config_file, "--out", tmp_path / "t.jsonl", "--endpoint", canned.server.url]
        for bad in ("0", "nan", "inf"):
            refused = regenerate([*args, "--timeout", bad])
            assert refused.exit_code != 0 and "timeout" in refused.output.lower(), refused.output
        started = time.monotonic()
        done = regenerate([*args, "--timeout", "0.3", "--batch-size", "1", "--retry-for", "0"])
        elapsed = time.monotonic() - started
        canned.release.set()
    assert done.exit_code == 1
    assert "timed out after 0.3 s" in done.output
    # 4 attempts of 0.3 s plus at most 1 + 2 + 4 s of back-off, not 4 x 600 s.
    assert elapsed < 20


@pytest.mark.subprocess
def test_ctrl_c_stops_a_pending_request_at_once(config_file, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    # The server would hold the request for 300 s; the old thread pool waited for it on exit.
    canned = CannedChat({}, delay_s=300)
    specdraft = Path(sys.executable).with_name("specdraft")
    lines: list[tuple[float, str]] = []
    with canned.server:
        args = ["--out", tmp_path / "c.jsonl", "--endpoint", canned.server.url, "--timeout", "600"]
        proc = subprocess.Popen(
            [specdraft, "regenerate", config_file, *args, "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # A terminal's Ctrl-C finds SIGINT deliverable; the test process may not pass it on
            # so (a signal mask or SIG_IGN inherited from whatever ran before in this worker).
            preexec_fn=_deliverable_sigint,
        )
        # The child's signal state, said on failure (a blocked or ignored SIGINT never lands).
        signal_state = _signal_state(proc.pid)

        def read() -> None:
            for line in proc.stdout:
                lines.append((time.monotonic(), line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert canned.asked.wait(120), "the command never sent a request"
            time.sleep(0.5)
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                # Say what the command printed, so a hang shows where it stopped.
                pytest.fail(
                    f"still running 120 s after Ctrl-C; its output: {lines}; "
                    f"its signal state at start: {signal_state}"
                )
            exited_after = time.monotonic() - sent
            reader.join(10)
        finally:
            proc.kill()
            canned.release.set()
    assert proc.returncode != 0
    aborted = [at - sent for at, line in lines if "Aborted" in line]
    # The command gives up at once; the interpreter's own teardown of torch may take a few more
    # seconds on a busy machine, never the 300 s the pending request would have held it.
    assert aborted and aborted[0] < 5, lines
    assert exited_after < 60


def _deliverable_sigint() -> None:
    """In the child before exec: SIGINT unblocked and at its default disposition."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """The SigBlk / SigIgn lines of a process's status (empty once it is gone)."""
    from pathlib import Path

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return " ".join(line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn")))


# ------------------------------------------------ a server that goes away: retries, kept answers


class StubChat:
    """An OpenAI-style chat server on one port that can go down (its listener closed, so new
    connections are refused), come back on the same port, drop a request (close the socket
    without an answer) or hold one until it goes down. Answers are a function of the
    conversation, so every run asks for, and gets, the same ones."""

    def __init__(self):
        self.port = 0
        self.httpd = None
        self.lock = threading.Lock()
        self.answered: list[str] = []  # the questions answered, in order
        self.dropped = 0
        self.drop_once: set[str] = set()  # questions whose first request is dropped
        self.hold: set[str] = set()  # questions held until the server goes down, then dropped
        self.down_event = threading.Event()
        self.after_answer = None  # called with the number of answers so far
        self.up()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def answer_to(messages):
        question = [m for m in messages if m["role"] == "user"][-1]["content"]
        return f"answer {len(messages)} to {question}"

    def up(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"data": [{"id": "stub"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                question = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
                if question in stub.hold:
                    stub.down_event.wait(30)
                with stub.lock:
                    drop = question in stub.drop_once or question in stub.hold
                    stub.drop_once.discard(question)
                    stub.dropped += drop
                if drop:
                    # The request was read; the connection closes without a status line.
                    self.close_connection = True
                    return
                with stub.lock:
                    stub.answered.append(question)
                    count = len(stub.answered)
                if stub.after_answer is not None:
                    stub.after_answer(count)  # before the answer is sent: it may go down first
                content = stub.answer_to(body["messages"])
                self._send({"choices": [{"index": 0, "message": {"content": content}}]})

        self.down_event.clear()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # A short poll: down() returns within milliseconds, not half a second.
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def down(self):
        """Stop listening (new connections are refused); held requests are dropped."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.down_event.set()


@pytest.fixture
def stub():
    server = StubChat()
    yield server
    server.down()


@pytest.fixture
def fast_backoff(monkeypatch):
    from specdraft.trainer.regenerate import endpoint

    monkeypatch.setattr(endpoint, "BACKOFF_BASE_S", 0.05)
    monkeypatch.setattr(endpoint, "BACKOFF_CAP_S", 0.25)


def _corpus(tmp_path, conversations):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": m}) + "\n" for i, m in conversations))
    return path


def _chat(*questions):
    messages = []
    for question in questions:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": "-"}]
    return messages


# Seven conversations, some of two turns: chunks of 3 take 2, 2 and 1 rounds.
MIXED = [
    ("m0", _chat("q0", "q0 again")),
    ("m1", _chat("q1")),
    ("m2", _chat("q2")),
    ("m3", _chat("q3", "q3 again")),
    ("m4", _chat("q4", "q4 again")),
    ("m5", _chat("q5")),
    ("m6", _chat("q6", "q6 again")),
]
SINGLE = [(f"s{i}", _chat(f"s{i}")) for i in range(6)]


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_a_server_that_goes_away_and_comes_back_loses_nothing(
    stub, fast_backoff, config_file, tmp_path
):
    corpus = _corpus(tmp_path, MIXED)
    common = [config_file, "--source", corpus, "--endpoint", stub.url, "--batch-size", 3]
    reference = tmp_path / "reference.jsonl"
    done = regenerate([*common, "--out", reference])
    assert done.exit_code == 0, done.output
    before = len(stub.answered)

    back = threading.Event()

    def outage(count):
        # The 4th answer of the run is sent once the listener is closed: the server dies with
        # that answer in flight, is down for a second, and comes back on the same port.
        if count == before + 4:
            stub.down()

            def come_back():
                time.sleep(1.0)
                stub.up()
                back.set()

            threading.Thread(target=come_back, daemon=True).start()

    stub.after_answer = outage
    out = tmp_path / "out.jsonl"
    done = regenerate([*common, "--out", out, "--retry-for", 30], progress=True)
    assert done.exit_code == 0, done.output
    assert back.is_set()
    # Waiting was shown on the progress bar, with the time waited out of the window.
    assert re.search(r"server unreachable, retrying in \d+ s \(\d+ s of 30 s\)", done.output)
    assert "7 conversation(s) written" in done.output
    # All answers, each once, in order: the same bytes as the uninterrupted run.
    assert out.read_bytes() == reference.read_bytes()
    assert not (tmp_path / "out.jsonl.pending").exists()
    # Nothing answered before the outage was asked again: the run asked 11 questions once each
    # (a request in flight when the server went down would be sent again, none was).
    assert len(stub.answered) - before == 11


def test_a_dropped_connection_is_retried_without_a_duplicate(
    stub, fast_backoff, config_file, tmp_path
):
    corpus = _corpus(tmp_path, MIXED)
    common = [config_file, "--source", corpus, "--endpoint", stub.url, "--batch-size", 3]
    reference = tmp_path / "reference.jsonl"
    assert regenerate([*common, "--out", reference]).exit_code == 0
    stub.drop_once = {"q4", "q0 again"}
    out = tmp_path / "out.jsonl"
    done = regenerate([*common, "--out", out])
    assert done.exit_code == 0, done.output
    assert stub.dropped == 2
    assert out.read_bytes() == reference.read_bytes()
    assert _ids(out) == [c for c, _ in MIXED]


def _hold_s4_until_s3_and_s5_are_answered(stub, before):
    """The second chunk (s3, s4, s5): s3 and s5 are answered, then the server goes down with s4
    in flight (its connection dropped)."""
    stub.hold = {"s4"}

    def outage(count):
        if count == before + 5:  # s0..s2, then s3 and s5
            threading.Thread(target=stub.down, daemon=True).start()

    stub.after_answer = outage


def test_a_server_gone_for_good_stops_keeping_every_answer_and_resumes(
    stub, fast_backoff, config_file, tmp_path
):
    corpus = _corpus(tmp_path, SINGLE)
    common = [config_file, "--source", corpus, "--endpoint", stub.url, "--batch-size", 3]
    reference = tmp_path / "reference.jsonl"
    assert regenerate([*common, "--out", reference]).exit_code == 0
    before = len(stub.answered)

    _hold_s4_until_s3_and_s5_are_answered(stub, before)
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    done = regenerate([*common, "--out", out, "--retry-for", 1.5, "--api-key", API_KEY])
    elapsed = time.monotonic() - started
    assert done.exit_code == 1, done.output
    assert elapsed < 30
    message = done.output
    # The endpoint, how long it waited and why it stopped.
    assert re.search(
        rf"--endpoint {stub.url}: no answer for [23] s, gave up \(--retry-for 1.5\): POST "
        rf"{stub.url}/v1/chat/completions failed: .*Connection refused",
        message,
    ), message
    # What was kept: the first chunk and s3 (the finished rows in record order), and s5's
    # answer in the pending file (s4, before it, is unanswered).
    assert f"Kept: 4 conversation(s) with 4 answer(s) written to {out}" in message
    assert f"2 finished answer(s) of the unfinished batch in {out}.pending" in message
    assert _ids(out) == ["s0", "s1", "s2", "s3"]
    assert out.read_text() == "".join(reference.read_text().splitlines(True)[:4])
    # The exact command that resumes it.
    command = re.search(r"Resume with the same command.*:\n  (.+)", message).group(1)
    words = shlex.split(command)
    assert words[:2] == ["specdraft", "regenerate"]
    config, *source, endpoint, url, batch_size, three = map(str, common)
    assert words[2:] == [
        *(config, "--out", str(out), *source, endpoint, url),
        *("--api-key", "KEY", "--retry-for", "1.5", batch_size, three, "--no-progress"),
    ]
    # The key is never printed: the command names its place.
    assert API_KEY not in message
    words[words.index("KEY")] = API_KEY

    stub.hold = set()
    stub.after_answer = None
    stub.up()
    before = len(stub.answered)
    again = CliRunner().invoke(cli, words[1:])
    assert again.exit_code == 0, again.output
    # Only s4 was asked: s3 and s5 came from the pending file.
    assert stub.answered[before:] == ["s4"]
    assert (
        "2 conversation(s) written, 4 already there, 1 answer(s) generated (2 more" in again.output
    )
    assert out.read_bytes() == reference.read_bytes()
    assert not (tmp_path / "out.jsonl.pending").exists()


def test_retry_for_0_fails_after_the_quick_retries_as_before(
    stub, fast_backoff, config_file, tmp_path
):
    corpus = _corpus(tmp_path, SINGLE)
    common = [config_file, "--source", corpus, "--endpoint", stub.url, "--batch-size", 3]
    _hold_s4_until_s3_and_s5_are_answered(stub, 0)
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    done = regenerate([*common, "--out", out, "--retry-for", 0])
    elapsed = time.monotonic() - started
    assert done.exit_code == 1, done.output
    # 3 retries of at most 0.05 + 0.1 + 0.2 s: no waiting for the server.
    assert elapsed < 10
    assert "Connection refused (gave up after 3 retries in 0 s; --retry-for 0)" in done.output
    assert "Resume with the same command" in done.output
    assert _ids(out) == ["s0", "s1", "s2", "s3"]
