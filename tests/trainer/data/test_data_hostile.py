"""Hostile and broken corpora: an empty or all-bad corpus is an error that
names the field, each file and its counts (it was an IndexError from the dataset cache); invalid
UTF-8 in one row is one counted bad row under `skip` and a located error under `fail` (it failed
the whole load, naming nothing); a huge turn is cut by characters before it is tokenised."""

from __future__ import annotations

import json

import pytest

from specdraft.trainer.data import BadRowError, EmptyCorpusError, JsonArrayError, build_dataset
from specdraft.trainer.data import tokenize as tokenize_module
from specdraft.trainer.data.chat_template import resolve_chat_template
from specdraft.trainer.data.tokenize import tokenize_conversation, turn_char_budget

GOOD = {
    "conversations": [
        {"from": "human", "value": "Name a colour."},
        {"from": "gpt", "value": "Blue, like the sky."},
    ]
}
EMPTY = {"conversations": []}
NO_ASSISTANT = {"conversations": [{"from": "human", "value": "Hello?"}]}


def jsonl_bytes(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def bad_utf8_row() -> bytes:
    """A ShareGPT row whose user turn holds a byte that is not UTF-8 (a Latin-1 e-acute)."""
    good = json.dumps(
        {"conversations": [{"from": "human", "value": "cafe"}, {"from": "gpt", "value": "ok ok"}]}
    ).encode()
    return good.replace(b"cafe", b"caf\xe9")


def test_an_empty_train_file_names_the_field_and_the_file(data_config, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    cfg = data_config(train_paths=[str(path)], max_length=256)
    with pytest.raises(
        EmptyCorpusError, match=r"data\.train_paths: no usable conversation"
    ) as info:
        build_dataset(cfg, progress=False)
    assert f"{path}: 0 row(s) read" in str(info.value)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_an_all_bad_corpus_names_each_file_and_its_counts(data_config, tmp_path, split):
    first = tmp_path / "a.jsonl"
    first.write_bytes(jsonl_bytes([EMPTY, NO_ASSISTANT, EMPTY]))
    second = tmp_path / "b.json"
    second.write_text(json.dumps([NO_ASSISTANT]), encoding="utf-8")
    paths = [str(first), str(second)]
    field = f"data.{split}_paths"
    cfg = data_config(train_paths=paths, eval_paths=paths, max_length=256)
    with pytest.raises(EmptyCorpusError) as info:
        build_dataset(cfg, split=split, progress=False)
    message = str(info.value)
    assert message.startswith(f"{field}: no usable conversation")
    assert f"{first}: 3 row(s) read, 0 kept, skipped: empty 2, no_assistant_turn 1" in message
    assert f"{second}: 1 row(s) read, 0 kept, skipped: no_assistant_turn 1" in message
    assert info.value.field == field
    # Nothing was cached: once the file is fixed, the next build reads it again.
    first.write_bytes(jsonl_bytes([EMPTY, GOOD]))
    dataset, report = build_dataset(cfg, split=split, progress=False)
    assert dataset["sample_id"] == [1] and report.kept == 1


def test_invalid_utf8_in_one_jsonl_row_is_a_counted_bad_row(data_config, tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(jsonl_bytes([GOOD]) + bad_utf8_row() + b"\n" + jsonl_bytes([GOOD]))
    cfg = data_config(train_paths=[str(path)], max_length=256)
    dataset, report = build_dataset(cfg, progress=False)
    assert dataset["sample_id"] == [0, 2]
    assert report.skipped["malformed"] == 1 and report.rows_read == 3
    assert any("not valid UTF-8 (line 2" in note for note in report.notes)


def test_invalid_utf8_under_fail_names_the_file_and_the_line(data_config, tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(jsonl_bytes([GOOD]) + bad_utf8_row() + b"\n")
    cfg = data_config(train_paths=[str(path)], max_length=256, bad_rows="fail")
    with pytest.raises(BadRowError, match=r"mixed\.jsonl: row 1 .*line 2 is not valid UTF-8"):
        build_dataset(cfg, progress=False)


def test_invalid_utf8_in_a_json_array_record(data_config, tmp_path):
    path = tmp_path / "array.json"
    good = json.dumps(GOOD).encode()
    path.write_bytes(b"[" + good + b", " + bad_utf8_row() + b", " + good + b"]")
    cfg = data_config(train_paths=[str(path)], max_length=256)
    dataset, report = build_dataset(cfg, progress=False)
    assert dataset["sample_id"] == [0, 2] and report.skipped["malformed"] == 1
    fail = data_config(train_paths=[str(path)], max_length=256, bad_rows="fail")
    with pytest.raises(BadRowError, match=r"array\.json: row 1 .*not valid UTF-8"):
        build_dataset(fail, progress=False)


def test_a_broken_json_array_names_the_file_and_the_place(data_config, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[{"conversations": [}, ' + json.dumps(GOOD) + "]", encoding="utf-8")
    cfg = data_config(train_paths=[str(path)], max_length=256)
    with pytest.raises(JsonArrayError, match=rf"{path}:1:21: invalid JSON"):
        build_dataset(cfg, progress=False)


def test_a_huge_turn_is_cut_before_it_is_tokenised(tiny_tokenizer, monkeypatch):
    template = resolve_chat_template("tokenizer", tiny_tokenizer)
    max_length = 128
    budget = turn_char_budget(max_length)
    words = "lorem ipsum dolor sit amet " * (4 * budget // 27 + 1)  # 4x the budget
    messages = [
        {"role": "user", "content": words},
        {"role": "assistant", "content": "A short answer."},
    ]
    rendered: list[int] = []
    real_render = tokenize_module.render_chat

    def spy(template, messages, tokenizer):
        text = real_render(template, messages, tokenizer)
        rendered.append(len(text))
        return text

    monkeypatch.setattr(tokenize_module, "render_chat", spy)
    out = tokenize_conversation(messages, tiny_tokenizer, template, max_length)
    # The tokenizer saw the turn cut to the budget (plus the template's few markers), not 4x it.
    assert rendered and max(rendered) < budget + 200 < len(words)
    assert out.truncated and len(out.input_ids) == max_length
    # No kept token changed: the cut lies far beyond max_length tokens.
    whole = tokenize_conversation(
        [{**messages[0], "content": words[:budget]}, messages[1]], tiny_tokenizer, template, 10**6
    )
    assert out.input_ids == whole.input_ids[:max_length]
    assert out.loss_mask == whole.loss_mask[:max_length]
