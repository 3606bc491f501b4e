"""The sampler mode as the one reader of the four fields that select it: the schema's SD220
refusal and "is the plan anchor-grouped" both follow `mode_of`'s precedence."""

from __future__ import annotations

import itertools

import pytest
from config_cases import BASE

from specdraft.config import load_config
from specdraft.config.sampler_mode import (
    MODE_SELECTING_FIELDS,
    anchor_grouping_with_bucket_sync,
    enabled_fields,
    sampler_mode,
)

FIELDS = sorted(MODE_SELECTING_FIELDS)
SUBSETS = [
    frozenset(chosen)
    for size in range(len(FIELDS) + 1)
    for chosen in itertools.combinations(FIELDS, size)
]


@pytest.mark.parametrize("on", SUBSETS, ids=lambda on: "+".join(sorted(on)) or "none")
def test_anchor_grouping_is_refused_next_to_bucket_sync_unless_packing_ignores_both(on):
    both = {"data.anchor_grouped", "data.bucket_synchronized"} <= on
    assert anchor_grouping_with_bucket_sync(on) == (both and "training.packing" not in on)


@pytest.mark.parametrize(
    ("packing", "grouped"), list(itertools.product((False, True), (False, True)))
)
def test_a_plan_is_anchor_grouped_exactly_when_the_field_is_set_and_packing_is_off(
    tmp_path, packing, grouped
):
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    flags = {"data.anchor_grouped": grouped, "training.packing": packing}
    config = load_config(path, [f"{key}={str(on).lower()}" for key, on in flags.items()])
    assert ("data.anchor_grouped" in enabled_fields(config)) == grouped
    assert (sampler_mode(config) == "anchor_grouped") == (grouped and not packing)
