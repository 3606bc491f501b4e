"""The code table: stable, unique codes, and every schema rule reported under its own code."""

from __future__ import annotations

from specdraft.config.codes import BY_CODE, CODES, code_for
from specdraft.config.schema import RULE_TYPES

# Which code range each schema rule belongs to (SD2xx shapes, SD3xx model, SD4xx deployment).
RANGES = {
    "bucket_not_multiple": "SD2",
    "bucket_not_increasing": "SD2",
    "buckets_without_static": "SD2",
    "bucket_above_max_length": "SD2",
    "max_length_not_multiple": "SD2",
    "bucket_sync_without_buckets": "SD2",
    "recompile_check_without_compile": "SD2",
    "fp8_needs_fsdp2": "SD2",
    "anchor_bucket_not_positive": "SD2",
    "anchor_bucket_not_increasing": "SD2",
    "anchor_bucket_above_num_anchors": "SD2",
    "anchor_buckets_without_static": "SD2",
    "packing_without_static": "SD2",
    "anchor_grouped_with_bucket_sync": "SD2",
    "layer_id_negative": "SD3",
    "layer_id_duplicate": "SD3",
    "selector_gold_policy_missing": "SD3",
    "loss_decay_gamma_missing": "SD3",
    "block_too_small": "SD3",
    "layer_types_length": "SD3",
    "window_below_block": "SD3",
    "sliding_without_window": "SD3",
    "features_with_disaggregated": "SD4",
    "watermark_below_window": "SD4",
    "soft_labels_without_topk": "SD3",
    "target_labels_disaggregated": "SD4",
    # A schema-wide bound (every `le` constraint), reported like the other schema errors.
    "above_limit": "SD1",
}


def test_codes_and_names_are_unique_and_well_formed():
    assert len({c.code for c in CODES}) == len(CODES)
    assert len({c.name for c in CODES}) == len(CODES)
    for code in CODES:
        assert code.code[:2] == "SD" and code.code[2:].isdigit() and len(code.code) == 5
        assert code.severity in ("error", "warning", "note")
        assert code.summary.endswith(".")
    assert {c.code for c in CODES if c.fatal} == {"SD001", "SD002", "SD003", "SD004"}


def test_every_schema_rule_has_its_own_code_in_its_range():
    assert set(RANGES) == set(RULE_TYPES), "a rule was added to schema.py: give it a code"
    codes = [code_for(rule).code for rule in RULE_TYPES]
    assert len(set(codes)) == len(codes)
    for rule in RULE_TYPES:
        assert code_for(rule).code.startswith(RANGES[rule])
        assert code_for(rule).severity == "error"


def test_pydantic_error_types_map_to_schema_codes():
    assert code_for("extra_forbidden").code == "SD101"
    assert code_for("missing").code == "SD102"
    for error_type in ("int_type", "int_parsing", "bool_parsing", "list_type", "int_from_float"):
        assert code_for(error_type).code == "SD103"
    assert code_for("literal_error").code == "SD104"
    assert code_for("greater_than").code == "SD105"
    assert code_for("finite_number").code == "SD105"
    assert code_for("int_parsing_size").code == "SD105"
    assert code_for("too_short").code == "SD106"
    assert code_for("string_pattern_mismatch").code == "SD107"
    assert code_for("something_new").code == "SD199"
    assert BY_CODE["SD199"].severity == "error"
