"""Lint on model.draft_vocab_size: against the target's vocabulary (SD321, SD322), vLLM's head
padding (SD323), the families no engine serves with one (SD324) and DFlash2's top-k (SD325)."""

from __future__ import annotations

import json

import pytest
from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config.lint import lint_text


def _config(size: int, *, algorithm: str = "dflash2", target: str | None = None) -> str:
    text = replace_once(
        BASE, "mask_token_id = 100", f"mask_token_id = 100\ndraft_vocab_size = {size}"
    )
    if target is not None:
        text = replace_once(text, '"/nonexistent/specdraft-target"', json.dumps(target))
    if algorithm != "dflash2":
        text = replace_once(text, 'algorithm = "dflash2"', f'algorithm = "{algorithm}"')
        text = replace_once(text, '[model.dflash2]\nselector_gold_policy = "insert"\n', "")
    return text


def _codes(text: str) -> dict[str, tuple[int, int]]:
    return {f.code: (f.line, f.col) for f in lint_text(text, "c.toml")}


@pytest.fixture
def target(tmp_path):
    """A target folder with a 1024-token vocabulary (config files only)."""
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 8, "vocab_size": 1024, "hidden_size": 64})
    )
    return str(tmp_path)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200_000))
def test_a_size_is_checked_against_vllm_s_padding(size):
    codes = _codes(_config(size, algorithm="dflash"))
    assert ("SD323" in codes) is (size % 64 != 0)
    assert "SD324" not in codes  # vLLM and speculators serve a plain DFlash draft vocabulary


def test_the_finding_points_at_the_field():
    text = _config(1000, algorithm="dspark")
    assert _codes(text)["SD323"] == position_of(text, "1000")  # the value, as other findings


def test_a_dflash2_draft_vocabulary_is_not_served_and_needs_top_k_candidates():
    codes = _codes(_config(8))  # the base selector_top_k is 16
    assert {"SD324", "SD325"} <= set(codes)
    assert "SD325" not in _codes(_config(64))


@pytest.mark.parametrize(("size", "code"), [(2048, "SD321"), (1024, "SD322"), (512, None)])
def test_a_size_is_checked_against_the_target_s_vocabulary(target, size, code):
    codes = set(_codes(_config(size, algorithm="dflash", target=target)))
    assert {"SD321", "SD322"} & codes == ({code} if code else set())


def test_zero_is_a_schema_error():
    assert "SD1" in next(iter(_codes(_config(0))))[:3]
