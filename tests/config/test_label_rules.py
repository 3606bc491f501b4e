"""Lint of labels from the target's predictions: a soft-label weight without top-K (SD340), a
top-K nothing trains on (SD341), a top-K above the target's vocabulary (SD342), a draft
vocabulary chosen from the tokens under argmax labels (SD343) and target labels in the
disaggregated mode (SD410), each at the value it is about."""

from __future__ import annotations

import json
import tomllib

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config import load_config, validate_config
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode
from specdraft.config.resume_contract import IDENTITY_FIELDS, run_fingerprint


def _with(data: str = "", training: str = "", model: str = "") -> str:
    text = replace_once(BASE, "max_length = 2048\n", f"max_length = 2048\n{data}")
    text = replace_once(text, "static_shapes = true\n", f"static_shapes = true\n{training}")
    return replace_once(text, "mask_token_id = 100\n", f"mask_token_id = 100\n{model}")


def _findings(text: str):
    return lint_text(text, "c.toml")


def test_argmax_and_soft_labels_are_clean():
    text = _with('labels = "target_argmax"\n', "soft_label_topk = 16\nsoft_label_weight = 0.5\n")
    assert _findings(text) == []
    config = validate_config(tomllib.loads(text))
    assert (config.data.labels, config.training.soft_label_topk) == ("target_argmax", 16)


def test_a_soft_label_weight_needs_a_top_k():
    text = _with(training="soft_label_weight = 0.3\n")
    [finding] = _findings(text)
    assert (finding.code, finding.severity) == ("SD340", "error")
    assert (finding.line, finding.col) == position_of(text, "0.3")
    assert "soft_label_topk" in finding.message


@pytest.mark.parametrize(("value", "code"), [("1.5", "SD108"), ("-0.1", "SD105")])
def test_the_weight_is_a_share(value, code):
    [finding] = _findings(_with(training=f"soft_label_topk = 8\nsoft_label_weight = {value}\n"))
    assert finding.code == code


def test_a_top_k_without_a_weight_is_a_note():
    text = _with(training="soft_label_topk = 8\n")
    [finding] = _findings(text)
    assert (finding.code, finding.severity) == ("SD341", "note")
    assert (finding.line, finding.col) == position_of(text, "8", after="soft_label_topk")
    assert ExitCode.of([finding]) == ExitCode.CLEAN


def test_a_top_k_above_the_targets_vocabulary(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 8, "vocab_size": 64, "hidden_size": 64})
    )
    text = _with(training="soft_label_topk = 100\nsoft_label_weight = 1.0\n")
    text = replace_once(text, '"/nonexistent/specdraft-target"', json.dumps(str(tmp_path)))
    found = {f.code: f for f in _findings(text)}
    assert found["SD342"].severity == "error"
    assert (found["SD342"].line, found["SD342"].col) == position_of(
        text, "100", after="soft_label_topk"
    )
    assert "vocab_size 64" in found["SD342"].message
    assert "SD342" not in {f.code for f in _findings(text.replace("= 100", "= 64"))}


def test_a_draft_vocabulary_under_argmax_labels_is_chosen_from_the_tokens():
    text = _with('labels = "target_argmax"\n', model="draft_vocab_size = 4096\n")
    # (DFlash2's draft vocabulary has its own serving warning, SD324.)
    [finding] = [f for f in _findings(text) if f.code != "SD324"]
    assert (finding.code, finding.severity) == ("SD343", "warning")
    assert (finding.line, finding.col) == position_of(text, "4096")


@pytest.mark.parametrize(
    ("data", "training", "key", "value"),
    [
        ('labels = "target_argmax"\n', "", "data.labels", '"target_argmax"'),
        ("", "soft_label_topk = 8\nsoft_label_weight = 0.2\n", "training.soft_label_weight", "0.2"),
    ],
)
def test_target_labels_are_refused_in_the_disaggregated_mode(data, training, key, value):
    text = _with(data, training) + '\n[deployment]\nmode = "disaggregated"\n'
    [finding] = _findings(text)
    assert (finding.code, finding.key) == ("SD410", key)
    assert (finding.line, finding.col) == position_of(text, value)
    assert "deployment.mode = 'local'" in finding.message


def test_an_unknown_label_source_lists_the_choices():
    [finding] = _findings(_with('labels = "argmax"\n'))
    assert finding.code == "SD104"
    assert "target_argmax" in finding.message


def test_the_labels_are_part_of_a_checkpoints_identity(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    plain = run_fingerprint(load_config(path), data="d")
    assert "data.labels" not in plain and "training.soft_label_topk" not in plain
    argmax = load_config(path, ['data.labels="target_argmax"'])
    assert run_fingerprint(argmax, data="d")["data.labels"] == "target_argmax"
    soft = load_config(path, ["training.soft_label_topk=8", "training.soft_label_weight=0.5"])
    assert run_fingerprint(soft, data="d")["training.soft_label_topk"] == 8
    # A top-K without a weight trains no soft labels: not part of the checkpoint's identity.
    unused = load_config(path, ["training.soft_label_topk=8"])
    assert "training.soft_label_topk" not in run_fingerprint(unused, data="d")
    assert {"data.labels", "training.soft_label_topk"} <= set(IDENTITY_FIELDS)
