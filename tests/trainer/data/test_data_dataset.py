"""`build_dataset` and `corpus_lengths`: real ShareGPT rows with exact assistant masks, stable
sample ids, bad rows skipped and counted (or failing with the file and row), truncation, the
sample limits, and an on-disk cache keyed by data, template, tokenizer and max_length."""

from __future__ import annotations

import json

import pytest
from data_support import assistant_turns, masked_runs

from specdraft.trainer.data import (
    BadRowError,
    build_dataset,
    corpus_lengths,
    has_supervised_pair,
    iter_json_array,
    normalise_conversation,
    sample_lengths,
    sharegpt_package_file,
)
from specdraft.trainer.data.chat_template import resolve_chat_template
from specdraft.trainer.data.tokenize import tokenize_conversation

GOOD = {
    "conversations": [
        {"from": "human", "value": "Name a colour."},
        {"from": "gpt", "value": "Blue, like the sky."},
    ]
}
GOOD_MESSAGES = {
    "messages": [
        {"role": "user", "content": "And a fruit?"},
        {"role": "assistant", "content": "An apple, crisp and red."},
    ]
}
# One row per bad-row reason, between good rows.
BAD = {
    "malformed": {"conversations": [{"from": "human"}]},
    "empty": {"conversations": []},
    "no_assistant_turn": {"conversations": [{"from": "human", "value": "Hello?"}]},
    # The only supervised token is <|im_end|>: no two consecutive supervised tokens.
    "no_supervised_pair": {
        "conversations": [{"from": "human", "value": "Say nothing."}, {"from": "gpt", "value": ""}]
    },
}


def write_jsonl(path, rows):
    """Write rows as JSON Lines; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_real_sharegpt_rows_mask_exactly_their_assistant_turns(data_config, tiny_tokenizer):
    cfg = data_config(train_paths=["pkg:sharegpt"], max_length=2048, max_samples=40)
    dataset, report = build_dataset(cfg, progress=False)

    assert len(dataset) == report.kept == 40
    assert report.stopped_at_limit
    assert report.rows_read == report.kept + report.skipped_total
    records = [
        r for r, _ in zip(iter_json_array(sharegpt_package_file()), range(400), strict=False)
    ]
    template = resolve_chat_template("tokenizer", tiny_tokenizer)
    truncated = 0
    for row in dataset:
        assert len(row["input_ids"]) == len(row["loss_mask"]) <= 2048
        assert has_supervised_pair(row["loss_mask"])
        # Tokens after the last supervised one are trimmed: a row ends on an assistant token.
        assert row["loss_mask"][-1] == 1
        messages = normalise_conversation(records[row["sample_id"]])
        runs = masked_runs(tiny_tokenizer, row["input_ids"], row["loss_mask"])
        expected = assistant_turns(messages)
        whole = tokenize_conversation(messages, tiny_tokenizer, template, 10**9)
        assert whole.input_ids[: len(row["input_ids"])] == row["input_ids"]
        if len(whole.input_ids) <= 2048:
            assert runs == expected
        else:  # cut: every complete turn matches, the last run is the start of its turn
            truncated += 1
            assert runs[:-1] == expected[: len(runs) - 1]
            assert expected[len(runs) - 1].startswith(runs[-1].rstrip("\ufffd"))
    assert truncated == report.truncated


def test_both_schemas_and_sample_ids_offset_per_file(data_config, tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [GOOD, BAD["empty"], GOOD_MESSAGES])
    second = tmp_path / "b.json"
    second.write_text(json.dumps([GOOD_MESSAGES, GOOD]), encoding="utf-8")
    cfg = data_config(train_paths=[first, str(second)], max_length=256)
    dataset, report = build_dataset(cfg, progress=False)
    # Row position in its file, plus the rows of the files before it; a skipped row keeps its id.
    assert dataset["sample_id"] == [0, 2, 3, 4]
    assert report.kept == 4 and report.skipped["empty"] == 1


def test_bad_rows_of_every_kind_are_skipped_and_counted(data_config, tmp_path):
    rows = [GOOD, *BAD.values(), GOOD_MESSAGES, "not an object"]
    cfg = data_config(train_paths=[write_jsonl(tmp_path / "c.jsonl", rows)], max_length=256)
    dataset, report = build_dataset(cfg, progress=False)
    assert report.skipped == {
        "malformed": 2,
        "empty": 1,
        "no_assistant_turn": 1,
        "no_supervised_pair": 1,
    }
    assert dataset["sample_id"] == [0, 5]
    assert report.rows_read == len(rows)


@pytest.mark.parametrize("name", list(BAD))
def test_fail_policy_names_the_file_the_row_and_the_fix(data_config, tmp_path, name):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, BAD[name]])
    cfg = data_config(train_paths=[path], max_length=256, bad_rows="fail")
    with pytest.raises(BadRowError, match=rf"c\.jsonl: row 1 .*{name}.*bad_rows = 'skip'") as info:
        build_dataset(cfg, progress=False)
    assert info.value.reason == name and info.value.row == 1
    # Nothing half-built is left in the cache: the next run tokenises again and fails again.
    with pytest.raises(BadRowError):
        build_dataset(cfg, progress=False)


def test_a_pair_lost_to_truncation_is_a_bad_row(data_config, tmp_path):
    long_prompt = {
        "conversations": [
            {"from": "human", "value": "word " * 400},
            {"from": "gpt", "value": "A long enough answer."},
        ]
    }
    cfg = data_config(
        train_paths=[write_jsonl(tmp_path / "c.jsonl", [long_prompt, GOOD])], max_length=128
    )
    dataset, report = build_dataset(cfg, progress=False)
    assert report.skipped["no_supervised_pair"] == 1
    assert dataset["sample_id"] == [1]


def test_truncation_caps_every_sample_at_max_length(data_config):
    cfg = data_config(max_length=128, max_samples=30)
    dataset, report = build_dataset(cfg, progress=False)
    lengths = sample_lengths(dataset)
    assert max(lengths) <= 128
    # A cut row is 128 long unless its cut fell after its last supervised token (then the
    # unsupervised tail is trimmed too): every full-length row was cut, and some were.
    assert 0 < sum(1 for n in lengths if n == 128) <= report.truncated


def test_cache_hits_and_misses(data_config, tmp_path, tiny_tokenizer_path):
    from transformers import AutoTokenizer

    path = tmp_path / "c.jsonl"
    write_jsonl(path, [GOOD, GOOD_MESSAGES])
    base = {"train_paths": [str(path)], "max_length": 256}

    first, report = build_dataset(data_config(**base), progress=False)
    assert not report.cache_hit
    again, report = build_dataset(data_config(**base), progress=False)
    assert report.cache_hit
    assert again.to_dict() == first.to_dict()

    _, report = build_dataset(data_config(**{**base, "max_length": 128}), progress=False)
    assert not report.cache_hit

    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    _, report = build_dataset(data_config(**base, chat_template=str(template)), progress=False)
    assert not report.cache_hit

    other = AutoTokenizer.from_pretrained(str(tiny_tokenizer_path), local_files_only=True)
    other.add_tokens(["<|extra|>"])
    _, report = build_dataset(data_config(**base), tokenizer=other, progress=False)
    assert not report.cache_hit

    write_jsonl(path, [GOOD_MESSAGES, GOOD, GOOD])
    changed, report = build_dataset(data_config(**base), progress=False)
    assert not report.cache_hit
    assert len(changed) == 3


def test_sample_limits_for_train_and_eval(data_config, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, BAD["empty"], GOOD_MESSAGES, GOOD, GOOD])
    cfg = data_config(train_paths=[path], eval_paths=[path], max_samples=3, max_eval_samples=2)
    train, _ = build_dataset(cfg, progress=False)
    evaluation, _ = build_dataset(cfg, split="eval", progress=False)
    assert train["sample_id"] == [0, 2, 3]  # counted after bad-row filtering
    assert evaluation["sample_id"] == [0, 2]


def test_corpus_lengths_report_what_training_would_load(data_config, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, BAD["no_assistant_turn"], GOOD_MESSAGES])
    cfg = data_config(train_paths=[path], max_length=256)
    corpus = corpus_lengths(cfg, progress=False)
    dataset, _ = build_dataset(cfg, progress=False)
    assert corpus.lengths == [len(ids) for ids in dataset["input_ids"]]
    assert corpus.skipped["no_assistant_turn"] == 1
    assert corpus.dropped_incomplete == 0
    assert path in corpus.source


def test_corpus_lengths_of_the_package_report_the_cut_off_record(data_config):
    corpus = corpus_lengths(data_config(max_length=256, max_samples=5), progress=False)
    assert len(corpus.lengths) == 5
    # The cut-off tail is at the end of the file: a run that stops early never reaches it.
    assert corpus.dropped_incomplete == 0


def test_progress_bar_while_tokenising(data_config, tmp_path, capsys):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, GOOD_MESSAGES])
    build_dataset(data_config(train_paths=[path]), progress=True)
    assert "tokenising" in capsys.readouterr().err


def test_config_errors_name_the_field(data_config, tmp_path):
    missing = data_config(tokenizer=str(tmp_path / "no-tokenizer"))
    with pytest.raises(FileNotFoundError, match=r"data\.tokenizer = .*no-tokenizer.*local"):
        build_dataset(missing, progress=False)
    no_eval = data_config()
    with pytest.raises(ValueError, match=r"data\.eval_paths is empty"):
        build_dataset(no_eval, split="eval", progress=False)
    bad_path = data_config(train_paths=[str(tmp_path / "x.parquet")])
    with pytest.raises(ValueError, match=r"data\.train_paths: .*x\.parquet.*\.jsonl"):
        build_dataset(bad_path, progress=False)
