"""An eval set whose rows open with the assistant has no prompt to evaluate: such rows are left
out, and a set of only those is refused naming data.eval_paths (before, it reported one
held-out prompt and a tau of 1.00 before and after training)."""

from __future__ import annotations

import json

import pytest
from train_support import single_thread, tiny_run

from specdraft.config import validate_config

ANSWER = "the model reads a long conversation and answers with care " * 3


def eval_file(path, *, with_prompt: int, without: int):
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": ANSWER},
            ]
        }
        for i in range(with_prompt)
    ] + [{"conversations": [{"from": "gpt", "value": ANSWER}]} for _ in range(without)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def records(tiny_target_path, tmp_path, **rows):
    from specdraft.trainer.train.eval_run import make_eval_records

    data = {"eval_paths": [str(eval_file(tmp_path / "eval.jsonl", **rows))]}
    config = validate_config(tiny_run(tiny_target_path, tmp_path / "run", data=data))
    with single_thread():
        return make_eval_records(config)[0]


def test_an_eval_set_without_prompts_is_refused(tiny_target_path, tmp_path):
    from specdraft.trainer.train.eval_run import NoEvalPrompts

    with pytest.raises(NoEvalPrompts, match=r"data\.eval_paths: none of the 3 usable rows"):
        records(tiny_target_path, tmp_path, with_prompt=0, without=3)


def test_rows_without_a_prompt_are_left_out(tiny_target_path, tmp_path):
    assert len(records(tiny_target_path, tmp_path, with_prompt=2, without=3)) == 2


def test_held_out_records_are_made_once_per_run_and_target(tiny_target_path, tmp_path, monkeypatch):
    """`train` and `eval` of one run reuse the saved records instead of running the target again;
    a changed eval set makes new ones."""
    from specdraft.trainer.train import eval_run

    made = []
    generate = eval_run.generate_records
    monkeypatch.setattr(eval_run, "generate_records", lambda *a: made.append(1) or generate(*a))
    data = {"eval_paths": [str(eval_file(tmp_path / "eval.jsonl", with_prompt=2, without=0))]}
    config = validate_config(tiny_run(tiny_target_path, tmp_path / "run", data=data))
    with single_thread():
        first, path = eval_run.cached_eval_records(config)
        again, same_path = eval_run.cached_eval_records(config)
        assert len(made) == 1 and same_path == path and path.is_file()
        assert [r.input_ids.tolist() for r in again] == [r.input_ids.tolist() for r in first]
        eval_file(tmp_path / "eval.jsonl", with_prompt=3, without=0)
        third, other = eval_run.cached_eval_records(config)
    assert len(made) == 2 and other != path and len(third) == 3


def test_the_evaluation_length_is_the_config_s_eval_max_new_tokens(tiny_target_path, tmp_path):
    from specdraft.trainer.train.eval_run import make_eval_records

    data = {"eval_paths": [str(eval_file(tmp_path / "eval.jsonl", with_prompt=2, without=0))]}
    longest = {}
    for new_tokens in (3, 9):
        raw = tiny_run(tiny_target_path, tmp_path / "run", data=data)
        raw["training"]["eval_max_new_tokens"] = new_tokens
        with single_thread():
            made = make_eval_records(validate_config(raw))[0]
        generated = [len(r.input_ids) - r.prompt_len for r in made]
        assert min(generated) >= 1 and max(generated) <= new_tokens, generated
        longest[new_tokens] = max(generated)
    assert longest[9] > longest[3], longest
