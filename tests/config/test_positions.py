"""The key-path index: every finding's line and column comes from here."""

from __future__ import annotations

import string

import tomli
from config_cases import position_of
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config.positions import index_positions

DOC = """\
# a comment
run_id = "x"

[model]
target = \"\"\"a "multi-line"
string with = and [brackets] \"\"\"
"dotted.quoted" = 1
'literal' = 2
a.b.c = 3
ids = [
  1,  # first
  [20, 21],
  { x = 1, y = "}" },
]

[data]
train_paths = ['''one
two''', "three"]

[[runs]]
name = "first"

[[runs]]
name = "second"

[runs.extra]
k = 1
"""


def test_keys_values_and_elements_point_at_their_text():
    index = index_positions(DOC)
    assert index.locate(("run_id",)) == position_of(DOC, "run_id")
    assert index.locate(("run_id",), at="value") == position_of(DOC, '"x"')
    assert index.locate(("model",)) == position_of(DOC, "[model]")
    assert index.locate(("model", "dotted.quoted")) == position_of(DOC, '"dotted.quoted"')
    assert index.locate(("model", "literal")) == position_of(DOC, "'literal'")
    assert index.locate(("model", "a", "b", "c")) == position_of(DOC, "a.b.c")
    assert index.locate(("model", "ids", 0), at="value") == position_of(DOC, "1,")
    assert index.locate(("model", "ids", 1, 1), at="value") == position_of(DOC, "21")
    assert index.locate(("model", "ids", 2, "y"), at="value") == position_of(DOC, '"}"')
    # After a multi-line string the scanner is still in step.
    assert index.locate(("data", "train_paths", 1), at="value") == position_of(DOC, '"three"')


def test_arrays_of_tables_are_indexed_per_element():
    index = index_positions(DOC)
    assert index.locate(("runs", 0, "name")) == position_of(DOC, "name")
    assert index.locate(("runs", 1, "name")) == position_of(DOC, "name", occurrence=1)
    assert index.locate(("runs", 1, "extra", "k")) == position_of(DOC, "k = 1")


def test_missing_key_falls_back_to_its_table_then_to_the_start():
    index = index_positions(DOC)
    assert index.locate(("model", "absent")) == position_of(DOC, "[model]")
    assert index.locate(("model", "ids", 7)) == position_of(DOC, "ids")
    assert index.locate(("tracking", "tensorboard")) == (1, 1)


def test_implicit_table_points_at_its_first_sub_table_until_defined():
    text = "[model.dflash2]\nk = 1\n"
    assert index_positions(text).locate(("model", "x")) == (1, 1)
    text = "[model.dflash2]\nk = 1\n[model]\nt = 1\n"
    assert index_positions(text).locate(("model", "x")) == position_of(text, "[model]")


def test_crlf_line_endings_keep_columns():
    text = "a = 1\r\n[t]\r\nkey = [1, 2]\r\n"
    index = index_positions(text)
    assert index.locate(("t", "key", 1), at="value") == (3, 11)


def test_garbage_never_raises():
    for text in ["[", "[[", "a =", '"unterminated', "= = =", "[a.]\n", "x = [[[[", "\x00\x01"]:
        index_positions(text)
    index_positions("x = " + "[" * 5000 + "]" * 5000)


_names = st.text(string.ascii_lowercase + "_", min_size=1, max_size=8)
_scalars = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(string.ascii_letters + " =[]#{},.", max_size=10).map(lambda s: f'"{s}"'),
)


@st.composite
def _documents(draw):
    """A random document of tables and keys, with where each key was written."""
    lines, expected = [], {}
    for table in draw(st.lists(_names, min_size=1, max_size=4, unique=True)):
        lines.append(f"[{table}]")
        for key in draw(st.lists(_names, max_size=4, unique=True)):
            pad = draw(st.sampled_from(["", "  ", "\t"]))
            if draw(st.booleans()):
                value = draw(_scalars)
            else:
                items = draw(st.lists(_scalars, max_size=3))
                value = "[\n  " + ",\n  ".join(items) + "\n]" if items else "[]"
            expected[(table, key)] = (len("\n".join(lines).split("\n")) + 1, len(pad) + 1)
            lines.extend(f"{pad}{key} = {value}  # note".split("\n"))
    return "\n".join(lines) + "\n", expected


@settings(max_examples=60, deadline=None)
@given(_documents())
def test_random_documents_index_every_key_where_it_is_written(case):
    text, expected = case
    tomli.loads(text)  # the generator only writes valid TOML
    index = index_positions(text)
    for path, where in expected.items():
        assert index.locate(path) == where
