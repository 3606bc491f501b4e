"""Micro-batch plans for synchronous data parallelism, one per sampler mode.

The plan's kind is the run's `SamplerMode` (`specdraft.config.sampler_mode`: random,
length_grouped, anchor_grouped, bucket_synchronized, length_grouped_bucket_synchronized, packed),
decided once from the config; this module dispatches on it and never re-reads the config's
grouping options.

One optimizer step consumes a *window* of `num_replicas x grad_accum_steps` micro-batches: at
micro-step j every rank runs one micro-batch, and the step ends when the slowest rank is done.
The plan of an epoch is a pure function of (lengths, seed, epoch, sizes), so every rank computes
the same plan and takes its own row; no rank ever talks to another about data order.

Every sample appears exactly once per epoch across all ranks. To keep the ranks in lock-step,
every rank gets the same number of micro-batches (a multiple of grad_accum_steps), so the last
window may hold empty micro-batches `[]`; the trainer runs them as zero-weight dummies. Only the
last window of an epoch holds empties in the random and length-grouped modes.

Bucket-synchronised plans (`bucket_synchronized`, `pad_to` a bucket tuple) put, at every
micro-step of every window, micro-batches of one shape bucket on all ranks, so no rank pads to a
longer bucket than the others. Samples are sorted into their buckets (from the random order, or
the length-grouped one in `length_grouped_bucket_synchronized`) and each bucket's samples are
cut into micro-batches, `num_replicas` at a time ("rows"). Leftovers are placed as follows:

* a bucket's samples that do not fill a whole row are carried up to the next bucket, where they
  fill micro-batches next to that bucket's own samples (every micro-batch holds at least one own
  sample, so it still resolves to that bucket); carried samples pay the larger bucket's padding,
  which is the price of keeping micro-batches full;
* the samples still left at the last bucket are cut into micro-batches, longest bucket first;
  micro-batches that do not fill a row of their bucket form a partial row, padded with `[]`;
* full rows are shuffled (seeded) and partial rows go to the end of the epoch, followed by
  all-empty rows up to a whole window.

An empty micro-batch never slows a micro-step down (the trainer should build its dummy at the
smallest bucket), so it is exempt from the bucket synchronisation.

Anchor-grouped plans (`anchor_grouped`, data.anchor_grouped) sort each shuffled mega-batch
by (shape bucket, anchor count), fullest first, so the rows of a micro-batch need about the same
anchor width and an anchor bucket (or pad-to-longest's exact width) computes few empty blocks.
The count of a sample is `min(num_anchors, valid anchors)` from its loss mask, the number the
collator later reads. Whole optimizer windows (`num_replicas x grad_accum_steps` consecutive
micro-batches: similar widths on every rank and micro-step) are then shuffled (seeded), so the
epoch does not walk each mega-batch from its fullest to its emptiest samples, and a window's
samples still depend only on the window size, not on how it is split over ranks.
The sorted cut of a mega-batch computes no more anchor blocks, at the exact width or any anchor
buckets, than any other cut of it into micro-batches of `micro_batch_size` rows (static shapes
pad a short micro-batch to that many). The epoch's one short micro-batch gets the last
mega-batch's emptiest samples, so under pad-to-longest, which computes real rows only, it may
cost a few blocks more than a random cut's short micro-batch.

Packed plans (`packed`, training.packing) keep the same format: a micro-batch is still a
flat list of sample indices, now the documents of up to `micro_batch_size` rows listed row after
row (the collator recovers the rows with `packing.split_rows`). The epoch's seeded random order
is cut into windows of `mega_batch_multiplier` optimizer windows' worth of rows (by tokens), each
window is packed first-fit-decreasing into rows of `row_capacity` tokens, its rows are shuffled
(seeded) (with shape buckets, the few rows that fit a smaller bucket go to the end of their
window, so they share micro-batches and pad shorter), and consecutive rows form micro-batches,
dealt to ranks as above. Length grouping and bucket synchronisation do not apply to packed
plans (rows are already full).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from specdraft.config import PadTo, ShapePolicy
from specdraft.config.resume_contract import (
    FIELDS_BY_NAME,
    SAMPLER_CONFIG_FIELDS,
    SAMPLER_DEFAULTS,
    SAMPLER_KEYS,
    mode_settings,
    saved_mode,
)
from specdraft.config.sampler_mode import SamplerMode, check_sampler_mode, sampler_mode

from .packing import packed_micro_batches

if TYPE_CHECKING:
    from specdraft.config import Config

MicroBatch = list[int]

# Modes whose base order is length-grouped, and those that cut bucket-synchronised rows.
_LENGTH_ORDERED = ("length_grouped", "length_grouped_bucket_synchronized")
_BUCKET_SYNCED = ("bucket_synchronized", "length_grouped_bucket_synchronized")


class SamplerStateMismatch(ValueError):
    """A saved data position belongs to a plan with other settings; `fields` names them."""

    def __init__(self, message: str, *, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


def derived_seed(seed: int, epoch: int, purpose: str) -> int:
    """A 63-bit seed for one purpose of one epoch, the same on every machine and process."""
    digest = hashlib.sha256(f"specdraft:{purpose}:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _shuffled(n: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=generator).tolist()


def random_order(num_samples: int, *, seed: int, epoch: int) -> list[int]:
    """A seeded permutation of the sample indices for one epoch."""
    return _shuffled(num_samples, derived_seed(seed, epoch, "order"))


def grouped_order(
    keys: Sequence[Any],
    *,
    micro_batch_size: int,
    mega_batch_multiplier: int,
    seed: int,
    epoch: int,
) -> list[int]:
    """A seeded permutation cut into mega-batches, each sorted by `keys[i]`, largest first."""
    order = random_order(len(keys), seed=seed, epoch=epoch)
    mega = micro_batch_size * mega_batch_multiplier
    grouped: list[int] = []
    for start in range(0, len(order), mega):
        # Largest first: the first micro-batch of a run is among its largest, so an out-of-memory
        # shows up on the first step rather than hours in. The sort is stable (also reversed),
        # so ties keep the shuffled order.
        grouped.extend(sorted(order[start : start + mega], key=keys.__getitem__, reverse=True))
    return grouped


def length_grouped_order(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    mega_batch_multiplier: int,
    seed: int,
    epoch: int,
) -> list[int]:
    """A seeded permutation cut into mega-batches, each sorted by length (longest first)."""
    return grouped_order(
        lengths,
        micro_batch_size=micro_batch_size,
        mega_batch_multiplier=mega_batch_multiplier,
        seed=seed,
        epoch=epoch,
    )


def shuffle_windows(micro_batches: list[MicroBatch], *, window: int, seed: int) -> list[MicroBatch]:
    """Shuffle whole windows of `window` consecutive micro-batches; a partial last one stays."""
    whole = len(micro_batches) - len(micro_batches) % window
    blocks = [micro_batches[w : w + window] for w in range(0, whole, window)]
    shuffled = [batch for i in _shuffled(len(blocks), seed) for batch in blocks[i]]
    return shuffled + micro_batches[whole:]


def chunk(order: Sequence[int], size: int) -> list[MicroBatch]:
    """Cut an order into micro-batches of `size` (the last one may be shorter)."""
    return [list(order[i : i + size]) for i in range(0, len(order), size)]


def deal(
    micro_batches: list[MicroBatch], *, num_replicas: int, grad_accum_steps: int
) -> list[list[MicroBatch]]:
    """Deal micro-batches in order over ranks, micro-step by micro-step: [rank][micro_step]."""
    window = num_replicas * grad_accum_steps
    steps = -(-len(micro_batches) // window)
    padded = micro_batches + [[] for _ in range(steps * window - len(micro_batches))]
    plan: list[list[MicroBatch]] = [[] for _ in range(num_replicas)]
    # Consecutive micro-batches share a micro-step on different ranks: with length grouping they
    # have similar lengths, so the ranks of one micro-step wait on each other as little as possible.
    for position, micro_batch in enumerate(padded):
        plan[position % num_replicas].append(micro_batch)
    return plan


def bucket_rows(
    order: Sequence[int],
    lengths: Sequence[int],
    *,
    buckets: tuple[int, ...] | ShapePolicy,
    micro_batch_size: int,
    num_replicas: int,
) -> tuple[list[list[MicroBatch]], list[list[MicroBatch]]]:
    """Rows of `num_replicas` micro-batches of one bucket each: (full rows, partial rows).

    `buckets` is the run's shape policy (or its bucket tuple); which bucket a sample belongs to
    is the policy's `length_index`. See the module docstring for where a bucket's leftovers go.
    """
    size, ranks = micro_batch_size, num_replicas
    policy = ShapePolicy.of(buckets)
    bucket_of = {i: policy.length_index(lengths[i]) for i in order}
    own: list[list[int]] = [[] for _ in policy.lengths]
    for i in order:
        own[bucket_of[i]].append(i)

    full_rows: list[list[MicroBatch]] = []
    last_batches: list[MicroBatch] = []
    carry: list[int] = []
    for k, mine in enumerate(own):
        last = k == len(own) - 1
        # Each micro-batch is led by one of the bucket's own samples, so it resolves to bucket k;
        # below the last bucket only whole rows are cut, the rest is carried up.
        count = min(len(mine), (len(carry) + len(mine)) // size)
        if not last:
            count -= count % ranks
        fillers = carry + mine[count:]
        batches = [[mine[t], *fillers[t * (size - 1) : (t + 1) * (size - 1)]] for t in range(count)]
        carry = fillers[count * (size - 1) :]
        if not last:
            full_rows.extend(batches[r : r + ranks] for r in range(0, len(batches), ranks))
            continue
        # What is left at the last bucket pads to its own bucket. Longest bucket first keeps
        # micro-batches of one bucket together, so partial rows stay few.
        last_batches = batches + chunk(sorted(carry, key=lambda i: -bucket_of[i]), size)

    by_bucket: dict[int, list[MicroBatch]] = {}
    for batch in last_batches:
        top = max(bucket_of[i] for i in batch)
        by_bucket.setdefault(top, []).append(batch)
    partial_rows: list[list[MicroBatch]] = []
    for top in sorted(by_bucket, reverse=True):
        batches = by_bucket[top]
        whole = len(batches) - len(batches) % ranks
        full_rows.extend([batches[r : r + ranks] for r in range(0, whole, ranks)])
        if whole < len(batches):
            rest = batches[whole:]
            partial_rows.append(rest + [[] for _ in range(ranks - len(rest))])
    return full_rows, partial_rows


class MicroBatchSampler:
    """This rank's micro-batches (lists of sample indices) of a seeded per-epoch plan.

    `len()` is the same on every rank and a multiple of `grad_accum_steps`; `epoch_plan(epoch)`
    returns all ranks' micro-batches, `[rank][micro_step]`, identical whichever rank computes it.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        micro_batch_size: int,
        grad_accum_steps: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        mode: SamplerMode | None = None,
        pad_to: PadTo | ShapePolicy = None,
        mega_batch_multiplier: int = 50,
        row_capacity: int | None = None,
        anchor_counts: Sequence[int] | None = None,
    ) -> None:
        """`mode` is the run's sampler mode (`sampler_mode(config)`); None: `packed` when the
        shape policy packs, else `random`. `anchor_counts` (valid anchors per sample) is read
        by `anchor_grouped`, `row_capacity` (default: the policy's) by `packed`."""
        for name, value in (
            ("micro_batch_size", micro_batch_size),
            ("grad_accum_steps", grad_accum_steps),
            ("num_replicas", num_replicas),
            ("mega_batch_multiplier", mega_batch_multiplier),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} = {value} must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1} (num_replicas)")
        self.lengths = [int(n) for n in lengths]
        negative = [i for i, n in enumerate(self.lengths) if n < 0]
        if negative:
            raise ValueError(f"sample {negative[0]} has a negative length {lengths[negative[0]]}")
        self.micro_batch_size = int(micro_batch_size)
        self.grad_accum_steps = int(grad_accum_steps)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.seed = int(seed)
        # The run's ShapePolicy or a seed-style pad_to; plans only need its lengths.
        policy = ShapePolicy.of(pad_to)
        self._policy = policy
        self.pad_to = policy.pad_to
        if mode is None:
            mode = "packed" if policy.packing else "random"
        self.mode: SamplerMode = check_sampler_mode(mode)
        self.mega_batch_multiplier = int(mega_batch_multiplier)
        self.row_capacity: int | None = None
        if self.mode == "packed":
            capacity = row_capacity if row_capacity is not None else policy.row_capacity
            if capacity is None and policy.lengths:
                capacity = max(policy.lengths)
            if capacity is None or int(capacity) < 1:
                raise ValueError(
                    "packing needs a row capacity: pass row_capacity or a static pad_to "
                    "(training.packing requires static_shapes)"
                )
            self.row_capacity = int(capacity)
        self.anchor_counts = None if anchor_counts is None else [int(c) for c in anchor_counts]
        self._anchor_keys: list[tuple[int, int]] = []
        if self.mode == "anchor_grouped":
            self._anchor_keys = self._grouping_keys(anchor_counts, policy)
        if self.mode in _BUCKET_SYNCED:
            if not isinstance(self.pad_to, tuple):
                raise ValueError(
                    "bucket_synchronized needs pad_to to be a tuple of shape buckets "
                    f"(got {self.pad_to!r}); set training.static_shape_buckets"
                )
            # Fails here, with both numbers, rather than mid-epoch in the collator.
            policy.pad_length(max(self.lengths, default=0))
        self.epoch = 0
        self._position = 0
        self._cached: tuple[int, list[list[MicroBatch]]] | None = None
        # After a resume with changed sizes: (epoch, the samples that epoch had left, in the
        # saved plan's order, the saved state): that epoch's plan is built from them alone.
        self._remainder: tuple[int, list[int], dict[str, Any]] | None = None
        # What the last load_state_dict did to the data order, in words (for the run's log).
        self.resume_note = ""

    def _grouping_keys(
        self, anchor_counts: Sequence[int] | None, policy: ShapePolicy
    ) -> list[tuple[int, int]]:
        """(shape bucket, min(num_anchors, count)) per sample: what anchor grouping sorts by."""
        if anchor_counts is None or len(anchor_counts) != len(self.lengths):
            got = "none" if anchor_counts is None else str(len(anchor_counts))
            raise ValueError(
                f"anchor_grouped needs one anchor count per sample ({len(self.lengths)}), got "
                f"{got}: pass the valid anchors of each loss mask (collate.anchor_counts)"
            )
        cap = policy.num_anchors
        # Buckets only: one static length (or pad-to-longest) puts every sample in bucket 0.
        buckets = ShapePolicy.of(self.pad_to if isinstance(self.pad_to, tuple) else None)
        keys = []
        for length, count in zip(self.lengths, anchor_counts, strict=True):
            if int(count) < 0:
                raise ValueError(f"anchor count {count} is negative")
            capped = min(int(count), cap) if cap is not None else int(count)
            keys.append((buckets.length_index(length), capped))
        return keys

    # ------------------------------------------------------------------------------- the plan

    def base_order(self, epoch: int) -> list[int]:
        """The epoch's sample order before micro-batching (random, length- or anchor-grouped)."""
        if self.mode == "anchor_grouped" or self.mode in _LENGTH_ORDERED:
            return grouped_order(
                self._anchor_keys if self.mode == "anchor_grouped" else self.lengths,
                micro_batch_size=self.micro_batch_size,
                mega_batch_multiplier=self.mega_batch_multiplier,
                seed=self.seed,
                epoch=epoch,
            )
        return random_order(len(self.lengths), seed=self.seed, epoch=epoch)

    def epoch_plan(self, epoch: int) -> list[list[MicroBatch]]:
        """Every rank's micro-batches of `epoch`: [rank][micro_step] -> sample indices."""
        if self._cached is not None and self._cached[0] == epoch:
            return [[list(b) for b in row] for row in self._cached[1]]
        if self._remainder is not None and self._remainder[0] == epoch:
            plan = self.plan_of_order(self._remainder[1], epoch)
        else:
            plan = self.plan_of_order(self.epoch_order(epoch), epoch)
        self._cached = (epoch, plan)
        return [[list(b) for b in row] for row in plan]

    def epoch_order(self, epoch: int) -> list[int]:
        """The epoch's samples in the order plans consume them (packing: the random order)."""
        return self.base_order(epoch)

    def plan_of_order(self, order: list[int], epoch: int) -> list[list[MicroBatch]]:
        """The plan of `order` (all of an epoch, or what a resumed epoch has left)."""
        if self.mode == "packed":
            return self._packed_plan(order, epoch)
        if self.mode in _BUCKET_SYNCED:
            return self._bucket_synchronized_plan(order, epoch)
        micro_batches = chunk(order, self.micro_batch_size)
        if self.mode == "anchor_grouped":
            micro_batches = shuffle_windows(
                micro_batches,
                window=self.num_replicas * self.grad_accum_steps,
                seed=derived_seed(self.seed, epoch, "anchor-windows"),
            )
        return deal(
            micro_batches, num_replicas=self.num_replicas, grad_accum_steps=self.grad_accum_steps
        )

    def full_epoch_length(self) -> int:
        """Micro-batches per rank of a whole epoch (a resumed epoch's remainder may be fewer)."""
        epoch = self.epoch + 1 if self._remainder is not None else self.epoch
        return len(self.epoch_plan(epoch)[self.rank])

    def _packed_plan(self, order: list[int], epoch: int) -> list[list[MicroBatch]]:
        assert self.row_capacity is not None
        window = self.micro_batch_size * self.grad_accum_steps * self.num_replicas
        micro_batches = packed_micro_batches(
            order,
            self.lengths,
            capacity=self.row_capacity,
            micro_batch_size=self.micro_batch_size,
            window_rows=self.mega_batch_multiplier * window,
            seed=derived_seed(self.seed, epoch, "packed-rows"),
            pads_short=self._pads_short(),
        )
        return deal(
            micro_batches, num_replicas=self.num_replicas, grad_accum_steps=self.grad_accum_steps
        )

    def _pads_short(self) -> Callable[[int], bool] | None:
        """Whether a packed row of this many tokens pads below the row capacity (to a smaller
        shape bucket, as the policy picks it); None when every row pads to one length."""
        capacity, policy = self.row_capacity or 0, ShapePolicy.of(self.pad_to)
        if not any(length < capacity for length in policy.lengths):
            return None
        largest = policy.lengths[-1]
        return lambda total: total <= largest and policy.pad_length(total) < capacity

    def _bucket_synchronized_plan(self, order: list[int], epoch: int) -> list[list[MicroBatch]]:
        assert isinstance(self.pad_to, tuple)
        full_rows, partial_rows = bucket_rows(
            order,
            self.lengths,
            buckets=self._policy,
            micro_batch_size=self.micro_batch_size,
            num_replicas=self.num_replicas,
        )
        shuffle = _shuffled(len(full_rows), derived_seed(self.seed, epoch, "rows"))
        rows = [full_rows[i] for i in shuffle] + partial_rows
        empty_rows = -len(rows) % self.grad_accum_steps
        rows += [[[] for _ in range(self.num_replicas)] for _ in range(empty_rows)]
        return [[row[rank] for row in rows] for rank in range(self.num_replicas)]

    # ------------------------------------------------------------------------- iteration state

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a new epoch starts at its first micro-batch."""
        if epoch != self.epoch:
            self._position = 0
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.epoch_plan(self.epoch)[self.rank])

    @property
    def position(self) -> int:
        """Micro-batches of the current epoch already taken (where iteration continues)."""
        return self._position

    def __iter__(self) -> Iterator[MicroBatch]:
        plan = self.epoch_plan(self.epoch)[self.rank]
        if self._position >= len(plan):
            self._position = 0  # a finished epoch iterated again starts a fresh pass
        while self._position < len(plan):
            micro_batch = plan[self._position]
            self._position += 1
            yield micro_batch

    def _fingerprint(self) -> dict[str, Any]:
        """The plan's settings as the resume contract's sampler columns name them."""
        settings = {
            "num_samples": len(self.lengths),
            "micro_batch_size": self.micro_batch_size,
            "grad_accum_steps": self.grad_accum_steps,
            "num_replicas": self.num_replicas,
            "seed": self.seed,
            "pad_to": list(self.pad_to) if isinstance(self.pad_to, tuple) else self.pad_to,
            "mega_batch_multiplier": self.mega_batch_multiplier,
            **mode_settings(self.mode),
        }
        return {key: settings[key] for key in SAMPLER_KEYS}

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Epoch and position for an exact resume.

        `consumed` overrides the position with the micro-batches the trainer actually used in
        this epoch (a DataLoader iterates the sampler ahead of the training loop). A finished
        epoch is saved as the start of the next one.
        """
        position = self._position if consumed is None else int(consumed)
        epoch = self.epoch
        if position >= len(self) > 0:
            epoch, position = epoch + 1, 0
        state = {"epoch": epoch, "position": position, **self._fingerprint()}
        if self._remainder is not None and self._remainder[0] == epoch:
            # This epoch's plan is the remainder of an earlier plan: keep how to rebuild it.
            state["resumed_from"] = self._remainder[2]
        return state

    def consumed_and_left(self, state: dict[str, Any]) -> tuple[list[int], list[int]]:
        """The samples a saved state's epoch had trained and had left (in its plan's order),
        from the saved plan rebuilt with the saved settings (same data needed)."""
        saved = MicroBatchSampler(
            self.lengths,
            micro_batch_size=int(state["micro_batch_size"]),
            grad_accum_steps=int(state["grad_accum_steps"]),
            num_replicas=int(state["num_replicas"]),
            seed=int(state["seed"]),
            mode=saved_mode(state),
            pad_to=_pad_policy(state.get("pad_to"), self._policy),
            mega_batch_multiplier=int(state["mega_batch_multiplier"]),
            row_capacity=self.row_capacity,
            anchor_counts=self.anchor_counts,
        )
        epoch = int(state["epoch"])
        earlier: list[int] = []
        if "resumed_from" in state:  # that plan was itself a remainder: rebuild it first
            earlier, left = saved.consumed_and_left(state["resumed_from"])
            saved._remainder = (epoch, left, state["resumed_from"])
        plan = saved.epoch_plan(epoch)
        position = int(state["position"])
        steps = max((len(row) for row in plan), default=0)
        # Micro-step by micro-step, rank by rank: the order `deal` dealt them in.
        flat = [(step, i) for step in range(steps) for row in plan for i in row[step]]
        consumed = earlier + [i for step, i in flat if step < position]
        left = [i for step, i in flat if step >= position]
        return consumed, left

    def load_state_dict(self, state: dict[str, Any], *, allow_changed: Sequence[str] = ()) -> None:
        """Resume at a saved epoch and position; refuses a plan that would differ.

        A changed setting is refused, naming its config field, unless that field is in
        `allow_changed`; then the position is carried over by samples consumed (rounded down to
        a whole optimizer window), accepting that the new plan repeats or skips some samples.
        """
        expected = self._fingerprint()
        saved = _comparable(state)
        changed = [key for key, value in expected.items() if key in saved and saved[key] != value]
        refused = [key for key in changed if not _allowed(key, changed, allow_changed)]
        if refused:
            fields = [SAMPLER_CONFIG_FIELDS[key] for key in refused]
            raise SamplerStateMismatch(
                "cannot resume the data order exactly, the sampler settings changed ("
                + "; ".join(
                    f"{field}: checkpoint {saved[key]!r}, now {expected[key]!r}"
                    for field, key in zip(fields, refused, strict=True)
                )
                + "); resume with the same data and sizes, start a new run, or accept the "
                f"change with --allow-changed {','.join(fields)}",
                fields=fields,
            )
        self.epoch = int(state["epoch"])
        position = int(state["position"])
        self._remainder, self._cached, self.resume_note = None, None, ""
        if "resumed_from" in state and not changed:
            # The saved epoch was a remainder plan: rebuild it, then continue at the position.
            _, left = self.consumed_and_left(state["resumed_from"])
            self._remainder = (self.epoch, left, state["resumed_from"])
        if changed:
            position = self._resume_changed(state, changed, position, expected)
        self._position = position
        if not 0 <= self._position <= len(self):
            raise ValueError(
                f"saved position {self._position} is outside this epoch's {len(self)} micro-batches"
            )

    def _resume_changed(
        self, state: dict[str, Any], changed: list[str], position: int, expected: dict[str, Any]
    ) -> int:
        """A resume with changed plan settings: exact when the data is the same (the saved
        epoch's untrained samples become this epoch's plan), else moved by samples consumed.
        Returns the position to continue at; `resume_note` says what happened and counts."""
        saved = _comparable(state)
        field = SAMPLER_CONFIG_FIELDS
        names = ", ".join(
            field[k]
            if FIELDS_BY_NAME[field[k]].read is None  # the data: its sample counts say little
            else f"{field[k]}: {saved[k]!r} -> {expected[k]!r}"
            for k in changed
        )
        reason = None
        if "num_samples" in changed:
            reason = "the data changed, so the saved plan cannot be rebuilt"
        elif saved_mode(state) == "anchor_grouped" and self.anchor_counts is None:
            reason = "the saved plan was anchor-grouped and this run has no anchor counts"
        if reason is None:
            consumed, left = self.consumed_and_left(state)
            self._remainder = (self.epoch, left, {k: v for k, v in state.items()})
            repeated = len(consumed) + len(left) - len(set(consumed) | set(left))
            skipped = len(self.lengths) - len(set(consumed) | set(left))
            self.resume_note = (
                f"data order changed ({names}): exact, the resumed epoch {self.epoch} trains the "
                f"{len(left)} samples the checkpoint had not trained ({repeated} repeated, "
                f"{skipped} skipped)"
            )
            return 0
        # Samples the saved plan had consumed over all ranks, in the new plan's micro-batches.
        size = int(state.get("micro_batch_size", self.micro_batch_size))
        ranks = int(state.get("num_replicas", self.num_replicas))
        samples = position * size * ranks
        position = samples // (self.micro_batch_size * self.num_replicas)
        position -= position % self.grad_accum_steps
        position = min(position, len(self))
        self.resume_note = (
            f"data order changed ({names}): not exact ({reason}); the epoch continues after "
            f"about {samples} samples, so up to one window of samples may repeat or be skipped "
            "(the count is unknown)"
        )
        return position


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    """A saved state as this version saves it: defaults filled, mode entries normalised.

    Older versions saved the grouping options as configured, also where another one overrides
    them (packing ignores length grouping): the mode they select is what the plan was.
    """
    filled = {**SAMPLER_DEFAULTS, **state}
    return {**filled, **mode_settings(saved_mode(filled))}


def _allowed(key: str, changed: list[str], allow_changed: Sequence[str]) -> bool:
    """Whether a changed sampler setting was allowed: by its config field, or for the mode's
    entries by any changed field that selects the mode (the one the user turned on or off)."""
    if SAMPLER_CONFIG_FIELDS[key] in allow_changed:
        return True
    mode_keys = [k for k in changed if FIELDS_BY_NAME[SAMPLER_CONFIG_FIELDS[k]].selects_mode]
    return key in mode_keys and any(SAMPLER_CONFIG_FIELDS[k] in allow_changed for k in mode_keys)


def _pad_policy(saved: Any, policy: ShapePolicy) -> PadTo | ShapePolicy:
    """The saved plan's pad_to as a plan input (this run's policy when it is unchanged)."""
    current = list(policy.pad_to) if isinstance(policy.pad_to, tuple) else policy.pad_to
    if saved == current:
        return policy
    return tuple(saved) if isinstance(saved, list) else saved


def sampler_from_config(
    config: Config,
    lengths: Sequence[int],
    *,
    num_replicas: int,
    rank: int,
    shapes: ShapePolicy,
    anchor_counts: Sequence[int] | None = None,
) -> MicroBatchSampler:
    """The run's micro-batch sampler, from its config and its one shape policy.

    `anchor_counts` (valid anchors per sample, from the loss masks) is needed when
    data.anchor_grouped is set; the sampler caps them at the policy's num_anchors.
    """
    training = config.training
    mode = sampler_mode(config)
    if mode == "anchor_grouped" and anchor_counts is None:
        raise ValueError(
            "data.anchor_grouped needs each sample's anchor count (from its loss mask); this "
            "data source has no loss masks, so set data.anchor_grouped = false"
        )
    return MicroBatchSampler(
        lengths,
        micro_batch_size=training.micro_batch_size,
        grad_accum_steps=training.grad_accum_steps,
        num_replicas=num_replicas,
        rank=rank,
        seed=training.seed,
        mode=mode,
        pad_to=shapes,
        mega_batch_multiplier=config.data.mega_batch_multiplier,
        row_capacity=config.data.max_length if mode == "packed" else None,
        anchor_counts=anchor_counts if mode == "anchor_grouped" else None,
    )
