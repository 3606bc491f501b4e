"""Lint of `[serve] engines` against what each engine loads: a draft vocabulary per engine and
family (SD324 warning, SD327 note, SD323 only where vLLM serves), and what llama.cpp cannot load
(SD326): DSpark's Markov and confidence heads, DFlash2's selector; each at its key."""

from __future__ import annotations

import json

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config import load_config
from specdraft.config.draft_vocab_rules import served_with_draft_vocab
from specdraft.config.lint import lint_text

DSPARK = """\
[model.dspark]
markov_type = "gated"
confidence_uses_markov = false
"""


def _config(
    *,
    algorithm: str = "dflash2",
    engines: list[str] | None = None,
    vocab: int | None = None,
    dspark: str = "",
) -> str:
    text = BASE
    if vocab is not None:
        text = replace_once(
            text, "mask_token_id = 100", f"mask_token_id = 100\ndraft_vocab_size = {vocab}"
        )
    if algorithm != "dflash2":
        text = replace_once(text, 'algorithm = "dflash2"', f'algorithm = "{algorithm}"')
        text = replace_once(text, '[model.dflash2]\nselector_gold_policy = "insert"\n', dspark)
    if engines is not None:
        text += f"\n[serve]\nengines = {json.dumps(engines)}\n"
    return text


def _findings(text: str) -> dict[str, tuple[int, int, str]]:
    return {f.code: (f.line, f.col, f.message) for f in lint_text(text, "c.toml")}


def test_the_section_is_optional_and_lists_known_engines():
    assert load_config_text(_config()).serve.engines == []
    assert load_config_text(_config(engines=["llama.cpp", "vllm"])).serve.engines == [
        "llama.cpp",
        "vllm",
    ]
    found = _findings(_config(engines=["tensorrt"]))
    assert "SD104" in found and "llama.cpp" in found["SD104"][2]


def load_config_text(text: str):
    """The validated config of a TOML text (through a file, as a user's)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.toml"
        path.write_text(text)
        return load_config(path)


def test_a_dflash2_draft_vocabulary_is_served_by_llama_cpp_only():
    # Unset engines stand for SGLang and vLLM: neither reads it.
    found = _findings(_config(vocab=64))
    assert "SD324" in found and 'engines = ["llama.cpp"]' in found["SD324"][2]
    assert "SD324" not in _findings(_config(vocab=64, engines=["llama.cpp"]))
    text = _config(vocab=64, engines=["vllm", "llama.cpp"])
    found = _findings(text)
    assert "SD324" not in found
    line, col, message = found["SD327"]  # vLLM, named first, cannot serve it
    assert (line, col) == position_of(text, '"vllm"')
    assert "llama.cpp only" in message
    found = _findings(_config(vocab=64, engines=["sglang"]))
    assert "SD324" in found and "SGLang (serve.engines) reads" in found["SD324"][2]


@pytest.mark.parametrize("algorithm", ["dflash", "dspark"])
def test_dflash_and_dspark_vocabularies_are_served_by_vllm_and_llama_cpp(algorithm):
    dspark = "[model.dspark]\nconfidence_uses_markov = true\n"
    for engines in (None, ["vllm"], ["llama.cpp"], ["vllm", "llama.cpp"]):
        found = _findings(_config(algorithm=algorithm, vocab=64, engines=engines, dspark=dspark))
        assert not {"SD324", "SD327"} & set(found), (engines, found)
    found = _findings(
        _config(algorithm=algorithm, vocab=64, engines=["sglang", "llama.cpp"], dspark=dspark)
    )
    assert "SD327" in found and "SGLang reads no draft vocabulary" in found["SD327"][2]


def test_vllm_s_padding_note_only_where_vllm_serves():
    assert "SD323" in _findings(_config(algorithm="dflash", vocab=1000))
    assert "SD323" in _findings(_config(algorithm="dflash", vocab=1000, engines=["vllm"]))
    assert "SD323" not in _findings(_config(algorithm="dflash", vocab=1000, engines=["llama.cpp"]))


def test_the_registry_s_draft_vocabulary_engines():
    assert served_with_draft_vocab() == ("dflash", "dspark")
    assert served_with_draft_vocab(("llama.cpp",)) == ("dflash", "dflash2", "dspark")


def test_a_dspark_config_llama_cpp_cannot_load_is_an_error_at_its_key():
    text = _config(algorithm="dspark", engines=["llama.cpp"], dspark=DSPARK)
    findings = lint_text(text, "c.toml")
    assert [(f.code, f.severity) for f in findings] == [("SD326", "error")] * 2
    markov, confidence = findings  # in line order
    assert (markov.line, markov.col) == position_of(text, '"gated"')
    assert 'markov_type = "vanilla"' in markov.message
    assert (confidence.line, confidence.col) == position_of(
        text, "false", after="confidence_uses_markov"
    )
    assert "confidence_uses_markov = true" in confidence.message
    # Not named: nothing to check against; named and fixed: clean.
    assert "SD326" not in _findings(_config(algorithm="dspark", dspark=DSPARK))
    fixed = '[model.dspark]\nmarkov_type = "vanilla"\nconfidence_uses_markov = true\n'
    assert _findings(_config(algorithm="dspark", engines=["llama.cpp"], dspark=fixed)) == {}
    no_head = "[model.dspark]\nconfidence_head = false\n"
    assert _findings(_config(algorithm="dspark", engines=["llama.cpp"], dspark=no_head)) == {}


def test_the_default_dspark_head_points_at_its_table_when_the_key_is_not_written():
    text = _config(algorithm="dspark", engines=["llama.cpp"], dspark="")
    line, col, message = _findings(text)["SD326"]
    assert (line, col) == position_of(text, "[model]")
    assert "confidence_uses_markov = true" in message


@pytest.fixture
def target(tmp_path):
    """A target folder with a hidden size of 128 (config files only)."""
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 8, "vocab_size": 1024, "hidden_size": 128})
    )
    return str(tmp_path)


def test_a_dflash2_selector_too_wide_for_llama_cpp_s_row(target):
    # 16 candidates and 16 x 16 pair scores do not fit a 128-wide row; 10 do (110).
    text = _config(engines=["llama.cpp"])
    codes = {f.code: f for f in lint_text(text, "c.toml", target=target)}
    assert codes["SD326"].severity == "error"
    assert "selector_top_k <= 10" in codes["SD326"].message
    assert (codes["SD326"].line, codes["SD326"].col) == position_of(text, "[model.dflash2]")
    assert "SD326" not in {f.code for f in lint_text(_config(), "c.toml", target=target)}
    fits = replace_once(
        text,
        'selector_gold_policy = "insert"',
        'selector_gold_policy = "insert"\nselector_top_k = 10',
    )
    assert "SD326" not in {f.code for f in lint_text(fits, "c.toml", target=target)}
