"""Model rules: layer ids, gold policy, loss decay, and the checks against the target model."""

from __future__ import annotations

import json

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config.families import FAMILY_RULES
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode
from specdraft.config.target_info import read_target_info

LAYERS = "target_layer_ids = [1, 2]"


def _codes(text: str, **kwargs) -> list[str]:
    return [f.code for f in lint_text(text, "c.toml", **kwargs)]


def _one(text: str, code: str, **kwargs):
    findings = lint_text(text, "c.toml", **kwargs)
    assert [f.code for f in findings] == [code], findings
    return findings[0]


def test_negative_layer_id_is_flagged_at_the_element():
    text = replace_once(BASE, LAYERS, "target_layer_ids = [1, -3]")
    finding = _one(text, "SD301")
    assert (finding.line, finding.col) == position_of(text, "-3")


def test_duplicate_layer_id_is_flagged_at_the_repeat():
    text = replace_once(BASE, LAYERS, "target_layer_ids = [4, 1, 4]")
    finding = _one(text, "SD302")
    assert (finding.line, finding.col) == position_of(text, "4", 1, after="ids = ")
    assert finding.key == "model.target_layer_ids[2]"


def test_empty_layer_list_is_a_length_error():
    assert _codes(replace_once(BASE, LAYERS, "target_layer_ids = []")) == ["SD106"]


def test_dflash2_needs_a_gold_policy_pointing_at_its_table():
    text = replace_once(BASE, 'selector_gold_policy = "insert"\n', "")
    finding = _one(text, "SD303")
    assert (finding.line, finding.col) == position_of(text, "[model.dflash2]")


@pytest.mark.parametrize("algorithm", ["dflash", "dspark"])
def test_other_families_need_no_gold_policy_but_warn_about_the_ignored_table(algorithm):
    text = replace_once(BASE, 'algorithm = "dflash2"', f'algorithm = "{algorithm}"')
    finding = _one(text, "SD319")
    assert finding.severity == "warning"
    assert (finding.line, finding.col) == position_of(text, "[model.dflash2]")
    assert ExitCode.of(lint_text(text, "c.toml")) == ExitCode.CLEAN


@pytest.mark.parametrize(
    ("algorithm", "ignored"),
    [("dflash", ["dflash2", "dspark"]), ("dflash2", ["dspark"]), ("dspark", ["dflash2"])],
)
def test_every_options_table_but_the_chosen_familys_is_reported_ignored(algorithm, ignored):
    text = replace_once(BASE, 'algorithm = "dflash2"', f'algorithm = "{algorithm}"')
    text = replace_once(text, "[data]", "[model.dspark]\nmarkov_rank = 64\n\n[data]")
    findings = lint_text(text, "c.toml")
    assert [f.code for f in findings] == ["SD319"] * len(ignored), findings
    for finding, table in zip(findings, ignored, strict=True):
        assert (finding.line, finding.col) == position_of(text, f"[model.{table}]")
        assert f"model.algorithm = '{algorithm}'" in finding.message


def test_block_size_without_published_gamma_needs_one():
    text = replace_once(BASE, LAYERS, f"block_size = 12\n{LAYERS}")
    finding = _one(text, "SD304")
    assert (finding.line, finding.col) == position_of(text, "[training]")
    assert _codes(text + "loss_decay_gamma = 6.0\n") == []


def test_block_size_below_two_is_rejected():
    text = replace_once(BASE, LAYERS, f"block_size = 1\n{LAYERS}") + "loss_decay_gamma = 1.0\n"
    assert _codes(text) == ["SD305"]


def test_unknown_algorithm_lists_the_choices():
    text = replace_once(BASE, 'algorithm = "dflash2"', 'algorithm = "eagle3"')
    finding = _one(text, "SD104")
    *rest, last = (f"'{name}'" for name in FAMILY_RULES)
    assert f"{', '.join(rest)} or {last}" in finding.message  # every registered family
    assert "'dflash', 'dflash2'" in finding.message
    assert (finding.line, finding.col) == position_of(text, '"eagle3"')


# ------------------------------------------------------------------------------ target checks


@pytest.fixture
def target(tmp_path):
    """A tiny HF-style target folder: 4 layers, vocab 1000, hidden 64, known pad and eos ids."""
    folder = tmp_path / "target"
    folder.mkdir()
    config = {"num_hidden_layers": 4, "vocab_size": 1000, "hidden_size": 64, "eos_token_id": [2]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tokenizer = {
        "pad_token": "<pad>",
        "eos_token": {"content": "<end>"},
        "added_tokens_decoder": {"7": {"content": "<pad>"}, "9": {"content": "<end>"}},
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return folder


def _with_target(folder, layers="[1, 2]", mask=100) -> str:
    text = replace_once(BASE, '"/nonexistent/specdraft-target"', json.dumps(str(folder)))
    text = replace_once(text, LAYERS, f"target_layer_ids = {layers}")
    return replace_once(text, "mask_token_id = 100", f"mask_token_id = {mask}")


def test_target_facts_are_read_without_loading_the_model(target):
    info = read_target_info(target)
    assert (info.num_layers, info.vocab_size, info.hidden_size) == (4, 1000, 64)
    assert info.pad_ids == {7}
    assert info.eos_ids == {2, 5, 9}


def test_nested_text_config_is_read(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"text_config": {"num_hidden_layers": 6, "vocab_size": 50, "pad_token_id": 3}})
    )
    info = read_target_info(tmp_path)
    assert (info.num_layers, info.vocab_size, info.pad_ids) == (6, 50, {3})


def test_valid_config_against_target_is_clean(target):
    assert _codes(_with_target(target)) == []


def test_layer_out_of_range(target):
    text = _with_target(target, layers="[1, 4]")
    finding = _one(text, "SD310")
    assert (finding.line, finding.col) == position_of(text, "4", after="ids = ")
    assert "4 decoder layers" in finding.message


def test_last_layer_is_not_allowed(target):
    assert _codes(_with_target(target, layers="[0, 3]")) == ["SD311"]


def test_mask_outside_vocab(target):
    text = _with_target(target, mask=1000)
    finding = _one(text, "SD312")
    assert (finding.line, finding.col) == position_of(text, "1000")


@pytest.mark.parametrize(("mask", "code"), [(7, "SD313"), (5, "SD314"), (9, "SD314"), (2, "SD314")])
def test_mask_must_differ_from_pad_and_eos(target, mask, code):
    assert _codes(_with_target(target, mask=mask)) == [code]


def test_conv_group_must_divide_hidden_size(target):
    text = replace_once(
        _with_target(target), "[model.dflash2]\n", "[model.dflash2]\nconv_group_size = 24\n"
    )
    finding = _one(text, "SD317")
    assert "try 16" in finding.message
    # A family without the convolution ignores the table, and with it the group size.
    plain = replace_once(text, 'algorithm = "dflash2"', 'algorithm = "dflash"')
    assert _codes(plain) == ["SD319"]


def test_explicit_target_replaces_model_target(target):
    text = replace_once(BASE, LAYERS, "target_layer_ids = [1, 9]")
    assert _codes(text) == []
    assert _codes(text, target=str(target)) == ["SD310"]


def test_unreadable_explicit_target_is_a_warning(tmp_path):
    finding = _one(BASE, "SD315", target=str(tmp_path / "missing"))
    assert finding.severity == "warning"
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json" in _one(BASE, "SD315", target=str(tmp_path)).message


def test_existing_folder_without_config_is_a_warning(tmp_path):
    text = replace_once(BASE, '"/nonexistent/specdraft-target"', json.dumps(str(tmp_path)))
    assert _codes(text) == ["SD315"]
