"""`specdraft regenerate --endpoint`: a local OpenAI-compatible chat server backed by the tiny
target stands in for SGLang; its answers must be the ones the in-process path writes."""

from __future__ import annotations

import json
import threading

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


def regenerate(args):
    result = CliRunner().invoke(cli, ["regenerate", *map(str, args), "--no-progress"])
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
        done = regenerate([*args, "--timeout", "0.3", "--batch-size", "1"])
        elapsed = time.monotonic() - started
        canned.release.set()
    assert done.exit_code == 1
    assert "timed out after 0.3 s" in done.output
    # 4 attempts of 0.3 s plus the 1 + 2 + 4 s back-off, not 4 x 600 s.
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
