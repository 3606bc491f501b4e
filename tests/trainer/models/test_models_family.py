"""One DraftFamily per model.algorithm: the classes it binds are what gets built, exported and
loaded, and the target features it declares are what the draft reads and the data path makes."""

from __future__ import annotations

import json
from typing import get_args

import pytest
import torch
from pydantic import BaseModel
from train_support import tiny_run

from specdraft.config import ModelConfig, validate_config
from specdraft.config.families import FAMILY_RULES
from specdraft.trainer.export import ExportError, draft_class_for, load_checkpoint_draft
from specdraft.trainer.export.source import ExportRefused
from specdraft.trainer.export.speculators import speculators_config
from specdraft.trainer.export.vllm import check_vllm_can_build
from specdraft.trainer.features.meta import (
    FeatureMismatch,
    check_feature_meta,
    expected_feature_meta,
)
from specdraft.trainer.integrity import write_manifest
from specdraft.trainer.models import (
    DraftFamily,
    TargetFeatureExtractor,
    build_draft,
    family_for,
    family_of,
    load_target_config,
    metric_ratios,
)
from specdraft.trainer.models.family import FAMILIES, _load_family, family_of_config
from specdraft.trainer.models.losses import COMMON_METRIC_RATIOS
from specdraft.trainer.serve.served import served_request

# Every registered family (a new one is exercised here without an edit).
ALGORITHMS = list(FAMILY_RULES)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_family_builds_its_classes_and_export_reads_them_back(
    algorithm, draft_model_config, tmp_path
):
    cfg = draft_model_config(algorithm)
    family = family_of(cfg)
    assert family is family_for(algorithm) and family.name == algorithm
    torch.manual_seed(0)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    assert type(draft) is family.model_class
    assert type(draft.config) is family.config_class
    # Checkpoints write the config alone (config.json next to the weights): it names the class too.
    assert draft.config.architectures == [family.architecture]
    # save_pretrained names the class in config.json: SGLang and export pick the family by it.
    draft.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [family.architecture]
    assert draft_class_for(family.architecture) is family.model_class
    write_manifest(tmp_path)  # what a checkpoint carries; loading verifies it
    loaded = load_checkpoint_draft(tmp_path)
    assert type(loaded) is family.model_class


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_declared_feature_widths_are_what_the_target_gives_and_the_draft_reads(
    algorithm, draft_model_config, tiny_qwen3_target
):
    cfg = draft_model_config(algorithm)
    family = family_of(cfg)
    layers = list(tiny_qwen3_target.layer_ids)
    hidden = tiny_qwen3_target.model.config.hidden_size
    extractor = TargetFeatureExtractor(tiny_qwen3_target.model, layers)
    ids = torch.arange(1, 9)[None]
    taps, last = extractor(ids, torch.ones_like(ids))
    assert taps.shape[-1] == family.feature_width(hidden, len(layers))
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, device="meta")
    assert draft.fc.in_features == family.feature_width(hidden, len(layers))
    # DSpark also reads the final hidden state; its forward refuses a batch without it.
    expected_extra = ("target_last_hidden_states",) if algorithm == "dspark" else ()
    assert family.extra_feature_keys == expected_extra
    assert family.needs_last_hidden == bool(expected_extra)
    extra_width = last.shape[-1] if family.needs_last_hidden else 0
    assert family.input_width(hidden, len(layers)) == taps.shape[-1] + extra_width


def test_a_feature_folder_made_for_the_other_family_is_refused_naming_the_field(
    tiny_target_path, tmp_path
):
    base = tiny_run(tiny_target_path, tmp_path)
    dflash2 = validate_config(base)
    dspark = validate_config({**base, "model": {**base["model"], "algorithm": "dspark"}})
    made_for_dflash2 = expected_feature_meta(dflash2)
    assert made_for_dflash2["with_last_hidden"] is False
    assert expected_feature_meta(dspark)["with_last_hidden"] is True
    with pytest.raises(FeatureMismatch) as error:
        check_feature_meta(made_for_dflash2, expected_feature_meta(dspark), tmp_path / "features")
    message = str(error.value)
    assert "with_last_hidden (model.algorithm" in message
    assert str(tmp_path / "features") in message
    assert "prepare-features" in message


def test_unknown_algorithms_and_architectures_name_the_known_ones():
    with pytest.raises(
        ValueError, match=r"model.algorithm = 'eagle3'.*'dflash', 'dflash2', 'dspark'"
    ):
        family_for("eagle3")
    with pytest.raises(
        ExportError,
        match=r"LlamaForCausalLM.*DFlash2DraftModel.*DFlashDraftModel.*Qwen3DSparkModel",
    ):
        draft_class_for("LlamaForCausalLM")


def test_the_schema_the_linter_and_the_trainer_know_the_same_families():
    schema = list(get_args(ModelConfig.model_fields["algorithm"].annotation))
    assert schema == list(FAMILY_RULES) == list(FAMILIES)
    assert {"dflash", "dflash2", "dspark"} <= set(schema)
    # Each options table the linter reports as ignored is a [model.*] section of the schema, and
    # every such section belongs to one family.
    tables = {r.options_table for r in FAMILY_RULES.values()} - {None}
    sections = {
        name
        for name, field in ModelConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }
    assert tables == sections >= {"dflash2", "dspark"}
    for name in tables:
        assert ModelConfig.model_fields[name].annotation is FAMILY_RULES[name].options


def test_every_family_logs_the_common_rates_and_its_own():
    ratios = metric_ratios()
    for family in FAMILIES.values():
        assert {**COMMON_METRIC_RATIOS, **family.metric_ratios}.items() <= ratios.items()
    assert ratios["loss/dflash_ce"] == ("weighted_ce", "@loss_weight")  # DFlash's and DFlash2's


def test_two_families_cannot_log_one_rate_from_different_sums(monkeypatch):
    clash = DraftFamily(
        **{
            **vars(FAMILIES["dflash"]),
            "name": "clash",
            "metric_ratios": {"loss/dflash_ce": ("ce_sum", "count")},
        }
    )
    monkeypatch.setitem(FAMILIES, "clash", clash)
    with pytest.raises(TypeError, match=r"'clash' logs 'loss/dflash_ce' from \('ce_sum'"):
        metric_ratios()


def test_a_registered_family_without_its_folder_says_what_to_add():
    with pytest.raises(ImportError, match=r"'nosuch'.*models/nosuch/ with a family.py"):
        _load_family("nosuch")


def test_a_family_an_engine_cannot_load_is_refused_by_that_export(tmp_path):
    family = DraftFamily(**{**vars(FAMILIES["dflash"]), "vllm": None, "speculators": None})
    with pytest.raises(ExportRefused, match=r"vLLM has no loader for the 'dflash' family"):
        check_vllm_can_build(family, None, "ckpt")
    with pytest.raises(ExportRefused, match=r"--format speculators has no layout.*sglang"):
        speculators_config(family, {"block_size": 8}, "verifier", [])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_family_of_a_built_drafts_config_is_its_own(algorithm, draft_model_config):
    cfg = draft_model_config(algorithm)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, device="meta")
    family = family_of_config(draft.config)
    assert family is family_of(cfg)
    # The slots the objective computes: DSpark predicts from the anchor slot on.
    assert family.supervised_slots(8) == (8 if family.sample_from_anchor else 7)
    with pytest.raises(ValueError, match="not a draft family's config"):
        family_of_config(object())


@pytest.mark.parametrize(
    ("algorithm", "method", "tokens"),
    [("dflash", "dflash", 7), ("dflash2", "dflash", 7), ("dspark", "dspark", 8)],
)
def test_vllm_serves_each_family_with_its_method_and_draft_tokens(
    algorithm, method, tokens, tmp_path
):
    """vLLM's speculative method per family; DSpark's anchor slot is a prediction (bs tokens)."""
    model = {"target": str(tmp_path), "algorithm": algorithm, "block_size": 8}
    model.update(target_layer_ids=[1], mask_token_id=3, dflash2={"selector_gold_policy": "insert"})
    config = validate_config({"model": model, "data": {"train_paths": ["x.jsonl"]}})
    request = served_request(config, tmp_path / "d", algorithm, [[1, 2]], "float32", mode="serve")
    assert (request["method"], request["num_speculative_tokens"]) == (method, tokens)
