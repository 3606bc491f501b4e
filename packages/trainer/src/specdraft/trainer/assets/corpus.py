"""A fixed, deterministic slice of the ShareGPT package: the text the tiny assets learn from."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from ..data.bad_rows import BadRow
from ..data.conversations import normalise_conversation
from ..data.sharegpt import iter_json_array, sharegpt_package_file


def sharegpt_conversations(first: int, count: int) -> Iterator[list[dict[str, str]]]:
    """Records first..first+count of the package (in file order), as role/content messages.

    Rows that could not train (no assistant turn, malformed) are passed over, so the slice is a
    pure function of the package file.
    """
    for record in islice(iter_json_array(sharegpt_package_file()), first, first + count):
        try:
            yield normalise_conversation(record)
        except BadRow:
            continue


def sharegpt_texts(first: int, count: int, max_chars: int) -> list[str]:
    """Turn texts of the slice, in order, until `max_chars` characters are collected."""
    texts: list[str] = []
    total = 0
    for messages in sharegpt_conversations(first, count):
        for message in messages:
            if total >= max_chars:
                return texts
            texts.append(message["content"])
            total += len(message["content"])
    return texts
