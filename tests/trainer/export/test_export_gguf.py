"""`--format gguf` without llama.cpp: what it refuses (with the option that fixes it), where it
may write, which tokenizer gets an explicit pre-tokenizer, and the folder the converter reads
(a draft vocabulary as the converter reads it for DSpark, appended afterwards for DFlash and
DFlash2). The converter and llama-server themselves: tests/serve/test_serve_llama_gguf.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdraft.trainer.export import ExportRefused, llama_cpp_refusal
from specdraft.trainer.export.converter import tiny_tokenizer_pre
from specdraft.trainer.export.gguf import check_verifier, write_converter_input
from specdraft.trainer.export.gguf_file import check_file_destination, staged_file
from specdraft.trainer.models import build_draft, load_target_config, load_target_head
from specdraft.trainer.models.dflash2.hf_config import DFlash2Config
from specdraft.trainer.models.dspark.hf_config import DSparkConfig


@pytest.mark.parametrize(
    ("keys", "fix"),
    [
        ({"markov_head_type": "gated", "confidence_head_with_markov": True}, "markov_type"),
        ({"markov_head_type": "rnn", "enable_confidence_head": False}, "markov_type"),
        ({"confidence_head_with_markov": False}, "confidence_uses_markov = true"),
    ],
)
def test_a_dspark_draft_llama_cpp_cannot_load_is_refused_with_its_option(keys, fix):
    reason = llama_cpp_refusal(DSparkConfig(hidden_size=64, **keys))
    assert reason is not None and fix in reason


def test_dspark_drafts_llama_cpp_loads_are_not_refused():
    assert llama_cpp_refusal(DSparkConfig(confidence_head_with_markov=True)) is None
    assert llama_cpp_refusal(DSparkConfig(enable_confidence_head=False)) is None


def test_a_dflash2_selector_wider_than_llama_cpp_s_row_is_refused():
    reason = llama_cpp_refusal(DFlash2Config(hidden_size=128, selector_top_k=16))
    assert reason is not None and "model.dflash2.selector_top_k <= 10" in reason
    assert llama_cpp_refusal(DFlash2Config(hidden_size=128, selector_top_k=10)) is None
    assert llama_cpp_refusal(DFlash2Config(hidden_size=4096, selector_top_k=16)) is None


def test_the_out_file_is_a_new_gguf_path_outside_every_model_folder(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "model.gguf").write_text("the target's")
    protected = {"the target's": target}
    check_file_destination(tmp_path / "draft.gguf", force=False, protected=protected)
    for out, force, words in (
        (tmp_path / "draft", False, ".gguf suffix"),
        (target, False, ".gguf suffix"),
        (target / "model.gguf", True, "inside the target's folder"),
        (target / "new.gguf", True, "inside the target's folder"),
    ):
        with pytest.raises(ExportRefused, match=words):
            check_file_destination(out, force=force, protected=protected)
    folder = tmp_path / "x.gguf"
    folder.mkdir()
    with pytest.raises(ExportRefused, match="is a folder"):
        check_file_destination(folder, force=True)
    link = tmp_path / "link.gguf"
    link.symlink_to(target / "model.gguf")
    with pytest.raises(ExportRefused, match="inside the target's folder"):
        check_file_destination(link, force=True, protected=protected)
    existing = tmp_path / "old.gguf"
    existing.write_text("old")
    with pytest.raises(ExportRefused, match="pass --force"):
        check_file_destination(existing, force=False)
    check_file_destination(existing, force=True)


def test_a_failed_write_leaves_the_out_file_as_it_was(tmp_path):
    out = tmp_path / "draft.gguf"
    out.write_text("before")
    with pytest.raises(RuntimeError), staged_file(out, "model.gguf") as stage:
        (stage / "model.gguf").write_text("half")
        raise RuntimeError("converter failed")
    assert out.read_text() == "before"
    with staged_file(out, "model.gguf") as stage:
        (stage / "model.gguf").write_text("after")
    assert out.read_text() == "after"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.gguf"]


def test_only_the_tiny_tokenizer_is_named_qwen2(tiny_tokenizer_path, tmp_path):
    assert tiny_tokenizer_pre(tiny_tokenizer_path) == "qwen2"
    # The same tokenizer without its asset record is a third-party one: the converter decides.
    anonymous = tmp_path / "anonymous"
    shutil.copytree(tiny_tokenizer_path, anonymous)
    (anonymous / "specdraft_assets.json").unlink()
    assert tiny_tokenizer_pre(anonymous) is None
    # A record that says tiny, over a tokenizer that does not split by Qwen2's regex.
    other = tmp_path / "other"
    shutil.copytree(tiny_tokenizer_path, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Whitespace"}
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert tiny_tokenizer_pre(other) is None


def _draft(draft_model_config, algorithm, ids=None, **overrides):
    cfg = draft_model_config(algorithm, **overrides)
    if ids is not None:
        cfg = draft_model_config(algorithm, draft_vocab_size=len(ids), **overrides)
    model = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, draft_vocab=ids)
    if ids is not None:
        model.init_draft_head(load_target_head(cfg.target, torch.float32))
    return model, cfg.target


def test_the_verifier_is_required_and_must_be_the_draft_s_target(
    draft_model_config, tiny_qwen3_target, tmp_path
):
    model, target = _draft(draft_model_config, "dflash")
    assert check_verifier(model, target, "ckpt") == Path(tiny_qwen3_target.path)
    with pytest.raises(ExportRefused, match="needs --verifier TARGET_DIR"):
        check_verifier(model, None, "ckpt")
    with pytest.raises(ExportRefused, match="not a local HF model folder"):
        check_verifier(model, "org/some-model", "ckpt")
    other = tmp_path / "other"
    shutil.copytree(target, other)
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] += 64
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportRefused, match="has vocab_size"):
        check_verifier(model, str(other), "ckpt")


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2"])
def test_a_dflash_draft_vocabulary_is_appended_after_the_converter(
    algorithm, draft_model_config, tmp_path
):
    ids = [0, 3, 5, 7, 11, 13, 17, 19]
    model, target = _draft(draft_model_config, algorithm, ids)
    append = write_converter_input(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "draft_vocab_size" not in config and "draft_vocab_ids" not in config
    assert "lm_head.weight" not in load_file(str(tmp_path / "hf" / "model.safetensors"))
    with np.load(append) as arrays:
        assert arrays["d2t"].dtype == np.int64 and arrays["d2t"].tolist() == ids
        head = load_file(str(target) + "/model.safetensors")["lm_head.weight"]
        assert np.array_equal(arrays["output.weight"], head[ids].numpy())


def test_a_dspark_draft_vocabulary_goes_to_the_converter_in_its_own_convention(
    draft_model_config, tmp_path
):
    ids = [0, 3, 5, 7, 11, 13, 17, 19]
    model, _ = _draft(draft_model_config, "dspark", ids, dspark={"confidence_uses_markov": True})
    assert write_converter_input(model, tmp_path / "hf") is None
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["draft_vocab_size"] == len(ids) and "draft_vocab_ids" not in config
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    # conversion/qwen.py's DSparkModel adds arange(D) to the offsets: absolute ids.
    assert (tensors["d2t"] + torch.arange(len(ids))).tolist() == ids
    assert tensors["lm_head.weight"].shape[0] == len(ids)


def test_a_full_vocabulary_draft_goes_to_the_converter_as_the_sglang_export(
    draft_model_config, tmp_path
):
    from specdraft.trainer.export.options import ExportOptions
    from specdraft.trainer.export.sglang import write_sglang

    model, _ = _draft(draft_model_config, "dflash2")
    assert write_converter_input(model, tmp_path / "hf") is None
    (tmp_path / "sglang").mkdir()
    write_sglang(model, tmp_path / "sglang", ExportOptions(checkpoint="ckpt"))
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "sglang" / name).read_bytes()


def test_without_a_llama_cpp_build_the_error_names_the_script_that_builds_it(tmp_path, monkeypatch):
    from specdraft.trainer.export import ExportError
    from specdraft.trainer.export.converter import run_converter

    monkeypatch.setenv("SPECDRAFT_LLAMA_CPP", str(tmp_path / "no-build"))
    with pytest.raises(ExportError, match=r"bash scripts/llama_cpp_build\.sh"):
        run_converter(tmp_path, tmp_path / "out.gguf", outtype="f32")
