"""`specdraft regenerate --endpoint`: a local OpenAI-compatible chat server backed by the tiny
target stands in for SGLang; its answers must be the ones the in-process path writes."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from _train_support import single_thread
from click.testing import CliRunner

from specdraft.cli.main import cli
from specdraft.trainer.disagg.http_json import JsonServer


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
