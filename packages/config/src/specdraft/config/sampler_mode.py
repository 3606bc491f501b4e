"""The run's sampler mode: which kind of micro-batch plan the data settings select, decided once.

Four config fields select the plan (data.length_grouped, data.anchor_grouped,
data.bucket_synchronized, training.packing), and some of them override others: packing ignores
the three grouping options (rule SD219), anchor grouping replaces length grouping (SD222), and
anchor grouping cannot be combined with bucket synchronisation (SD220, refused by the schema).
`mode_of` is the one place that applies that precedence; the sampler, the padding accounting,
explain-buckets, the linter, the dry-run plan, the resume contract and the run assembly dispatch
on the mode it returns and never read the four fields themselves (nor does the schema's SD220
refusal: it asks `anchor_grouping_with_bucket_sync`).

The modes:

- `random`: a seeded permutation cut into micro-batches;
- `length_grouped`: shuffled mega-batches, each sorted by length;
- `anchor_grouped`: shuffled mega-batches sorted by (shape bucket, anchor count), whole windows
  shuffled;
- `bucket_synchronized`: rows of one shape bucket across the ranks, from the random order;
- `length_grouped_bucket_synchronized`: the same rows, cut from the length-grouped order (both
  options on; kept as its own mode because checkpoints of such runs hold this plan);
- `packed`: whole documents first-fit-decreasing into rows of data.max_length.

Torch-free, like the rest of the config package: `lint`, `config show` and `explain-buckets`
read it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from .schema import Config

SamplerMode = Literal[
    "random",
    "length_grouped",
    "anchor_grouped",
    "bucket_synchronized",
    "length_grouped_bucket_synchronized",
    "packed",
]
SAMPLER_MODES: tuple[SamplerMode, ...] = get_args(SamplerMode)

# The config fields (set to true) that select each mode; `mode_of` inverts it.
MODE_FIELDS: dict[SamplerMode, frozenset[str]] = {
    "random": frozenset(),
    "length_grouped": frozenset({"data.length_grouped"}),
    "anchor_grouped": frozenset({"data.anchor_grouped"}),
    "bucket_synchronized": frozenset({"data.bucket_synchronized"}),
    "length_grouped_bucket_synchronized": frozenset(
        {"data.length_grouped", "data.bucket_synchronized"}
    ),
    "packed": frozenset({"training.packing"}),
}
# Every field that takes part in choosing the mode.
MODE_SELECTING_FIELDS = frozenset().union(*MODE_FIELDS.values())

# Modes whose micro-batches depend on the shape buckets (they sort or cut by bucket).
BUCKET_DEPENDENT_MODES = frozenset(
    {"anchor_grouped", "bucket_synchronized", "length_grouped_bucket_synchronized", "packed"}
)
# The mode with the same sample order whose micro-batches do not depend on the buckets: the
# suggestion and the pad-to-longest / static comparisons are fair only on those.
_BUCKET_FREE: dict[SamplerMode, SamplerMode] = {
    "random": "random",
    "length_grouped": "length_grouped",
    "anchor_grouped": "random",
    "bucket_synchronized": "random",
    "length_grouped_bucket_synchronized": "length_grouped",
    "packed": "random",
}


def mode_of(enabled: Iterable[str]) -> SamplerMode:
    """The mode that the config fields set to true in `enabled` select (their precedence)."""
    on = frozenset(enabled) & MODE_SELECTING_FIELDS
    if "training.packing" in on:
        return "packed"  # packed rows ignore every grouping option (SD219)
    if "data.bucket_synchronized" in on:
        # The schema refuses anchor grouping next to it (SD220).
        if "data.length_grouped" in on:
            return "length_grouped_bucket_synchronized"
        return "bucket_synchronized"
    if "data.anchor_grouped" in on:
        return "anchor_grouped"  # replaces length grouping (SD222)
    if "data.length_grouped" in on:
        return "length_grouped"
    return "random"


def enabled_fields(config: Config) -> frozenset[str]:
    """The mode-selecting config fields that `config` sets to true."""
    data = config.data
    flags = {
        "data.length_grouped": data.length_grouped,
        "data.anchor_grouped": data.anchor_grouped,
        "data.bucket_synchronized": data.bucket_synchronized,
        "training.packing": config.training.packing,
    }
    return frozenset(name for name, on in flags.items() if on)


def sampler_mode(config: Config) -> SamplerMode:
    """The run's sampler mode, from its data and packing settings."""
    return mode_of(enabled_fields(config))


def anchor_grouping_with_bucket_sync(enabled: Iterable[str]) -> bool:
    """True when anchor grouping would apply next to bucket synchronisation (refused, SD220).

    Asked of `mode_of` rather than of the fields, so the refusal follows the precedence: under
    packing neither option applies and the pair is merely ignored (SD219).
    """
    on = frozenset(enabled)
    alone = on - {"data.bucket_synchronized"}
    return "data.bucket_synchronized" in on and mode_of(alone) == "anchor_grouped"


def check_sampler_mode(mode: str) -> SamplerMode:
    """`mode` itself when it names a sampler mode; a ValueError listing the modes otherwise."""
    if mode not in SAMPLER_MODES:
        raise ValueError(
            f"unknown sampler {mode!r}; choose a sampler mode: {', '.join(SAMPLER_MODES)}"
        )
    return mode


def bucket_free_mode(mode: SamplerMode) -> SamplerMode:
    """The mode of the same sample order whose micro-batches do not depend on the buckets."""
    return _BUCKET_FREE[check_sampler_mode(mode)]
