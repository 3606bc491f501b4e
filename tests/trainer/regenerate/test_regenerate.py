"""`specdraft regenerate` in-process: the target's greedy answers turn by turn, resumable output
that the data pipeline reads, and the replay rules (property-tested with a fake target)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_support import single_thread

from specdraft.trainer.regenerate.output import OutputMismatch, RegeneratedFile
from specdraft.trainer.regenerate.replay import (
    PROMPT_TOO_LONG,
    ChatPrompt,
    SourceRecord,
    regenerate_chunk,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


MAX_LENGTH = 160
NEW_TOKENS = 20

CONVERSATIONS = [
    {
        "id": "two-turns",
        "conversations": [
            {"from": "human", "value": "Hello! Can you help me write a short email?"},
            {"from": "gpt", "value": "The original answer, from another model."},
            {"from": "human", "value": "Make it more formal, please."},
            {"from": "gpt", "value": "Another original answer."},
        ],
    },
    {
        "id": "leading-answer",
        "conversations": [
            {"from": "gpt", "value": "An answer to nothing."},
            {"from": "human", "value": "What is the capital of France?"},
            {"from": "gpt", "value": "Paris."},
        ],
    },
    {
        "id": "openai-style",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a python function that adds two numbers."},
            {"role": "assistant", "content": "def add(a, b): return a + b"},
            {"role": "user", "content": "Thanks"},
        ],
    },
    {"id": "no-answer", "conversations": [{"from": "human", "value": "Only a question?"}]},
    {
        "id": "too-long",
        "conversations": [
            {"from": "human", "value": "word " * 400},
            {"from": "gpt", "value": "An answer training would never see."},
        ],
    },
    {
        "id": "two-turns",  # the same id again: rows are told apart by their source row
        "conversations": [
            {"from": "human", "value": "How do I sort a list in python?"},
            {"from": "gpt", "value": "Use sorted()."},
        ],
    },
    {
        "conversations": [
            {"from": "human", "value": "Tell me a joke about cats."},
            {"from": "gpt", "value": "No."},
        ]
    },
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    return path


@pytest.fixture
def regen_config(tiny_target_path, corpus, tmp_path):
    """A config on the tiny target whose training data is the small corpus above."""
    from specdraft.config import validate_config

    return validate_config(
        {
            "output_dir": str(tmp_path / "run"),
            "model": {
                "target": str(tiny_target_path),
                "algorithm": "dflash2",
                "block_size": 8,
                "target_layer_ids": [0, 2],
                "mask_token_id": 4095,
                "dflash2": {"selector_gold_policy": "insert"},
            },
            "data": {
                "train_paths": [str(corpus)],
                "max_length": MAX_LENGTH,
                "cache_dir": str(tmp_path / "cache"),
            },
        }
    )


def run(config, out, **kwargs):
    from specdraft.trainer.regenerate.run import regenerate_from_config

    kwargs.setdefault("max_new_tokens", NEW_TOKENS)
    kwargs.setdefault("progress", False)
    return regenerate_from_config(config, out, **kwargs)


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def greedy_answer(model, tokenizer, messages, max_new_tokens) -> str:
    """The target's greedy answer computed here, one prompt at a time, without padding."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    budget = min(max_new_tokens, MAX_LENGTH - ids.shape[1])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=budget,
            do_sample=False,
            eos_token_id=model.generation_config.eos_token_id,
            pad_token_id=model.generation_config.pad_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    new = new[: new.index(eos)] if eos in new else new
    return tokenizer.decode(new, skip_special_tokens=True)


def test_assistant_turns_become_the_targets_greedy_answers_turn_by_turn(
    regen_config, tiny_target_path, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "regen.jsonl"
    result = run(regen_config, out, batch_size=3)
    rows = rows_of(out)

    assert [(r["id"], r["source_row"]) for r in rows] == [
        ("two-turns", 0),
        ("leading-answer", 1),
        ("openai-style", 2),
        ("two-turns", 5),
        ("row-6", 6),
    ]
    assert result.skipped == {"no_assistant_turn": 1, PROMPT_TOO_LONG: 1}
    assert result.written == 5
    # The leading answer (to no question) is dropped; the trailing user turn is not an answer.
    assert [t["from"] for t in rows[1]["conversations"]] == ["human", "gpt"]
    assert [t["from"] for t in rows[2]["conversations"]] == ["system", "human", "gpt"]

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_target_path), dtype=torch.float32)
    speaker = {"human": "user", "gpt": "assistant", "system": "system"}
    originals = {c["id"]: c for c in CONVERSATIONS if "id" in c}
    answers = 0
    for row in rows:
        history = []
        for turn in row["conversations"]:
            message = {"role": speaker[turn["from"]], "content": turn["value"]}
            if message["role"] == "assistant":
                # Later turns are answered after the regenerated earlier ones.
                expected = greedy_answer(model, tokenizer, history, NEW_TOKENS)
                assert turn["value"] == expected, (row["id"], len(history))
                answers += 1
            history.append(message)
        source = originals.get(row["id"])
        if source and "conversations" in source:
            old = [t["value"] for t in source["conversations"] if t["from"] == "gpt"]
            new = [t["value"] for t in row["conversations"] if t["from"] == "gpt"]
            assert not set(old) & set(new)
    assert answers == result.answers == 6


def test_a_stopped_run_resumes_to_the_same_file_as_one_run(regen_config, tmp_path, monkeypatch):
    from specdraft.trainer.regenerate.local import LocalResponder

    whole = tmp_path / "whole.jsonl"
    run(regen_config, whole, batch_size=2)

    resumed = tmp_path / "resumed.jsonl"
    original = LocalResponder.answer
    calls = []

    def stop_after_two(self, prompts, on_answer=None):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the run were interrupted mid-way
        calls.append(len(prompts))
        return original(self, prompts, on_answer)

    monkeypatch.setattr(LocalResponder, "answer", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        run(regen_config, resumed, batch_size=2)
    monkeypatch.setattr(LocalResponder, "answer", original)
    first_part = rows_of(resumed)
    assert 0 < len(first_part) < len(rows_of(whole))
    # A kill in the middle of a write leaves a torn last line; the rerun cuts it off.
    with open(resumed, "ab") as handle:
        handle.write(b'{"id": "openai-style", "source_row": 2, "conversa')

    result = run(regen_config, resumed, batch_size=2)
    assert result.already_done == len(first_part)
    assert result.written == len(rows_of(whole)) - len(first_part)
    assert resumed.read_bytes() == whole.read_bytes()

    again = run(regen_config, resumed, batch_size=2)
    assert (again.written, again.answers) == (0, 0)
    assert resumed.read_bytes() == whole.read_bytes()


def test_other_settings_are_refused_naming_them(regen_config, tmp_path):
    out = tmp_path / "regen.jsonl"
    run(regen_config, out, count=2)
    with pytest.raises(OutputMismatch, match=r"generator.*max_new_tokens"):
        run(regen_config, out, count=2, max_new_tokens=NEW_TOKENS + 1)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"conversations": []}\n')
    with pytest.raises(OutputMismatch, match="not written by `specdraft regenerate`"):
        run(regen_config, foreign, count=2)


def test_the_output_trains_with_the_answers_supervised(regen_config, tmp_path):
    from data_support import masked_runs

    from specdraft.trainer.data import build_dataset, load_tokenizer

    out = tmp_path / "regen.jsonl"
    run(regen_config, out)
    rows = rows_of(out)
    config = regen_config.model_copy(
        update={"data": regen_config.data.model_copy(update={"train_paths": [str(out)]})}
    )
    dataset, report = build_dataset(config, split="train", progress=False)
    assert report.kept == len(rows) and not any(report.skipped.values())
    tokenizer, _ = load_tokenizer(config)
    for row, sample in zip(rows, dataset, strict=True):
        answers = [t["value"] for t in row["conversations"] if t["from"] == "gpt"]
        runs = masked_runs(tokenizer, sample["input_ids"], sample["loss_mask"])
        assert [r.removesuffix("<|im_end|>") for r in runs] == answers[: len(runs)]


def test_a_torn_last_line_is_cut_and_its_row_redone(tmp_path):
    out = tmp_path / "rows.jsonl"
    writer = RegeneratedFile(out, {"k": 1})
    assert writer.open() == set()
    writer.append([{"id": "a", "source_row": 3, "conversations": []}])
    writer.close()
    with open(out, "ab") as handle:
        handle.write(b'{"id": "b", "source_')
    again = RegeneratedFile(out, {"k": 1})
    assert again.open() == {("a", 3)}
    again.close()
    assert out.read_bytes().endswith(b"]}\n")
    out.write_text('{"id": "a", "source_row": 3}\nnot json\n')
    with pytest.raises(OutputMismatch, match=r"rows\.jsonl:2: not a regenerated row"):
        RegeneratedFile(out, {"k": 1}).open()


# ------------------------------------------------------------- replay rules with a fake target

ROLES = st.sampled_from(["user", "assistant", "system", "tool"])


class FakeRenderer:
    """A prompt's length = characters of the conversation so far (no tokenizer)."""

    def __call__(self, messages, max_length):
        length = sum(len(m["content"]) + 1 for m in messages)
        return ChatPrompt(list(messages), [0] * length, max_length - length)


class FakeTarget:
    """Answers with the number of turns it was shown; remembers every prompt."""

    def __init__(self):
        self.prompts = []

    def describe(self):
        return {"kind": "fake"}

    def answer(self, prompts, on_answer=None):
        self.prompts.extend(prompts)
        return [f"<{len(p.messages)}>" for p in prompts]


@settings(max_examples=150, deadline=None)
@given(
    conversations=st.lists(
        st.lists(st.tuples(ROLES, st.text("abc", max_size=6)), min_size=1, max_size=8),
        min_size=1,
        max_size=4,
    ),
    max_length=st.integers(min_value=1, max_value=40),
)
def test_replay_answers_every_turn_after_the_regenerated_ones(conversations, max_length):
    from specdraft.trainer.regenerate.replay import answerable_turns

    records = []
    for i, turns in enumerate(conversations):
        messages = [{"role": r, "content": c} for r, c in turns]
        try:
            records.append(SourceRecord(str(i), i, answerable_turns(messages)))
        except Exception:
            continue
    target = FakeTarget()
    replays = regenerate_chunk(records, target, FakeRenderer(), max_length=max_length)
    answered = sum(m["role"] == "assistant" for replay in replays for m in replay.out)
    assert answered == len(target.prompts)
    for record, replay in zip(records, replays, strict=True):
        out = replay.out
        # Every non-answer turn is the source's, in order; every answer is the target's.
        source_iter = iter(record.messages)
        for index, message in enumerate(out):
            source = next(source_iter)
            assert message["role"] == source["role"]
            if message["role"] == "assistant":
                assert message["content"] == f"<{index}>"
                assert any(p.messages == out[:index] for p in target.prompts)
            else:
                assert message == source
        # The replay stops only at the end of the source or where the prompt hits max_length.
        if replay.cut:
            assert FakeRenderer()(out, max_length).max_new_tokens < 2
        else:
            assert len(out) == len(record.messages)
        conversation = replay.conversation()
        if conversation:
            assert conversation[-1]["from"] == "gpt"
