"""Sequence packing: whole documents into rows of a fixed capacity, and packed micro-batch plans.

Two packers with one job each:
- `pack_first_fit_decreasing` builds the rows (the sampler, once per window of documents): few,
  well filled rows;
- `split_rows` recovers them (the collator, from a micro-batch's flat list of documents): next-fit
  in the given order. The plan lists a micro-batch's rows one after another, and next-fit over a
  concatenation of groups that each fit never needs more rows than there are groups (each row it
  closes reaches at least as far as the group it stands for), so the collator never gets more
  rows than the sampler planned, without the plan having to store the partition.

`packed_micro_batches` is the sampler's packing mode: shuffled windows of documents, FFD in each,
rows shuffled, `micro_batch_size` rows per micro-batch. Torch only for the seeded shuffles (the
same generator as the unpacked plans, so every rank computes the same plan).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

MicroBatch = list[int]


def _check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or int(capacity) < 1:
        raise ValueError(f"row capacity {capacity!r} must be a positive number of tokens")
    return int(capacity)


def _check_length(position: int, length: int, capacity: int) -> None:
    if length < 0:
        raise ValueError(f"document {position} has a negative length {length}")
    if length > capacity:
        raise ValueError(
            f"document {position} has {length} tokens, more than a row holds ({capacity}); "
            f"truncate documents to data.max_length before packing"
        )


def split_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Positions into `lengths`, cut into rows by next-fit in the given order."""
    capacity = _check_capacity(capacity)
    rows: list[list[int]] = []
    room = -1  # no open row yet
    for position, length in enumerate(lengths):
        length = int(length)
        _check_length(position, length, capacity)
        if not rows or length > room:
            rows.append([])
            room = capacity
        rows[-1].append(position)
        room -= length
    return rows


class _FirstFit:
    """Rows by remaining room in a max segment tree: the leftmost row that fits in O(log rows)."""

    def __init__(self, max_rows: int, capacity: int) -> None:
        self.size = 1
        while self.size < max(1, max_rows):
            self.size *= 2
        # Unopened rows have the whole capacity: "the first row that fits" is then the next new
        # row, which is exactly first-fit's "open a row when none fits".
        self.room = [capacity] * (2 * self.size)

    def place(self, length: int) -> int:
        """Take `length` tokens from the leftmost row with room for them; its index."""
        node = 1
        while node < self.size:
            node = 2 * node if self.room[2 * node] >= length else 2 * node + 1
        row = node - self.size
        self.room[node] -= length
        node //= 2
        while node:
            self.room[node] = max(self.room[2 * node], self.room[2 * node + 1])
            node //= 2
        return row


def pack_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Positions into `lengths` packed into rows of `capacity` tokens by first-fit-decreasing.

    Rows come out in the order they were opened; within a row, longest document first. Ties keep
    the given order, so the result is a pure function of the input.
    """
    capacity = _check_capacity(capacity)
    values = [int(n) for n in lengths]
    for position, length in enumerate(values):
        _check_length(position, length, capacity)
    if not values:
        return []
    order = sorted(range(len(values)), key=lambda i: -values[i])
    tree = _FirstFit(len(values), capacity)
    rows: list[list[int]] = []
    for position in order:
        row = tree.place(values[position])
        if row == len(rows):
            rows.append([])
        rows[row].append(position)
    return rows


def packing_windows(
    order: Sequence[int], lengths: Mapping[int, int] | Sequence[int], *, window_tokens: int
) -> list[list[int]]:
    """Cut a document order into windows of at least `window_tokens` tokens (the last: the rest)."""
    windows: list[list[int]] = []
    current: list[int] = []
    total = 0
    for index in order:
        current.append(index)
        total += lengths[index]
        if total >= window_tokens:
            windows.append(current)
            current, total = [], 0
    if current:
        windows.append(current)
    return windows


def _shuffled(items: list[list[int]], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [items[i] for i in torch.randperm(len(items), generator=generator).tolist()]


def packed_rows(
    order: Sequence[int],
    lengths: Sequence[int],
    *,
    capacity: int,
    window_rows: int,
    seed: int,
    pads_short: Callable[[int], bool] | None = None,
) -> list[list[int]]:
    """Rows of sample indices: `order` cut into windows of about `window_rows` full rows, FFD in
    each window, each window's rows shuffled (seeded).

    With `pads_short` (whether a row of that many tokens pads to a length below the capacity,
    i.e. a smaller shape bucket: the shape policy's answer), those rows go to the end of their
    window, fullest first, so they share micro-batches and pad shorter instead of each padding to
    the capacity next to a full row.
    """
    capacity = _check_capacity(capacity)
    clipped = {i: min(int(lengths[i]), capacity) for i in order}
    rows: list[list[int]] = []
    windows = packing_windows(order, clipped, window_tokens=max(1, window_rows) * capacity)
    for number, window in enumerate(windows):
        groups = pack_first_fit_decreasing([clipped[i] for i in window], capacity)
        shuffled = _shuffled([[window[p] for p in group] for group in groups], seed + number)
        if pads_short is None:
            rows.extend(shuffled)
            continue
        total = {id(row): sum(clipped[i] for i in row) for row in shuffled}
        short_ids = {id(row) for row in shuffled if pads_short(total[id(row)])}
        rows.extend(row for row in shuffled if id(row) not in short_ids)
        # sorted() is stable: equal totals keep their shuffled order.
        short = [row for row in shuffled if id(row) in short_ids]
        rows.extend(sorted(short, key=lambda row: -total[id(row)]))
    return rows


def packed_micro_batches(
    order: Sequence[int],
    lengths: Sequence[int],
    *,
    capacity: int,
    micro_batch_size: int,
    window_rows: int,
    seed: int,
    pads_short: Callable[[int], bool] | None = None,
) -> list[MicroBatch]:
    """Micro-batches of `micro_batch_size` packed rows each, listed row after row."""
    rows = packed_rows(
        order,
        lengths,
        capacity=capacity,
        window_rows=window_rows,
        seed=seed,
        pads_short=pads_short,
    )
    return [
        [index for row in rows[start : start + micro_batch_size] for index in row]
        for start in range(0, len(rows), micro_batch_size)
    ]
