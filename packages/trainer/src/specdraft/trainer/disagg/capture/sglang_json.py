"""Read stock SGLang's `/generate` answer fast: the numbers of `meta_info.hidden_states` go from
the raw body straight into one numpy array, never through a Python list of lists.

Stock SGLang sends a prompt's hidden states as nested JSON lists of floats: hundreds of MB for
one sample (1,300 tokens of 5 x 4096 values are 291 MB). Decoding that into Python floats and
then a tensor took 11 s per sample; here the field is cut out of the body, its bracket skeleton
is walked once per row to learn the layout, and its numbers are parsed by a C text parser
(pandas', which `datasets` brings, else numpy's) into float32 in one pass. The rest of the
body, with the field replaced by `null`, is small and decoded with orjson.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
import orjson

# What a nested list of numbers is made of, besides its brackets and commas.
_DIGITS = b"0123456789.-+eE"
_SPACES = b" \t\r\n"
_SPACE = re.compile(rb"\s*")


class NotNumbers(ValueError):
    """The field is not a nested list of numbers of the layout SGLang sends."""


@dataclass(frozen=True)
class NumericField:
    """A field's numbers, flat, and its layout: one (offset, rows, width) per outer entry
    (rows is None for a 1-D entry, a decode row)."""

    values: np.ndarray
    entries: tuple[tuple[int, int | None, int], ...]

    def prefill_rows(self) -> np.ndarray:
        """The 2-D entries (prefill chunks) stacked: [rows, width] float32."""
        blocks = []
        widths = set()
        for offset, rows, width in self.entries:
            if rows is None:
                continue  # a decode row of a generated token
            widths.add(width)
            blocks.append(self.values[offset : offset + rows * width].reshape(rows, width))
        if len(widths) > 1:
            raise NotNumbers(f"prefill chunks have rows of different widths {sorted(widths)}")
        if not blocks:
            return np.empty((0, 0), dtype=np.float32)
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def decode_generate_body(raw: bytes, fields: tuple[str, ...]) -> tuple[object, dict]:
    """(the body decoded with each numeric field in `fields` set to None, {name: NumericField}
    for the fields that hold numbers). A field that holds anything else stays in the body."""
    numeric: dict[str, NumericField] = {}
    for name in fields:
        span = _numeric_span(raw, name)
        if span is None:
            continue
        start, end = span
        numeric[name] = parse_numeric(raw[start:end])
        raw = raw[:start] + b"null" + raw[end:]
    return orjson.loads(raw), numeric


def _numeric_span(raw: bytes, name: str) -> tuple[int, int] | None:
    """Where the value of key `name` lies if it is a list whose first leaf is a number."""
    key = b'"' + name.encode() + b'":'
    at = raw.find(key)
    if at < 0:
        return None
    start = _SPACE.match(raw, at + len(key)).end()  # type: ignore[union-attr]
    first = start
    while first < len(raw) and raw[first] in b"[ \t\r\n":
        first += 1
    if start == first or first >= len(raw) or raw[first] not in b"-0123456789":
        return None  # null, an empty list, the plugin's reference object, ...
    # Numbers, brackets and commas hold no quote and no brace: the value ends before the next.
    ends = [i for i in (raw.find(b'"', start), raw.find(b"}", start)) if i >= 0]
    end = min(ends) if ends else len(raw)
    while end > start and raw[end - 1] in b" \t\r\n,":
        end -= 1
    return start, end


def parse_numeric(value: bytes) -> NumericField:
    """Parse a nested list of numbers (outer list of 2-D and 1-D entries)."""
    skeleton = value.translate(None, _DIGITS)
    compact = skeleton.translate(None, _SPACES)
    if compact.translate(None, b"[],"):
        raise NotNumbers("it holds something other than numbers (null, NaN or text)")
    entries = _layout(compact)
    values = parse_floats(value.translate(None, b"[]"), compact=len(compact) == len(skeleton))
    expected = sum(width * (rows or 1) for _, rows, width in entries)
    if values.size != expected:
        raise NotNumbers(f"{values.size} numbers where the layout holds {expected}")
    return NumericField(values, tuple(entries))


def parse_floats(text: bytes, *, compact: bool) -> np.ndarray:
    """Comma-separated numbers as float32: pandas' C parser (one number per 'line') where the
    text has no whitespace, as orjson writes it (2x numpy's parser here), else numpy's."""
    if compact and text:
        try:
            import pandas as pd
        except ImportError:
            pass
        else:
            try:
                frame = pd.read_csv(
                    io.BytesIO(text), header=None, dtype=np.float32, engine="c", lineterminator=","
                )
            except ValueError as exc:  # a field that is no number ("1-2", "e")
                raise NotNumbers(f"a value is not a number ({exc})") from None
            if frame.shape[1] != 1:
                return np.empty(0, np.float32)  # not one number per field: the count check fails
            values = frame.iloc[:, 0].to_numpy()
            # Copy-on-write pandas hands out read-only arrays; torch wants to own a writable one.
            return values if values.flags.writeable else values.copy()
    with warnings.catch_warnings():
        # numpy warns (and stops) at data it cannot parse; the caller's count check reports it.
        warnings.simplefilter("ignore")
        return np.fromstring(text, dtype=np.float32, sep=",")


def _layout(skel: bytes) -> list[tuple[int, int | None, int]]:
    """Walk the bracket skeleton ('[', ']', ',' only): one (offset, rows, width) per entry."""
    if skel[:1] != b"[" or skel[-1:] != b"]":
        raise NotNumbers("it is not a list")
    entries: list[tuple[int, int | None, int]] = []
    if skel == b"[]":
        return entries
    pos, offset = 1, 0
    while True:
        if skel[pos : pos + 2] == b"[[":  # a 2-D entry: rows of equal width
            pos += 1
            rows, width = 0, None
            while True:
                pos, row_width = _row(skel, pos)
                if width is not None and row_width != width:
                    raise NotNumbers(f"rows of {width} and {row_width} values in one chunk")
                width, rows = row_width, rows + 1
                if skel[pos : pos + 2] == b",[":
                    pos += 1
                    continue
                if skel[pos : pos + 1] != b"]":
                    raise NotNumbers("a chunk is not a list of rows")
                pos += 1
                break
            entries.append((offset, rows, width or 0))
            offset += rows * (width or 0)
        elif skel[pos : pos + 1] == b"[":  # a 1-D entry
            pos, width = _row(skel, pos)
            entries.append((offset, None, width))
            offset += width
        else:
            raise NotNumbers("an entry is a bare number")
        if skel[pos : pos + 2] == b",[":
            pos += 1
            continue
        if skel[pos:] != b"]":
            raise NotNumbers("the list is nested deeper than chunks of rows")
        return entries


def _row(skel: bytes, pos: int) -> tuple[int, int]:
    """A row '[,,,]' at `pos`: (position after it, its number of values)."""
    end = skel.find(b"]", pos)
    if end < 0 or skel.find(b"[", pos + 1, end) >= 0:
        raise NotNumbers("a row is nested or unterminated")
    return end + 1, end - pos  # commas + 1
