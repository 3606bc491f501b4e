"""A Llama target (SmolLM2-135M-Instruct's config files) as the linter reads it: 30 layers,
tied embeddings, pad = eos = <|im_end|>, special tokens only in tokenizer.json, and the layer
taps the published DFlash drafts use for any depth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode
from specdraft.config.target_info import read_target_info, suggest_target_layer_ids

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "build" / "smollm2-target"

# SmolLM2-135M-Instruct's config.json as transformers 5 writes it (eps as the GGUF's float32).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "unk_token_id": 0,
    "head_dim": 64,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}
# transformers 5 no longer writes added_tokens_decoder: the ids are in tokenizer.json only.
TOKENIZER_CONFIG = {
    "bos_token": "<|im_start|>",
    "eos_token": "<|im_end|>",
    "pad_token": "<|im_end|>",
    "unk_token": "<|endoftext|>",
    "tokenizer_class": "TokenizersBackend",
}
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>"]


def _tokenizer_json(added: list[str]) -> str:
    """A tokenizer.json as tokenizers writes it: added_tokens first, then the vocabulary."""
    tokens = [{"id": i, "content": text, "special": True} for i, text in enumerate(added)]
    vocab = {f"tok{i}": i for i in range(len(added), 200)}
    return json.dumps({"version": "1.0", "added_tokens": tokens, "model": {"vocab": vocab}})


@pytest.fixture
def llama_target(tmp_path):
    """SmolLM2's config files (no weights: the linter never reads them)."""
    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    (folder / "tokenizer.json").write_text(_tokenizer_json(ADDED))
    return folder


def _config(folder, layers="[1, 8, 14, 20, 27]", mask=0, algorithm="dflash") -> str:
    text = replace_once(BASE, '"/nonexistent/specdraft-target"', json.dumps(str(folder)))
    text = replace_once(text, "target_layer_ids = [1, 2]", f"target_layer_ids = {layers}")
    text = replace_once(text, 'algorithm = "dflash2"', f'algorithm = "{algorithm}"')
    text = replace_once(text, '[model.dflash2]\nselector_gold_policy = "insert"\n', "")
    return replace_once(text, "mask_token_id = 100", f"mask_token_id = {mask}")


def _findings(text: str):
    return lint_text(text, "c.toml")


# ------------------------------------------------------------------------------- target facts


def test_a_llama_config_is_read_with_bos_and_ids_named_in_tokenizer_json(llama_target):
    info = read_target_info(llama_target)
    assert (info.num_layers, info.vocab_size, info.hidden_size) == (30, 49152, 576)
    assert (info.pad_ids, info.eos_ids, info.bos_ids) == ({2}, {2}, {1})
    assert info.token_text(0) == "<|endoftext|>" and info.token_text(2) == "<|im_end|>"
    assert info.token_text(4000) is None


def test_token_texts_alone_give_the_ids_and_generation_eos_lists_are_merged(llama_target):
    # Only the tokenizer names pad / eos / bos; the generation config lists several eos ids.
    bare = {k: v for k, v in LLAMA_CONFIG.items() if not k.endswith("_token_id")}
    (llama_target / "config.json").write_text(json.dumps(bare))
    (llama_target / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4]}))
    info = read_target_info(llama_target)
    assert (info.pad_ids, info.eos_ids, info.bos_ids) == ({2}, {2, 4}, {1})


def test_a_missing_or_broken_tokenizer_json_only_loses_the_token_names(llama_target):
    (llama_target / "tokenizer.json").write_text("{not json")
    info = read_target_info(llama_target)
    assert (info.pad_ids, info.eos_ids, info.bos_ids) == ({2}, {2}, {1})  # from config.json
    assert info.special_tokens == ()
    (llama_target / "tokenizer.json").unlink()
    assert read_target_info(llama_target).special_tokens == ()


def test_added_tokens_far_into_tokenizer_json_are_still_found(llama_target):
    tokens = [{"id": i, "content": text} for i, text in enumerate(ADDED)]
    padded = {"version": "1.0", "notes": "x" * 400_000, "added_tokens": tokens}
    (llama_target / "tokenizer.json").write_text(json.dumps(padded))
    assert read_target_info(llama_target).token_text(0) == "<|endoftext|>"


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason="build/smollm2-target is not built here")
def test_the_real_smollm2_folder_reads_like_the_fixture():
    info = read_target_info(SMOLLM2)
    assert (info.num_layers, info.vocab_size, info.hidden_size) == (30, 49152, 576)
    assert (info.pad_ids, info.eos_ids, info.bos_ids) == ({2}, {2}, {1})
    assert info.token_text(0) == "<|endoftext|>"


# -------------------------------------------------------------------------- suggested taps


@pytest.mark.parametrize(
    ("num_layers", "count", "expected"),
    [
        (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-8B, the published DFlash draft
        (30, 5, [1, 8, 14, 20, 27]),  # SmolLM2: 7.5 and 20.5 round half to even
        (30, 4, [1, 10, 18, 27]),
        (30, 1, [15]),
        (4, 2, [0, 2]),  # too shallow for two ids in 1..1: every layer but the last
        (4, 3, [0, 1, 2]),
        (2, 1, [0]),
    ],
)
def test_suggested_taps_follow_the_dflash_convention(num_layers, count, expected):
    assert suggest_target_layer_ids(num_layers, count) == expected


def test_suggested_taps_are_valid_for_every_depth_and_count():
    for num_layers in range(2, 81):
        for count in range(1, num_layers):
            ids = suggest_target_layer_ids(num_layers, count)
            assert len(ids) == count and ids == sorted(set(ids)), (num_layers, count)
            assert ids[0] >= 0 and ids[-1] <= num_layers - 2, (num_layers, count)


@pytest.mark.parametrize(("num_layers", "count"), [(3, 3), (1, 1), (30, 0)])
def test_impossible_taps_are_refused(num_layers, count):
    with pytest.raises(ValueError):
        suggest_target_layer_ids(num_layers, count)


# ------------------------------------------------------------------------------ lint findings


def test_the_dflash_spread_and_endoftext_mask_are_clean(llama_target):
    assert _findings(_config(llama_target)) == []


def test_out_of_range_and_last_layer_ids_suggest_the_spread_for_the_depth(llama_target):
    text = _config(llama_target, layers="[1, 9, 17, 25, 33]")  # Qwen3-8B's taps
    (finding,) = _findings(text)
    assert finding.code == "SD310"
    assert (finding.line, finding.col) == position_of(text, "33", after="ids = ")
    assert "30 decoder layers" in finding.message
    assert "5 taps spread over its depth as the DFlash drafts do: [1, 8, 14, 20, 27]" in (
        finding.message
    )
    (last,) = _findings(_config(llama_target, layers="[2, 29]"))
    assert last.code == "SD311" and last.message.endswith(": [1, 27]")


def test_taps_all_in_the_first_half_of_a_deep_target_get_a_note(llama_target):
    text = _config(llama_target, layers="[0, 3, 6]")
    (note,) = _findings(text)
    assert (note.code, note.severity) == ("SD320", "note")
    assert (note.line, note.col) == position_of(text, "[0, 3, 6]")
    assert "first half of the 30 layers" in note.message and note.message.endswith("[1, 14, 27]")
    assert ExitCode.of(_findings(text)) == ExitCode.CLEAN
    assert _findings(_config(llama_target, layers="[0, 3, 15]")) == []  # reaches the middle


def test_a_shallow_target_gets_no_first_half_note(llama_target):
    (llama_target / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 7}))
    assert _findings(_config(llama_target, layers="[0, 1]")) == []


def test_pad_eos_and_bos_masks_say_how_to_choose_one(llama_target):
    findings = _findings(_config(llama_target, mask=2))
    assert [f.code for f in findings] == ["SD313", "SD314"]  # SmolLM2: pad = eos = <|im_end|>
    for finding in findings:
        assert finding.message.startswith("mask_token_id 2 (<|im_end|>) is ")
        assert "never emits in its chat answers" in finding.message
        assert "frozen embedding" in finding.message
        assert finding.message.endswith("such as <|endoftext|> (mask_token_id = 0)")
    (bos,) = _findings(_config(llama_target, mask=1))
    assert (bos.code, bos.severity) == ("SD318", "warning")
    assert "<|im_start|>" in bos.message and "mask_token_id = 0" in bos.message
    (outside,) = _findings(_config(llama_target, mask=49152))
    assert outside.code == "SD312" and "mask_token_id = 0" in outside.message


def test_a_mask_named_token_is_preferred_and_no_candidate_is_made_up(llama_target):
    (llama_target / "tokenizer.json").write_text(_tokenizer_json([*ADDED, "<|mask|>"]))
    (finding, _) = _findings(_config(llama_target, mask=2))
    assert finding.message.endswith("such as <|mask|> (mask_token_id = 5)")
    # Not ChatML and no mask token (Llama 3 style): the advice alone, no candidate.
    (llama_target / "tokenizer.json").write_text(
        _tokenizer_json(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    )
    tokenizer = {**TOKENIZER_CONFIG, "pad_token": "<|eot_id|>", "eos_token": "<|eot_id|>"}
    (llama_target / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (finding, *_) = _findings(_config(llama_target, mask=2))
    assert finding.message.endswith("frozen embedding)")
