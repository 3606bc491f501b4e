"""`config show`'s TOML writer: what it writes reads back as the same config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomli
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import load_config, validate_config
from specdraft.config.show import render_config
from specdraft.config.toml_writer import dump_toml

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_resolved_examples_read_back_as_the_same_config(example):
    config = load_config(example)
    text = render_config(config, "toml")
    assert validate_config(tomli.loads(text)) == config
    assert "pad to:" in text  # the derived values head the output


_scalar = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=12),
)
_tree = st.recursive(
    st.one_of(_scalar, st.lists(_scalar, max_size=3)),
    lambda inner: st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isinf(a) and a == b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=5), _tree, max_size=5))
def test_any_tree_of_tables_and_values_round_trips(tree):
    assert _same(tomli.loads(dump_toml(tree)), tree)


def test_unset_values_are_written_as_comments():
    text = dump_toml({"a": None, "t": {"b": None, "c": 1}})
    assert tomli.loads(text) == {"t": {"c": 1}}
    assert "# a is not set" in text and "# b is not set" in text
