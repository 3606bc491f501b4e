"""The resume contract as one table: the run fingerprint older checkpoints hold, the names
`--allow-changed` accepts, the sampler's saved settings, and the sampler mode they select."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import ShapePolicy, load_config
from specdraft.config.resume_contract import (
    DATA_ORDER_FIELDS,
    IDENTITY_FIELDS,
    RESUME_CONTRACT,
    SAMPLER_CONFIG_FIELDS,
    SAMPLER_DEFAULTS,
    check_allow_changed,
    mode_settings,
    run_fingerprint,
    saved_mode,
    with_defaults,
)
from specdraft.config.sampler_mode import MODE_SELECTING_FIELDS, SAMPLER_MODES, mode_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"

# The run fingerprint of EXAMPLE as checkpoints written before the table existed hold it.
OLDER_FINGERPRINT = {
    "algorithm": "dflash2",
    "block_size": 16,
    "num_anchors": 512,
    "target_layer_ids": [1, 9, 17, 25, 33],
    "num_draft_layers": 5,
    "mask_token_id": 151669,
    "max_length": 2048,
    "data": "d",
    "training.micro_batch_size": 2,
    "training.grad_accum_steps": 4,
    "training.seed": 42,
    "deployment.world_size": 8,
    "data.length_grouped": False,
    "data.bucket_synchronized": False,
    "data.mega_batch_multiplier": 50,
}


def test_the_fingerprint_is_the_one_older_checkpoints_hold() -> None:
    assert run_fingerprint(load_config(EXAMPLE), data="d") == OLDER_FINGERPRINT
    # A newer option is recorded only when it is on, so runs without it write the old format.
    packed = run_fingerprint(load_config(EXAMPLE, ["training.packing=true"]), data="d")
    assert packed == {**OLDER_FINGERPRINT, "training.packing": True}
    grouped = run_fingerprint(load_config(EXAMPLE, ["data.anchor_grouped=true"]), data="d")
    assert grouped == {**OLDER_FINGERPRINT, "data.anchor_grouped": True}
    # Packing ignores anchor grouping: the fingerprint records what the run does.
    both = ["training.packing=true", "data.anchor_grouped=true"]
    assert "data.anchor_grouped" not in run_fingerprint(load_config(EXAMPLE, both), data="d")
    # The defaults column reads the old format as "off".
    assert with_defaults(OLDER_FINGERPRINT)["training.packing"] is False
    assert with_defaults(OLDER_FINGERPRINT)["data.anchor_grouped"] is False
    # A draft vocabulary is part of the draft's identity, recorded only when set.
    pruned = run_fingerprint(load_config(EXAMPLE, ["model.draft_vocab_size=256"]), data="d")
    assert pruned == {**OLDER_FINGERPRINT, "draft_vocab_size": 256}
    assert with_defaults(OLDER_FINGERPRINT)["draft_vocab_size"] is None
    # Attention windows are part of the draft's identity, recorded only when a layer slides.
    config = load_config(EXAMPLE, ["model.sliding_window=64"])
    windows = [64] * config.model.num_draft_layers
    slid = run_fingerprint(config, data="d")
    assert slid == {**OLDER_FINGERPRINT, "model.layer_windows": windows}
    assert with_defaults(OLDER_FINGERPRINT)["model.layer_windows"] is None
    # A window no layer uses (every layer full) is the old fingerprint.
    full = ["model.num_draft_layers=2", "model.sliding_window=64",
            "model.layer_types=['full_attention','full_attention']"]  # fmt: skip
    assert run_fingerprint(load_config(EXAMPLE, full), data="d") == {
        **OLDER_FINGERPRINT,
        "num_draft_layers": 2,
    }
    # The weights a run started from: their sha256, which the run supplies, only when set.
    started = run_fingerprint(load_config(EXAMPLE), data="d", init_weights="sha256:ab")
    assert started == {**OLDER_FINGERPRINT, "model.init_from": "sha256:ab"}
    assert with_defaults(OLDER_FINGERPRINT)["model.init_from"] is None


def test_identity_and_data_order_fields_are_the_rows() -> None:
    assert IDENTITY_FIELDS == (
        "algorithm",
        "block_size",
        "num_anchors",
        "target_layer_ids",
        "num_draft_layers",
        "mask_token_id",
        "max_length",
        "draft_vocab_size",
        "model.layer_windows",
        "model.causal_layers",
        "model.attention_sink_bias",
        "model.init_from",
        "data.labels",
        "training.soft_label_topk",
    )
    assert set(IDENTITY_FIELDS) | set(DATA_ORDER_FIELDS) == {r.name for r in RESUME_CONTRACT}
    # Every sampler setting is named by a data-order field, and every mode field is saved.
    assert set(SAMPLER_CONFIG_FIELDS.values()) <= set(DATA_ORDER_FIELDS)
    assert MODE_SELECTING_FIELDS.issubset(SAMPLER_CONFIG_FIELDS.values())
    assert SAMPLER_DEFAULTS == {"anchor_grouped": False, "packing": False}


def test_allow_changed_accepts_only_data_order_fields() -> None:
    assert check_allow_changed([" training.seed", "training.packing"]) == (
        "training.seed",
        "training.packing",
    )
    with pytest.raises(ValueError, match=r"'model.block_size' cannot be allowed.*training\.seed"):
        check_allow_changed(["model.block_size"])


@settings(max_examples=60, deadline=None)
@given(flags=st.sets(st.sampled_from(sorted(MODE_SELECTING_FIELDS))))
def test_a_saved_state_reads_back_as_the_mode_its_flags_select(flags: set[str]) -> None:
    mode = mode_of(flags)
    state = {key: field in flags for key, field in SAMPLER_CONFIG_FIELDS.items()}
    assert saved_mode(state) == mode
    # This version saves the mode's own flags, which read back as the same mode.
    assert saved_mode(mode_settings(mode)) == mode


def test_every_mode_has_its_own_saved_flags() -> None:
    saved = {tuple(sorted(mode_settings(m).items())) for m in SAMPLER_MODES}
    assert len(saved) == len(SAMPLER_MODES)


@settings(max_examples=80, deadline=None)
@given(
    buckets=st.lists(st.integers(1, 64), min_size=1, max_size=6, unique=True).map(
        lambda b: tuple(128 * x for x in sorted(b))
    ),
    fraction=st.floats(0, 1),
)
def test_the_bucket_index_is_the_pad_lengths_bucket(buckets: tuple[int, ...], fraction: float):
    policy = ShapePolicy(pad_to=buckets)
    longest = int(fraction * buckets[-1])
    assert policy.lengths[policy.length_index(longest)] == policy.pad_length(longest)
    assert ShapePolicy(pad_to=None).length_index(longest) == 0
