"""The workloads: synthetic lengths and masks (`variable`, `long`, `low-supervision`), real
ShareGPT, and online.

Synthetic samples follow the reference note: a length uniform in a range of max_length and a
loss mask that hides a random prefix (the prompt), so pad-to-longest batches change shape every
micro-batch as real conversations do. Lengths and masks are plain integers from a seeded
`random.Random`, identical in every process and for every variant of a table.

`low-supervision` is the anchor dimension's workload. The note's variable rows hid a
20-80% prefix at 512 anchors for max_length 2048 (1 anchor per 4 positions), so many samples had
fewer valid anchors than `num_anchors`. At the presets' density of 1 anchor per 16 positions
(64 x 16 = 1024, 512 x 16 = 8192) the same mask leaves almost every sample with more valid
anchors than anchors (measured: 1.00 computed anchor blocks per valid anchor on `variable`).
`low-supervision` keeps the note's lengths and keeps the density, and lowers the supervised share
instead: a random 1/32-3/32 of each sample (mean 1/16) is supervised, so a sample has on average
one valid anchor per 16 of its positions, like a full-length sample has `num_anchors`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

WORKLOADS = ("variable", "long", "sharegpt", "online", "low-supervision")

# Length range of each synthetic workload, as fractions of max_length.
SYNTHETIC_LENGTHS = {
    "variable": (0.25, 1.0),  # the reference's "25-100% of 2048" offline table
    "long": (0.125, 1.0),  # the reference's "1024-8192" offline table
    "low-supervision": (0.25, 1.0),  # the variable table's lengths, with few supervised tokens
}
# Share of each synthetic sample that is an unsupervised prefix (the note's 20-80%).
PREFIX_SHARE = (0.2, 0.8)
# Per workload: 1 - 3/32 .. 1 - 1/32 leaves a mean 1/16 of a sample supervised (see above).
PREFIX_SHARES = {
    "variable": PREFIX_SHARE,
    "long": PREFIX_SHARE,
    "low-supervision": (1.0 - 3 / 32, 1.0 - 1 / 32),
}
# The draft needs an anchor and at least one supervised token after it.
MIN_SUPERVISED = 2

WORKLOAD_NOTES = {
    "variable": "synthetic samples, length uniform in 25-100% of max_length, a random 20-80% "
    "prefix unsupervised",
    "long": "synthetic samples, length uniform in 1/8-1 of max_length, a random 20-80% prefix "
    "unsupervised",
    "low-supervision": "synthetic samples, length uniform in 25-100% of max_length, a random "
    "1/32-3/32 of each supervised (the rest an unsupervised prefix): on average 1 valid anchor "
    "per 16 positions",
    "sharegpt": "real ShareGPT conversations, tokenised and masked as training does",
    "online": "disaggregated: embedded capture server -> local feature store -> producer -> "
    "trainer (ShareGPT prompts)",
}


def parse_workloads(text: str) -> list[str]:
    """Workloads named in a comma list ('all' = every one), in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(WORKLOADS)
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise ValueError(
            f"--workloads: unknown {', '.join(unknown) or '(empty)'}; choose from "
            f"{', '.join(WORKLOADS)} or 'all'"
        )
    return names


def is_synthetic(workload: str) -> bool:
    """True for the workloads whose samples are generated, not read."""
    return workload in SYNTHETIC_LENGTHS


@dataclass(frozen=True)
class SyntheticSample:
    """One generated sample: its length and how many leading tokens are unsupervised."""

    length: int
    prefix: int


def synthetic_samples(
    workload: str, *, max_length: int, count: int, seed: int
) -> list[SyntheticSample]:
    """`count` samples of a synthetic workload, the same for a given (workload, seed)."""
    if workload not in SYNTHETIC_LENGTHS:
        names = ", ".join(SYNTHETIC_LENGTHS)
        raise ValueError(f"{workload!r} is not a synthetic workload ({names})")
    low_share, high_share = SYNTHETIC_LENGTHS[workload]
    low = max(MIN_SUPERVISED + 1, math.ceil(low_share * max_length))
    high = max(low, math.floor(high_share * max_length))
    # A string seed is hashed with SHA-512 by `random`, so it is stable across processes.
    rng = random.Random(f"specdraft-bench:{workload}:{seed}")
    samples = []
    for _ in range(count):
        length = rng.randint(low, high)
        prefix = round(rng.uniform(*PREFIX_SHARES[workload]) * length)
        samples.append(SyntheticSample(length, min(prefix, length - MIN_SUPERVISED)))
    return samples


def synthetic_rows(
    samples: list[SyntheticSample], *, vocab_bound: int, seed: int, id_offset: int = 1
) -> list[dict[str, Any]]:
    """Dataset rows (input_ids, loss_mask, sample_id) for generated samples; tokens are random."""
    import torch

    rows = []
    for index, sample in enumerate(samples):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
        ids = torch.randint(0, vocab_bound, (sample.length,), generator=generator)
        mask = torch.ones(sample.length, dtype=torch.long)
        mask[: sample.prefix] = 0
        rows.append({"input_ids": ids, "loss_mask": mask, "sample_id": id_offset + index})
    return rows
