"""Soft findings about checkpoints and anchors: keep_every_n_steps without keep_last_checkpoints
(SD223) and num_anchors above what a sample of max_length can hold (SD224), each at the value
that causes it and not one below."""

from __future__ import annotations

import pytest

from specdraft.config import validate_config
from specdraft.config.rules import shape_problems


def config(training: dict, max_length: int = 128):
    return validate_config(
        {
            "model": {
                "target": "unused",
                "algorithm": "dflash2",
                "target_layer_ids": [0, 2],
                "mask_token_id": 4095,
                "dflash2": {"selector_gold_policy": "insert"},
            },
            "data": {"train_paths": ["pkg:sharegpt"], "max_length": max_length},
            "training": training,
        }
    )


def codes(cfg) -> list[str]:
    return [p.code for p in shape_problems(cfg)]


@pytest.mark.parametrize(("keep_last", "found"), [(None, True), (3, False)])
def test_keep_every_needs_keep_last(keep_last, found):
    cfg = config({"keep_every_n_steps": 100, "keep_last_checkpoints": keep_last, "num_anchors": 8})
    assert ("SD223" in codes(cfg)) is found


@pytest.mark.parametrize(("num_anchors", "found"), [(127, False), (128, True)])
def test_num_anchors_above_what_a_sample_holds(num_anchors, found):
    cfg = config({"num_anchors": num_anchors})
    assert ("SD224" in codes(cfg)) is found
