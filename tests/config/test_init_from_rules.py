"""Lint of model.init_from (SD330-SD333): a draft folder in each export layout read without
torch; each disagreeing field found at its line, what specdraft cannot train refused by name."""

from __future__ import annotations

import json

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config.draft_folder import read_draft_folder
from specdraft.config.lint import lint_text

SHAPE = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}
DFLASH2 = {"conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
SLIDING = {"layer_types": ["sliding_attention"], "use_sliding_window": True, "sliding_window": 512}


def sglang_layout(**changes):
    """A DFlash2 folder config as `--format sglang` (and the z-lab drafts) lay it out."""
    config = {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "block_size": 16,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 100, **DFLASH2},
        "layer_types": ["full_attention"],
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_bias": False,
        **SHAPE,
        **DFLASH2,
    }
    return {**config, **changes}


def vllm_layout(**changes):
    """The same draft as `--format vllm` writes it."""
    return sglang_layout(sample_from_anchor=False, is_causal=False, **changes)


def speculators_layout(**changes):
    """The same draft as `--format speculators` writes it (aux layer ids are k + 1)."""
    layers = {**SHAPE, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    config = {
        "architectures": ["DFlash2DraftModel"],
        "speculators_model_type": "dflash2",
        "transformer_layer_config": layers,
        "draft_vocab_size": 1024,
        "block_size": 16,
        "aux_hidden_state_layer_ids": [2, 3],
        "mask_token_id": 100,
        "sliding_window_non_causal": True,
        **DFLASH2,
    }
    return {**config, **changes}


def folder(tmp_path, config, name="draft"):
    """A draft folder: config.json and a (stub) safetensors file, which lint never opens."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"stub")
    return str(path)


def config_text(init_from: str, *, target: str | None = None, extra: str = "") -> str:
    text = replace_once(
        BASE, "mask_token_id = 100", f"mask_token_id = 100\ninit_from = {json.dumps(init_from)}"
    )
    if target is not None:
        text = replace_once(text, '"/nonexistent/specdraft-target"', json.dumps(target))
    return replace_once(text, "mask_token_id = 100\n", f"mask_token_id = 100\n{extra}")


def findings(text: str) -> list:
    return [f for f in lint_text(text, "c.toml") if f.code.startswith("SD33")]


@pytest.fixture
def target(tmp_path):
    """A target folder whose shape the draft folders copy (config files only)."""
    path = tmp_path / "target"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 8, **SHAPE}))
    return str(path)


@pytest.mark.parametrize("layout", [sglang_layout, vllm_layout, speculators_layout])
def test_each_export_layout_reads_as_the_same_draft(tmp_path, target, layout):
    path = folder(tmp_path, layout())
    draft = read_draft_folder(path)
    assert (draft.algorithm, draft.block_size, draft.num_layers) == ("dflash2", 16, 1)
    assert draft.target_layer_ids == [1, 2] and draft.mask_token_id == 100
    assert draft.draft_vocab_size is None and draft.options == DFLASH2
    assert draft.format == layout.__name__.removesuffix("_layout")
    assert findings(config_text(path, target=target)) == []


def test_a_disagreeing_field_is_found_at_its_line(tmp_path):
    text = config_text(folder(tmp_path, vllm_layout()), extra="block_size = 8\n")
    [finding] = findings(text)
    assert finding.code == "SD332" and finding.severity == "error"
    assert (finding.line, finding.col) == position_of(text, "8", after="block_size = ")
    assert "model.block_size = 8 but the dflash2 draft in" in finding.message
    assert "(vllm format) has 16: set block_size = 16" in finding.message


def test_the_family_options_draft_vocabulary_and_target_are_compared(tmp_path, target):
    config = speculators_layout(draft_vocab_size=256, selector_rank=128)
    config["transformer_layer_config"]["hidden_size"] = 128
    text = config_text(folder(tmp_path, config), target=target)
    messages = {f.key: f.message for f in findings(text)}
    assert set(messages) == {
        "model.dflash2.selector_rank",
        "model.draft_vocab_size",
        "model.target",
    }
    assert "set selector_rank = 128" in messages["model.dflash2.selector_rank"]
    assert "set draft_vocab_size = 256" in messages["model.draft_vocab_size"]
    assert "hidden_size = 64 but the dflash2 draft" in messages["model.target"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"layer_types": ["linear_attention"]}, "layer_types[0] = 'linear_attention'"),
        ({"use_swa": True}, "use_swa = True"),
        ({"num_sink_tokens": 4}, "num_sink_tokens = 4"),
        ({"attention_bias": True}, "attention_bias = True"),
    ],
)
def test_what_specdraft_cannot_train_is_refused_by_name(tmp_path, changes, named):
    text = config_text(folder(tmp_path, sglang_layout(**changes)))
    [finding] = [f for f in findings(text) if f.code == "SD333"]
    assert finding.key == "model.init_from"
    assert f"has {named}, which specdraft cannot train" in finding.message
    assert finding.line == position_of(text, "init_from")[0]


@pytest.mark.parametrize(
    ("config", "stated"),
    [
        (sglang_layout(is_causal=True), "all"),
        (sglang_layout(dflash_config={**sglang_layout()["dflash_config"], "causal": True}), "all"),
        (speculators_layout(sliding_window_non_causal=False), "all"),
        # Sliding layers with no causality stated: causal, as vLLM and SGLang read them.
        (sglang_layout(**SLIDING), "sliding"),
    ],
    ids=["is_causal", "dflash-config", "speculators", "unstated-sliding"],
)
def test_a_causal_folder_names_the_causal_layers_that_train_it(tmp_path, config, stated):
    window = "sliding_window = 512\n" if config.get("layer_types") == SLIDING["layer_types"] else ""
    text = config_text(folder(tmp_path, config), extra=window)
    assert [f.key for f in findings(text)] == ["model.causal_layers"]
    [finding] = findings(text)
    assert finding.code == "SD332"
    assert f'set causal_layers = "{stated}" to start from it' in finding.message
    # The config that says so agrees with the folder; "sliding" over sliding layers is "all".
    for agreeing in {stated, "all"} if window else {stated}:
        text = config_text(
            folder(tmp_path, config, agreeing), extra=f'{window}causal_layers = "{agreeing}"\n'
        )
        assert findings(text) == []


def test_a_missing_folder_is_a_note_and_a_foreign_one_an_error(tmp_path):
    [missing] = findings(config_text(str(tmp_path / "elsewhere")))
    assert (missing.code, missing.severity) == ("SD330", "note")
    empty = tmp_path / "empty"
    empty.mkdir()
    [unreadable] = findings(config_text(str(empty)))
    assert unreadable.code == "SD331" and "no readable config.json" in unreadable.message
    foreign = folder(tmp_path, sglang_layout(architectures=["LlamaForCausalLM"]))
    [unknown] = findings(config_text(foreign))
    assert unknown.code == "SD331" and "unknown draft format" in unknown.message
    assert "model.init_from" in unknown.message


@pytest.mark.parametrize(
    "config",
    [
        vllm_layout(**SLIDING),
        sglang_layout(is_causal=False, **SLIDING),
        sglang_layout(
            dflash_config={
                **sglang_layout()["dflash_config"],
                "use_swa": True,
                "swa_window_size": 512,
                "causal": False,
            }
        ),
        speculators_layout(
            transformer_layer_config={**speculators_layout()["transformer_layer_config"], **SLIDING}
        ),
    ],
    ids=["vllm", "sglang", "dflash-config", "speculators"],
)
def test_a_non_causal_sliding_folder_is_trained_with_the_same_window(tmp_path, target, config):
    path = folder(tmp_path, config)
    draft = read_draft_folder(path)
    assert (draft.sliding_window, draft.layer_types) == (512, ("sliding_attention",))
    assert draft.untrainable == ()
    assert findings(config_text(path, target=target, extra="sliding_window = 512\n")) == []
    text = config_text(path, target=target)
    messages = {f.key: (f.code, f.message) for f in findings(text)}
    assert set(messages) == {"model.sliding_window", "model.layer_types"}
    assert messages["model.sliding_window"][0] == "SD332"
    assert "set sliding_window = 512" in messages["model.sliding_window"][1]
    assert 'set layer_types = ["sliding_attention"]' in messages["model.layer_types"][1]


def test_a_window_the_folder_does_not_have_is_a_difference(tmp_path):
    text = config_text(folder(tmp_path, vllm_layout()), extra="sliding_window = 512\n")
    messages = {f.key: f.message for f in findings(text)}
    assert set(messages) == {"model.sliding_window", "model.layer_types"}
    assert "has none (unset): drop sliding_window" in messages["model.sliding_window"]
    position = position_of(text, "512", after="sliding_window = ")
    [at] = [f for f in findings(text) if f.key == "model.sliding_window"]
    assert (at.line, at.col) == position


def test_a_full_layer_list_with_use_sliding_window_reads_as_full_attention(tmp_path, target):
    path = folder(tmp_path, sglang_layout(use_sliding_window=True, sliding_window=512))
    draft = read_draft_folder(path)
    assert (draft.sliding_window, draft.layer_types) == (None, ("full_attention",))
    assert findings(config_text(path, target=target)) == []


@pytest.mark.parametrize(
    "config",
    [
        sglang_layout(
            dflash_config={**sglang_layout()["dflash_config"], "attention_sink_bias": True}
        ),
        sglang_layout(add_swa_attention_sink_bias=True),
    ],
    ids=["dflash-config", "top-level"],
)
def test_a_folder_with_the_sink_logit_is_trained_with_the_config_that_says_so(tmp_path, config):
    text = config_text(folder(tmp_path, config))
    [finding] = findings(text)
    assert (finding.code, finding.key) == ("SD332", "model.attention_sink_bias")
    assert "set attention_sink_bias = true to start from it" in finding.message
    agreeing = config_text(folder(tmp_path, config, "again"), extra="attention_sink_bias = true\n")
    assert findings(agreeing) == []
