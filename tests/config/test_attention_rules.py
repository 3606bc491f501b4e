"""Lint of the draft layers' attention: model.sliding_window, model.layer_types and
model.causal_layers (SD306-SD308 errors at their keys, SD334 / SD337 / SD338 warnings, SD335 per
engine, SD336 for vLLM and mixed layers, SD339 for llama.cpp and mixed causality), and the
resolved per-layer windows and causality."""

from __future__ import annotations

import json

import pytest
from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import load_config
from specdraft.config.attention_layers import (
    draft_layer_types,
    is_mixed,
    layer_causal,
    layer_windows,
)
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode

MASK = "mask_token_id = 100"


def _config(
    *,
    window: int | None = None,
    types: list[str] | None = None,
    layers: int | None = None,
    engines: list[str] | None = None,
    max_length: int = 2048,
    causal: str | None = None,
) -> str:
    lines = [MASK]
    if causal is not None:
        lines.append(f'causal_layers = "{causal}"')
    if layers is not None:
        lines.append(f"num_draft_layers = {layers}")
    if window is not None:
        lines.append(f"sliding_window = {window}")
    if types is not None:
        lines.append(f"layer_types = {json.dumps(types)}")
    text = replace_once(BASE, MASK, "\n".join(lines))
    if max_length != 2048:
        text = replace_once(text, "max_length = 2048", f"max_length = {max_length}")
        text = replace_once(text, "static_shape_buckets = [512, 1024, 2048]", "")
    if engines is not None:
        text += f"\n[serve]\nengines = {json.dumps(engines)}\n"
    return text


def _findings(text: str):
    return lint_text(text, "c.toml")


def test_a_window_on_every_layer_is_clean():
    text = _config(window=512, layers=2)
    assert _findings(text) == []
    model = load_config_text(text).model
    assert draft_layer_types(model) == ("sliding_attention", "sliding_attention")
    assert layer_windows(model) == (512, 512)
    assert not is_mixed(model)


def test_layer_types_pick_the_sliding_layers():
    text = _config(
        window=256,
        layers=3,
        types=["sliding_attention", "full_attention"] * 1 + ["sliding_attention"],
    )
    assert _findings(text) == []
    model = load_config_text(text).model
    assert layer_windows(model) == (256, None, 256)
    assert is_mixed(model)


def test_no_window_is_full_attention_everywhere():
    model = load_config_text(BASE).model
    assert layer_windows(model) == (None,)
    assert draft_layer_types(model) == ("full_attention",)


def test_layer_types_of_the_wrong_length_point_at_the_list():
    text = _config(window=256, layers=2, types=["sliding_attention"])
    [finding] = _findings(text)
    assert finding.code == "SD306" and finding.severity == "error"
    assert (finding.line, finding.col) == position_of(text, '["sliding_attention"]')
    assert "num_draft_layers = 2" in finding.message


def test_a_sliding_layer_without_a_window_points_at_the_entry():
    text = _config(layers=2, types=["full_attention", "sliding_attention"])
    [finding] = _findings(text)
    assert finding.code == "SD308"
    assert finding.key == "model.layer_types[1]"
    assert (finding.line, finding.col) == position_of(text, '"sliding_attention"')


def test_a_window_smaller_than_a_block_is_an_error_at_the_window():
    text = _config(window=8)  # block_size 16
    [finding] = _findings(text)
    assert finding.code == "SD307"
    assert (finding.line, finding.col) == position_of(text, "8", after="sliding_window = ")
    assert "block_size = 16" in finding.message


def test_an_unknown_layer_type_is_not_allowed():
    text = _config(window=256, types=["local_attention"])
    assert [f.code for f in _findings(text)] == ["SD104"]


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 4096),
    block_size=st.sampled_from([8, 10, 16]),
    max_length=st.sampled_from([1024, 2048, 3072]),
)
def test_window_against_block_and_max_length(window, block_size, max_length):
    text = _config(window=window, max_length=max_length)
    text = replace_once(text, MASK, f"{MASK}\nblock_size = {block_size}")
    codes = [f.code for f in _findings(text)]
    if window < block_size:
        assert codes == ["SD307"]
    elif window >= max_length:
        assert codes == ["SD334"]
    else:
        assert codes == []


def test_a_window_no_layer_uses_is_a_warning():
    text = _config(window=512, layers=2, types=["full_attention", "full_attention"])
    [finding] = _findings(text)
    assert finding.code == "SD337" and finding.severity == "warning"
    assert finding.key == "model.sliding_window"
    assert ExitCode.of(_findings(text)) == ExitCode.CLEAN


def test_sglang_cannot_serve_a_window_and_is_named_at_its_entry():
    text = _config(window=512, engines=["vllm", "sglang", "llama.cpp"])
    [finding] = _findings(text)
    assert finding.code == "SD335" and finding.severity == "error"
    assert finding.key == "serve.engines[1]"
    assert "causal" in finding.message


@pytest.mark.parametrize("engines", [["vllm"], ["llama.cpp"], ["vllm", "llama.cpp"], []])
def test_vllm_and_llama_cpp_serve_a_uniform_window(engines):
    assert _findings(_config(window=512, layers=2, engines=engines)) == []


def test_mixed_layers_with_vllm_note_the_v2_runner():
    text = _config(
        window=512, layers=2, types=["sliding_attention", "full_attention"], engines=["vllm"]
    )
    [finding] = _findings(text)
    assert finding.code == "SD336" and finding.severity == "note"
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in finding.message
    mixed_llama = _config(
        window=512, layers=2, types=["sliding_attention", "full_attention"], engines=["llama.cpp"]
    )
    assert _findings(mixed_llama) == []


@settings(max_examples=40, deadline=None)
@given(
    types=st.lists(
        st.sampled_from(["sliding_attention", "full_attention"]), min_size=1, max_size=4
    ),
    causal=st.sampled_from(["none", "sliding", "all"]),
    engines=st.lists(st.sampled_from(["vllm", "sglang", "llama.cpp"]), unique=True),
)
def test_causal_layers_findings_follow_the_engines_rules(types, causal, engines):
    text = _config(window=512, layers=len(types), types=types, engines=engines, causal=causal)
    model = load_config_text(text).model
    per_layer = layer_causal(model)
    sliding = [kind == "sliding_attention" for kind in types]
    assert (
        per_layer
        == {
            "none": (False,) * len(types),
            "all": (True,) * len(types),
            "sliding": tuple(sliding),
        }[causal]
    )
    codes = {f.code: f for f in _findings(text)}
    # llama.cpp reads one causality for the whole draft.
    assert ("SD339" in codes) == (len(set(per_layer)) > 1 and "llama.cpp" in engines)
    # SGLang never serves a window: causally masked, and one key wider when causal.
    assert ("SD335" in codes) == ("sglang" in engines and any(sliding))
    if "SD335" in codes:
        causal_sliding = all(c for c, s in zip(per_layer, sliding, strict=True) if s)
        assert ("one key more" in codes["SD335"].message) == causal_sliding
    assert ("SD338" in codes) == (causal == "sliding" and not any(sliding))


def test_a_sliding_causality_without_sliding_layers_is_a_warning():
    text = _config(causal="sliding")
    [finding] = _findings(text)
    assert (finding.code, finding.severity, finding.key) == (
        "SD338",
        "warning",
        "model.causal_layers",
    )
    assert finding.line == position_of(text, "causal_layers")[0]
    assert _findings(_config(causal="all")) == []


def test_mixed_causality_with_llama_cpp_is_an_error_at_its_entry():
    text = _config(
        window=512,
        layers=2,
        types=["sliding_attention", "full_attention"],
        engines=["vllm", "llama.cpp"],
        causal="sliding",
    )
    codes = {f.code: f for f in _findings(text)}
    assert set(codes) == {"SD336", "SD339"}
    assert codes["SD339"].key == "serve.engines[1]" and codes["SD339"].severity == "error"
    assert 'use "all" or "none"' in codes["SD339"].message


def load_config_text(text: str):
    """A Config from TOML text (through a file, as users load it)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.toml"
        path.write_text(text)
        return load_config(path)
