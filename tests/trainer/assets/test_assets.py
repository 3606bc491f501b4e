"""The tiny tokenizer and tiny target: built offline, cached, loadable with the HF Auto classes,
with the Qwen special tokens, the chat template, and a target whose greedy answers vary."""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path

import pytest
from safetensors import safe_open

from specdraft.trainer.assets import build_tiny_tokenizer, tiny_assets_info
from specdraft.trainer.assets.tokenizer import train_tiny_tokenizer
from specdraft.trainer.data import QWEN_CHAT_TEMPLATE
from specdraft.trainer.data.sharegpt import iter_json_array, sharegpt_package_file


def test_tokenizer_special_tokens_match_the_published_ids(tiny_tokenizer):
    info = tiny_assets_info()
    assert len(tiny_tokenizer) == info.vocab_size
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.eos_token_id == info.eos_token_id
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.pad_token_id == info.pad_token_id
    assert tiny_tokenizer.convert_tokens_to_ids("<|mask|>") == info.mask_token_id
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_start|>") == info.im_start_token_id
    distinct = {info.mask_token_id, info.eos_token_id, info.pad_token_id, info.im_start_token_id}
    assert len(distinct) == 4
    # Each special token is one token, never split, wherever it appears in text.
    ids = tiny_tokenizer.encode("a<|im_start|>b<|mask|>c", add_special_tokens=False)
    assert info.im_start_token_id in ids and info.mask_token_id in ids


def test_tokenizer_round_trips_real_and_unusual_text(tiny_tokenizer):
    texts = [
        r["conversations"][0]["value"]
        for r, _ in zip(iter_json_array(sharegpt_package_file()), range(50), strict=False)
    ]
    texts += ["  leading spaces\n\n\ttabs", "naïve café – 東京 🚀", "x = [1, 2, 3]  # code\r\n"]
    for text in texts:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_tokenizer_carries_the_qwen_chat_template(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    assert tiny_tokenizer.chat_template == QWEN_CHAT_TEMPLATE
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    prompt = tiny_tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tokenizer_build_is_cached_and_deterministic(tiny_tokenizer_path, tiny_tokenizer):
    assert build_tiny_tokenizer() == tiny_tokenizer_path  # a cache hit: the same folder
    # Training again from scratch gives the same tokenizer, so the cache key is honest.
    fresh = train_tiny_tokenizer()
    assert fresh.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()


def test_tokenizer_builds_into_the_given_cache_dir(tmp_path):
    path = build_tiny_tokenizer(tmp_path)
    assert path.parent.parent == tmp_path
    assert (path / "tokenizer.json").is_file()
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


# The first build pretrains the target for about a minute; later runs read the cache.
@pytest.mark.slow
def test_tiny_target_loads_with_its_tokenizer_and_generation_config(tiny_target_path):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    info = tiny_assets_info()
    config = AutoConfig.from_pretrained(tiny_target_path, local_files_only=True)
    assert config.model_type == "qwen3"
    assert config.vocab_size == info.vocab_size
    assert config.num_hidden_layers == info.target_num_layers
    assert config.hidden_size == info.target_hidden_size
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_path, local_files_only=True)
    assert len(tokenizer) == config.vocab_size
    generation = GenerationConfig.from_pretrained(tiny_target_path, local_files_only=True)
    assert generation.eos_token_id == info.eos_token_id
    assert generation.pad_token_id == info.pad_token_id
    with safe_open(str(Path(tiny_target_path) / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        # Untied head: the draft reads both matrices from the safetensors.
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= names
        params = sum(math.prod(weights.get_slice(n).get_shape()) for n in names)
    assert 1_000_000 <= params <= 3_000_000


@pytest.mark.slow
def test_tiny_target_greedy_answers_are_not_degenerate(tiny_target_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_target_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_path, local_files_only=True).eval()
    answers = []
    for question in ("What is the capital of France?", "Write a short poem about the sea."):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=32, do_sample=False)
        answers.append(out[0, prompt["input_ids"].shape[1] :].tolist())
    for answer in answers:
        assert len(set(answer)) >= 8, tokenizer.decode(answer)  # not one token (or two) repeated
        assert tokenizer.decode(answer).strip()
