"""Held-out prompts near data.max_length: evaluation records are cut so prompt
+ generated tokens fit max_length, under static shapes and under shape buckets, in `specdraft
eval` and in a training run's baseline evaluation; the eval report counts the cut prompts.

Before the fix both paths stopped before step 1 with "a sample of N tokens is longer than the
largest shape bucket"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from train_support import one_rank, single_thread, tiny_run, write_config

from specdraft.config import validate_config
from specdraft.trainer.train.evaluation import fit_eval_budget

ANSWER = "Sure, here it is, all of it, word for word."

# (static shape options, max_length): max_length alone, and a bucket list below it.
SHAPES = {
    "static": ({"static_shapes": True}, 128),
    "buckets": ({"static_shapes": True, "static_shape_buckets": [128]}, 256),
}


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def prompt_tokens(tokenizer, content: str) -> int:
    """Tokens before the first supervised one: the prompt evaluation generates from."""
    from specdraft.trainer.data.chat_template import resolve_chat_template
    from specdraft.trainer.data.tokenize import tokenize_conversation

    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": ANSWER}]
    out = tokenize_conversation(
        messages, tokenizer, resolve_chat_template("tokenizer", tokenizer), 10**6
    )
    return out.loss_mask.index(1)


def write_long_prompt_eval(path, tokenizer, prompt_len: int) -> None:
    """An eval JSONL whose only row has a prompt of exactly `prompt_len` tokens."""
    content = next(
        (
            "x" * n
            for n in range(1, 4 * prompt_len)
            if prompt_tokens(tokenizer, "x" * n) == prompt_len
        ),
        None,
    )
    assert content is not None, f"no prompt of exactly {prompt_len} tokens"
    row = {"conversations": [{"from": "human", "value": content}, {"from": "gpt", "value": ANSWER}]}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")


@pytest.fixture
def eval_config(tiny_target_path, tmp_path):
    """Factory: a tiny run config whose held-out set is one prompt at max_length - 2 tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target_path), local_files_only=True)

    def make(shape: str) -> dict:
        training, max_length = SHAPES[shape]
        held_out = tmp_path / f"eval-{max_length}.jsonl"
        write_long_prompt_eval(held_out, tokenizer, max_length - 2)
        return tiny_run(
            tiny_target_path,
            tmp_path / f"run-{shape}",
            data={
                "max_length": max_length,
                "max_samples": 4,
                "eval_paths": [str(held_out)],
                "cache_dir": str(tmp_path / "cache"),
            },
            training={**training, "max_steps": 1},
        )

    return make


def test_the_budget_keeps_the_generation_and_cuts_the_prompt():
    assert fit_eval_budget(128, 64) == (64, 64)
    assert fit_eval_budget(2048, 64) == (64, 1984)
    # A generation budget above half of max_length leaves half for the prompt.
    assert fit_eval_budget(128, 100) == (64, 64)
    new, keep = fit_eval_budget(3, 64)
    assert new + keep <= 3 and new >= 1 and keep >= 1


@pytest.mark.parametrize("shape", list(SHAPES))
def test_eval_cli_cuts_a_prompt_at_max_length_minus_two(eval_config, tmp_path, shape):
    from specdraft.cli.main import cli

    config_file = write_config(tmp_path / f"{shape}.toml", eval_config(shape))
    done = CliRunner().invoke(
        cli, ["eval", str(config_file), "--checkpoint", "init", "--format", "json"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)  # stdout alone: progress bars go to stderr
    assert result["capped_prompts"] == 1
    assert result["steps"] >= 1 and result["tau"] >= 1.0
    text = CliRunner().invoke(cli, ["eval", str(config_file), "--checkpoint", "init"])
    assert text.exit_code == 0, text.output
    assert "1 held-out prompt(s) cut from the left" in text.output


@pytest.mark.parametrize("shape", list(SHAPES))
def test_train_baseline_evaluation_cuts_the_prompt(eval_config, shape):
    from specdraft.trainer.train.assembly import build_trainer
    from specdraft.trainer.train.evaluation import load_eval_records

    config = validate_config(eval_config(shape))
    max_length = config.data.max_length
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        try:
            result = trainer.fit()
        finally:
            trainer.writer.close()
    baseline = result.evals[0]
    assert baseline["step"] == 0 and baseline["capped_prompts"] == 1
    assert result.final_step == 1
    # The cached record fits max_length and kept the most recent prompt tokens.
    marker = json.loads((Path(config.output_dir) / "eval" / "latest.json").read_text())
    (record,) = load_eval_records(Path(marker["path"]))
    assert int(record.input_ids.shape[0]) <= max_length
    assert record.prompt_cut == (max_length - 2) - record.prompt_len
    assert record.prompt_cut > 0 and record.input_ids.shape[0] > record.prompt_len
    assert torch.isfinite(record.hidden_states).all()
