"""A sliding-window draft in every export format: the keys each engine reads (vLLM's
dflash_config, speculators' transformer_layer_config, the draft's own config.json that
llama.cpp's converter reads), SGLang refused; a full-attention draft's files unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft.trainer.export import ExportRefused
from specdraft.trainer.export.gguf import write_converter_input
from specdraft.trainer.export.options import ExportOptions
from specdraft.trainer.export.speculators import write_speculators
from specdraft.trainer.export.vllm import write_vllm
from specdraft.trainer.models import build_draft, load_target_config

MIXED = ["sliding_attention", "full_attention"]


def _draft(draft_model_config, algorithm="dflash", **attention):
    cfg = draft_model_config(algorithm, **attention)
    return build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32), cfg.target


@pytest.mark.parametrize(
    ("attention", "use_swa"),
    [({"sliding_window": 64}, True), ({"sliding_window": 64, "layer_types": MIXED}, False)],
)
@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_vllm_reads_the_window_its_layers_and_non_causal_blocks(
    algorithm, attention, use_swa, draft_model_config, tmp_path
):
    model, _ = _draft(draft_model_config, algorithm, **attention)
    write_vllm(model, tmp_path, ExportOptions(checkpoint="ckpt"))
    config = json.loads((tmp_path / "config.json").read_text())
    dflash = config["dflash_config"]
    assert (dflash["swa_window_size"], dflash["use_swa"], dflash["causal"]) == (64, use_swa, False)
    assert config["is_causal"] is False
    assert config["sliding_window"] == 64 and config["use_sliding_window"] is True
    assert config["layer_types"] == attention.get("layer_types", ["sliding_attention"] * 2)


def test_speculators_carries_the_window_in_its_layer_config(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    model, target = _draft(draft_model_config, sliding_window=64, layer_types=MIXED)
    write_speculators(model, tmp_path, ExportOptions(checkpoint="ckpt", verifier=target))
    config = json.loads((tmp_path / "config.json").read_text())
    layers = config["transformer_layer_config"]
    assert (layers["use_sliding_window"], layers["sliding_window"]) == (True, 64)
    assert layers["layer_types"] == MIXED
    # vLLM turns it into dflash_config.causal = false: the blocks stay bidirectional.
    assert config["sliding_window_non_causal"] is True


def test_llama_cpp_s_converter_reads_the_window_from_the_draft_config(draft_model_config, tmp_path):
    model, _ = _draft(draft_model_config, "dspark", sliding_window=64, layer_types=MIXED)
    write_converter_input(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    # conversion/qwen.py DFlashModel (DSpark's base): use_sliding_window, sliding_window,
    # layer_types -> the window and the per-layer pattern; is_causal -> causal attention.
    assert (config["use_sliding_window"], config["sliding_window"]) == (True, 64)
    assert config["layer_types"] == MIXED and config["is_causal"] is False


def test_sglang_refuses_a_windowed_draft_and_names_the_formats_that_serve_it(
    draft_model_config, tmp_path
):
    from specdraft.trainer.export.sglang import write_sglang

    model, _ = _draft(draft_model_config, sliding_window=64)
    with pytest.raises(ExportRefused, match="--format vllm, speculators or gguf"):
        write_sglang(model, tmp_path, ExportOptions(checkpoint="ckpt"))


def test_a_full_attention_draft_writes_no_window_keys(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    model, target = _draft(draft_model_config)
    write_vllm(model, tmp_path / "vllm", ExportOptions(checkpoint="ckpt"))
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert not {"swa_window_size", "use_swa", "causal"} & set(config["dflash_config"])
    assert config["layer_types"] == ["full_attention"] * 2 and config["sliding_window"] is None
    write_speculators(model, tmp_path / "spec", ExportOptions(checkpoint="ckpt", verifier=target))
    layers = json.loads((tmp_path / "spec" / "config.json").read_text())["transformer_layer_config"]
    assert (layers["use_sliding_window"], layers["sliding_window"]) == (False, None)


@pytest.mark.parametrize(("causal_layers", "non_causal"), [("none", True), ("all", False)])
def test_speculators_states_the_draft_s_one_causality(
    causal_layers, non_causal, draft_model_config, tiny_qwen3_target, tmp_path
):
    model, target = _draft(draft_model_config, sliding_window=64, causal_layers=causal_layers)
    write_speculators(model, tmp_path, ExportOptions(checkpoint="ckpt", verifier=target))
    config = json.loads((tmp_path / "config.json").read_text())
    # vLLM reads it as dflash_config.causal = not sliding_window_non_causal, for every layer.
    assert config["sliding_window_non_causal"] is non_causal


def test_a_draft_whose_layers_differ_in_causality_is_refused_where_one_flag_covers_all(
    draft_model_config, tmp_path
):
    from specdraft.trainer.export.gguf import llama_cpp_refusal

    model, target = _draft(
        draft_model_config, sliding_window=64, layer_types=MIXED, causal_layers="sliding"
    )
    assert model.config.layer_causal() == (True, False)
    with pytest.raises(ExportRefused, match="speculators states one causality for all layers"):
        write_speculators(model, tmp_path / "spec", ExportOptions(checkpoint="c", verifier=target))
    assert not (tmp_path / "spec" / "config.json").exists()
    assert "writes one attention.causal for the whole draft" in llama_cpp_refusal(model.config)
    # The same draft with one causality for every layer is served by both.
    model, _ = _draft(draft_model_config, sliding_window=64, layer_types=MIXED, causal_layers="all")
    assert llama_cpp_refusal(model.config) is None


def test_sglang_refuses_a_causal_window_for_its_one_key_wider_mask(draft_model_config, tmp_path):
    from specdraft.trainer.export.sglang import write_sglang

    model, _ = _draft(draft_model_config, sliding_window=64, causal_layers="sliding")
    with pytest.raises(ExportRefused, match="q - window <= k <= q, one more than"):
        write_sglang(model, tmp_path, ExportOptions(checkpoint="ckpt"))
    # Causal full-attention layers are SGLang's is_causal = true: exported.
    model, _ = _draft(draft_model_config, causal_layers="all")
    write_sglang(model, tmp_path / "full", ExportOptions(checkpoint="ckpt"))
    assert json.loads((tmp_path / "full" / "config.json").read_text())["is_causal"] is True
