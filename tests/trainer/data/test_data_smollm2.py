"""SmolLM2's real tokenizer and ChatML template (a Llama target): the default system turn the
template inserts is prompt, never supervised; each answer and its closing <|im_end|>, the
target's eos, are supervised; the eval prompts and the in-process responder stop on that eos.
Uses the cached SmolLM2 asset's tokenizer files (built on first use)."""

from __future__ import annotations

import json

import pytest
from data_support import assistant_turns, masked_runs

from specdraft.config import validate_config
from specdraft.trainer.data import build_dataset, resolve_chat_template, tokenize_conversation

DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)
MESSAGES = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue, like the sky."},
    {"role": "user", "content": "And a fruit?"},
    {"role": "assistant", "content": "An apple."},
]

# The SmolLM2 asset is built from its GGUF (the [gguf] extra, ~30 s once): not in the fast lanes.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_tokenizer_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_target), local_files_only=True)


def _tokenize(tokenizer, messages, max_length: int = 512):
    template = resolve_chat_template("tokenizer", tokenizer)
    return tokenize_conversation(messages, tokenizer, template, max_length)


def test_the_default_system_turn_is_prompt_and_answers_end_with_the_eos(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        "<|im_end|>",
        2,
        2,
    )
    out = _tokenize(tokenizer, MESSAGES)
    assert tokenizer.decode(out.input_ids).startswith(DEFAULT_SYSTEM)
    assert masked_runs(tokenizer, out.input_ids, out.loss_mask) == assistant_turns(MESSAGES)
    # Each supervised run ends on the eos id, what the target stops on; the newline after it
    # and everything before the first answer (system turn, user turn, header) are prompt.
    mask = out.loss_mask
    ends = [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    assert [out.input_ids[i] for i in ends] == [2, 2]
    first = out.loss_mask.index(1)
    prompt = tokenizer.decode(out.input_ids[:first])
    assert prompt.startswith(DEFAULT_SYSTEM) and prompt.endswith("<|im_start|>assistant\n")
    # The pieces encoded apart are the tokens of the whole text: the mask sits on real tokens.
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert out.input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_conversation_with_its_own_system_turn_gets_no_default_one(smollm2_tokenizer):
    messages = [{"role": "system", "content": "Answer briefly."}, *MESSAGES]
    out = _tokenize(smollm2_tokenizer, messages)
    text = smollm2_tokenizer.decode(out.input_ids)
    assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n")
    assert "SmolLM" not in text
    assert masked_runs(smollm2_tokenizer, out.input_ids, out.loss_mask) == assistant_turns(messages)


def _config(target, train_file):
    return validate_config(
        {
            "model": {
                "target": str(target),
                "algorithm": "dflash",
                "target_layer_ids": [0],
                "mask_token_id": 0,
            },
            "data": {
                "train_paths": [str(train_file)],
                "cache_dir": str(train_file.parent / "cache"),
                "max_length": 256,
            },
        }
    )


def test_the_pipeline_evaluation_and_responder_read_the_llama_target(
    smollm2_tokenizer_target, smollm2_tokenizer, tmp_path
):
    import torch

    from specdraft.trainer.regenerate.local import LocalResponder
    from specdraft.trainer.train.eval_run import assistant_header_length
    from specdraft.trainer.train.evaluation import prompt_of

    tokenizer = smollm2_tokenizer
    conversations = [MESSAGES, MESSAGES[:2]]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in conversations), encoding="utf-8"
    )
    config = _config(smollm2_tokenizer_target, train_file)
    dataset, report = build_dataset(config, progress=False)
    assert report.kept == 2
    for row, messages in zip(dataset, conversations, strict=True):
        assert tokenizer.decode(row["input_ids"]).startswith(DEFAULT_SYSTEM)
        runs = masked_runs(tokenizer, row["input_ids"], row["loss_mask"])
        assert runs == assistant_turns(messages)
    # Evaluation prompts the target with everything before the first answer: the default
    # system turn, the question and the assistant header (4 tokens: <|im_start|> ass istant \n).
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert assistant_header_length(config) == len(header) == 4
    prompt = prompt_of(torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"]))
    assert tokenizer.decode(prompt) == (
        f"{DEFAULT_SYSTEM}<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    )
    # Regeneration in-process stops each answer on the target's eos, <|im_end|>.
    responder = LocalResponder(
        smollm2_tokenizer_target, tokenizer, max_new_tokens=2, device=torch.device("cpu")
    )
    assert (responder.eos_ids, responder.pad_id) == ([2], 2)
