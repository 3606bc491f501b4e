"""`specdraft train --dry-run` shows sequence packing in its plan, and the run fingerprint and
the resume rules know the field."""

from __future__ import annotations

import pytest

from specdraft.config import validate_config
from specdraft.config.resume_contract import DATA_ORDER_FIELDS, check_allow_changed
from specdraft.trainer.train.assembly import run_fingerprint
from specdraft.trainer.train.dry_run import dry_run_plan


def config(target: str, **training):
    return validate_config(
        {
            "model": {
                "target": target,
                "algorithm": "dflash2",
                "block_size": 8,
                "target_layer_ids": [0, 2],
                "mask_token_id": 95,
                "dflash2": {"selector_gold_policy": "exclude"},
            },
            "data": {"train_paths": ["t.jsonl"], "max_length": 256},
            "training": {"micro_batch_size": 2, "num_anchors": 8, **training},
        }
    )


def plan(cfg) -> dict[str, str]:
    lines = dry_run_plan(cfg, world_size=1).lines
    return {label.strip(): text.strip() for label, _, text in (s.partition(":") for s in lines)}


@pytest.mark.parametrize("buckets", [None, [128]])
def test_the_dry_run_plan_shows_packing(tiny_qwen3_target, buckets):
    cfg = config(
        tiny_qwen3_target.path, static_shapes=True, packing=True, static_shape_buckets=buckets
    )
    lines = plan(cfg)
    assert lines["packing"].startswith("on: whole conversations packed into rows of 256 tokens")
    assert "evaluation stays unpacked" in lines["packing"]
    assert lines["pad policy"].startswith("packed rows of 256")
    assert "rows per optimizer step" in lines["batch"]


def test_the_dry_run_plan_says_when_packing_is_off(tiny_qwen3_target):
    lines = plan(config(tiny_qwen3_target.path, static_shapes=True))
    assert lines["packing"] == "off (one conversation per row)"
    assert "samples per optimizer step" in lines["batch"]


def test_packing_is_a_data_order_field_recorded_only_when_on(tiny_qwen3_target):
    on = config(tiny_qwen3_target.path, static_shapes=True, packing=True)
    off = config(tiny_qwen3_target.path, static_shapes=True)
    assert run_fingerprint(on, "d")["training.packing"] is True
    # Unpacked fingerprints stay as they were, so older checkpoints still resume.
    assert "training.packing" not in run_fingerprint(off, "d")
    assert "training.packing" in DATA_ORDER_FIELDS
    assert check_allow_changed(["training.packing"]) == ("training.packing",)
