"""Conversation files: both schemas in JSON and JSONL read through `datasets`, normalised to
role/content messages; every kind of bad row is recognised with its reason."""

from __future__ import annotations

import json

import pytest

from specdraft.trainer.data import BadRow, normalise_conversation, read_conversation_file
from specdraft.trainer.data.bad_rows import EMPTY, MALFORMED, NO_ASSISTANT_TURN

SHAREGPT_ROW = {
    "id": "a",
    "conversations": [
        {"from": "system", "value": "Be kind."},
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello!"},
    ],
}
MESSAGES_ROW = {
    "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
}
EXPECTED = [
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
]


def write(path, rows, *, jsonl: bool):
    """Write rows as a JSON array or as JSON Lines; returns the path."""
    if jsonl:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


@pytest.mark.parametrize("jsonl", [False, True], ids=["json", "jsonl"])
def test_both_schemas_in_one_file_normalise_to_role_content(tmp_path, jsonl):
    path = write(
        tmp_path / ("c.jsonl" if jsonl else "c.json"), [SHAREGPT_ROW, MESSAGES_ROW], jsonl=jsonl
    )
    read = read_conversation_file(path, hf_cache_dir=tmp_path / "hf")
    assert read.via == "datasets"
    rows = list(read.rows())
    assert [i for i, _ in rows] == [0, 1]
    assert [normalise_conversation(r) for _, r in rows] == EXPECTED


@pytest.mark.parametrize(
    ("speaker", "role"),
    [
        ("human", "user"),
        ("gpt", "assistant"),
        ("chatgpt", "assistant"),
        ("bing", "assistant"),
        ("bard", "assistant"),
        ("USER", "user"),
        ("System", "system"),
        ("function", "tool"),
    ],
)
def test_sharegpt_speakers_map_to_template_roles(speaker, role):
    record = {"conversations": [{"from": speaker, "value": "x"}, {"from": "gpt", "value": "y"}]}
    assert normalise_conversation(record)[0]["role"] == role


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        ("just a string", MALFORMED, "not an object"),
        ({"id": 1}, MALFORMED, "neither"),
        ({"conversations": "hello"}, MALFORMED, "not a list"),
        ({"conversations": ["hello"]}, MALFORMED, r"conversations\[0\]"),
        ({"messages": [{"content": "x"}]}, MALFORMED, "no 'role'"),
        ({"messages": [{"role": "user"}]}, MALFORMED, "no 'content'"),
        ({"messages": [{"role": "user", "content": 3}]}, MALFORMED, "not a string"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, MALFORMED, "unknown role"),
        ({"conversations": []}, EMPTY, "no turn"),
        ({"messages": [{"role": "user", "content": " \n"}]}, EMPTY, "no turn"),
        ({"conversations": [{"from": "human", "value": "hi"}]}, NO_ASSISTANT_TURN, "only user"),
    ],
)
def test_bad_rows_are_recognised_with_their_reason(record, reason, detail):
    with pytest.raises(BadRow, match=detail) as info:
        normalise_conversation(record)
    assert info.value.reason == reason


def test_a_jsonl_line_that_is_not_json_is_one_malformed_row(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps(SHAREGPT_ROW), "{not json", "", json.dumps(MESSAGES_ROW)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = read_conversation_file(path, hf_cache_dir=tmp_path / "hf")
    assert read.via == "records" and read.notes
    rows = list(read.rows())
    assert [i for i, _ in rows] == [0, 1, 2]  # the blank line is not a row
    assert normalise_conversation(rows[0][1]) == EXPECTED[0]
    with pytest.raises(BadRow, match="line 2 is not JSON") as info:
        normalise_conversation(rows[1][1])
    assert info.value.reason == MALFORMED
    assert normalise_conversation(rows[2][1]) == EXPECTED[1]


def test_mixed_value_types_do_not_sink_the_file(tmp_path):
    odd = {"conversations": [{"from": "human", "value": 7}, {"from": "gpt", "value": "x"}]}
    path = write(tmp_path / "c.jsonl", [SHAREGPT_ROW, odd, MESSAGES_ROW], jsonl=True)
    rows = [r for _, r in read_conversation_file(path, hf_cache_dir=tmp_path / "hf").rows()]
    assert normalise_conversation(rows[0]) == EXPECTED[0]
    assert normalise_conversation(rows[2]) == EXPECTED[1]
    with pytest.raises(BadRow) as info:
        normalise_conversation(rows[1])
    assert info.value.reason == MALFORMED


def test_a_cut_off_json_file_keeps_its_complete_records(tmp_path):
    text = json.dumps([SHAREGPT_ROW, MESSAGES_ROW, SHAREGPT_ROW], indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 30], encoding="utf-8")
    read = read_conversation_file(path, hf_cache_dir=tmp_path / "hf")
    assert [normalise_conversation(r) for _, r in read.rows()] == EXPECTED
    assert read.dropped_incomplete == 1


def test_unsupported_extensions_and_missing_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"\.csv.*\.json .*\.jsonl"):
        read_conversation_file(tmp_path / "data.csv")
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        read_conversation_file(tmp_path / "nope.json")
