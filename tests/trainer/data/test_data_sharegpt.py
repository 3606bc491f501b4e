"""The ShareGPT package loads although its JSON is cut off, and the record-by-record JSON-array
reader keeps exactly the complete records of any truncated array."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.data import json_array
from specdraft.trainer.data.json_array import ArrayReadStats, JsonArrayError, iter_json_array
from specdraft.trainer.data.sharegpt import read_sharegpt_package, sharegpt_package_file

_records = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(max_size=6),
            "conversations": st.lists(
                st.fixed_dictionaries(
                    {"from": st.sampled_from(["human", "gpt"]), "value": st.text(max_size=30)}
                ),
                max_size=3,
            ),
        }
    ),
    max_size=6,
)


@pytest.fixture
def small_chunks(monkeypatch):
    """Read in tiny windows so records straddle many window edges."""
    monkeypatch.setattr(json_array, "_CHUNK_CHARS", 7)


def test_package_file_is_cut_off_and_complete_records_are_kept():
    path = sharegpt_package_file()
    text = path.read_text(encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # the premise: no whole-file parser accepts it

    stats = ArrayReadStats()
    records = list(iter_json_array(path, stats))

    assert stats.dropped_incomplete == 1
    assert stats.complete == len(records) > 10_000
    # Everything read so far, closed with ']', is valid JSON holding exactly these records ...
    assert json.loads(text[: stats.chars_read] + "]") == records
    # ... and the rest is one record that does not parse.
    tail = text[stats.chars_read :].lstrip().removeprefix(",")
    with pytest.raises(json.JSONDecodeError):
        json.loads("[" + tail + "]")
    assert all("conversations" in r for r in records)


def test_read_sharegpt_package_counts_rows_and_the_dropped_tail():
    read = read_sharegpt_package()
    rows = list(read.rows())
    assert [i for i, _ in rows] == list(range(read.total))
    assert read.dropped_incomplete == 1


@settings(max_examples=60, deadline=None)
@given(records=_records, cut=st.floats(min_value=0.0, max_value=1.0), indent=st.booleans())
def test_a_truncated_array_yields_exactly_the_records_before_the_cut(
    tmp_path_factory, records, cut, indent
):
    text = json.dumps(records, indent=2 if indent else None)
    position = int(cut * len(text))
    # Oracle: each record's span in the text; complete when it ends before the cut.
    spans = _record_spans(text, len(records))
    expected = [r for r, (_, end) in zip(records, spans, strict=True) if end <= position]
    cut_inside = sum(1 for start, end in spans if start < position < end)
    path = tmp_path_factory.mktemp("arr") / "cut.json"
    path.write_text(text[:position], encoding="utf-8")

    if not text[:position].strip():
        with pytest.raises(JsonArrayError, match="empty"):
            list(iter_json_array(path))
        return
    stats = ArrayReadStats()
    assert list(iter_json_array(path, stats)) == expected
    assert stats.dropped_incomplete == cut_inside


def _record_spans(text: str, count: int) -> list[tuple[int, int]]:
    decoder = json.JSONDecoder()
    spans, pos = [], text.index("[") + 1
    for _ in range(count):
        while text[pos] in " \n,":
            pos += 1
        start = pos
        _, pos = decoder.raw_decode(text, pos)
        spans.append((start, pos))
    return spans


def test_records_straddling_window_edges_are_read_whole(tmp_path, small_chunks):
    records = [{"conversations": [{"from": "human", "value": "x" * n}]} for n in (0, 5, 40, 3)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    stats = ArrayReadStats()
    assert list(iter_json_array(path, stats)) == records
    assert stats.dropped_incomplete == 0


def test_broken_syntax_before_the_end_is_an_error_with_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"a": 1},\n  {"a": 2 "b": 3},\n  {"a": 4}\n]', encoding="utf-8")
    reader = iter_json_array(path)
    assert next(reader) == {"a": 1}
    with pytest.raises(JsonArrayError, match=r"bad\.json:3:\d+: invalid JSON"):
        next(reader)


def test_a_file_that_is_not_an_array_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "lines.json"
    path.write_text('{"a": 1}\n{"a": 2}\n', encoding="utf-8")
    with pytest.raises(JsonArrayError, match="jsonl"):
        list(iter_json_array(path))
