"""One sampler mode per plan kind: the plans older checkpoints hold are rebuilt bit for bit, their
saved states (the grouping options as configured, overridden ones included) resume in place, and
a mode change is refused or allowed by the config field that selects it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import MicroBatchSampler, plan_micro_batches, sampler_from_config
from specdraft.collate.samplers import SamplerStateMismatch
from specdraft.config import ShapePolicy, load_config
from specdraft.config.sampler_mode import SAMPLER_MODES, sampler_mode

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
LENGTHS = [(37 * i) % 1000 + 1 for i in range(97)]
COUNTS = [(11 * i) % 20 for i in range(97)]
SIZES = {
    "micro_batch_size": 3,
    "grad_accum_steps": 2,
    "num_replicas": 2,
    "seed": 5,
    "mega_batch_multiplier": 4,
}
POLICY = ShapePolicy(pad_to=(128, 256, 512, 1024), num_anchors=16, anchor_buckets=(4, 8, 16))
ANCHORS = {"mode": "anchor_grouped", "anchor_counts": COUNTS}

# Epochs 0 and 1 of each mode on LENGTHS, as the sampler built them before the plan kinds became
# one mode (sha256 of the JSON plans, first 16 hex digits), with the grouping flags that version
# saved. A checkpoint stores only the settings and the position, so a resume is exact only if
# the same settings rebuild the same plan: a changed digest would repeat and skip samples.
OLDER_PLANS = {
    "random": ({"pad_to": POLICY}, "f6cbded200efc30d", {}),
    "length_grouped": (
        {"mode": "length_grouped", "pad_to": POLICY},
        "52aa825c698fedfe",
        {"length_grouped": True},
    ),
    "anchor_grouped": ({**ANCHORS, "pad_to": POLICY}, "c5403f51a1a3a27e", {"anchor_grouped": True}),
    # Length grouping as well, which anchor grouping replaces (SD222): older states saved both.
    "anchor_grouped, length_grouped saved too": (
        {**ANCHORS, "pad_to": POLICY},
        "c5403f51a1a3a27e",
        {"anchor_grouped": True, "length_grouped": True},
    ),
    "anchor_grouped, pad to longest": (
        {**ANCHORS, "pad_to": ShapePolicy(pad_to=None, num_anchors=16)},
        "1b27d429c81ce48a",
        {"anchor_grouped": True},
    ),
    "bucket_synchronized": (
        {"mode": "bucket_synchronized", "pad_to": POLICY},
        "71710ef6c6f36e60",
        {"bucket_synchronized": True},
    ),
    "length_grouped_bucket_synchronized": (
        {"mode": "length_grouped_bucket_synchronized", "pad_to": POLICY},
        "ea8f570f5f3b2e6d",
        {"length_grouped": True, "bucket_synchronized": True},
    ),
    "packed": (
        {"pad_to": ShapePolicy(pad_to=1024, packing=True)},
        "623d9fc84c94aded",
        {"packing": True},
    ),
    # Packing ignores the grouping options (SD219): older states saved them as configured.
    "packed, grouping saved too": (
        {"mode": "packed", "row_capacity": 1024, "pad_to": (256, 1024)},
        "623d9fc84c94aded",
        {"packing": True, "length_grouped": True, "bucket_synchronized": True},
    ),
}


def older_state(flags: dict[str, bool], pad_to: list[int] | int | None) -> dict:
    """A sampler state as the version before sampler modes saved it (epoch 1, position 2)."""
    grouping = {"length_grouped": False, "bucket_synchronized": False}
    grouping.update({k: v for k, v in flags.items() if k in grouping})
    state = {
        "epoch": 1,
        "position": 2,
        "num_samples": len(LENGTHS),
        **{k: v for k, v in SIZES.items() if k != "mega_batch_multiplier"},
        **grouping,
        "pad_to": pad_to,
        "mega_batch_multiplier": SIZES["mega_batch_multiplier"],
    }
    # Only the newer options' keys may be missing: the defaults read them as off.
    state.update({k: v for k, v in flags.items() if k in ("packing", "anchor_grouped")})
    return state


def digest(plans: list) -> str:
    return hashlib.sha256(json.dumps(plans).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", list(OLDER_PLANS))
def test_an_older_checkpoints_plan_is_rebuilt_and_its_state_resumes_in_place(name: str) -> None:
    options, expected, flags = OLDER_PLANS[name]
    sampler = MicroBatchSampler(LENGTHS, **SIZES, **options)
    plans = [sampler.epoch_plan(epoch) for epoch in (0, 1)]
    assert digest(plans) == expected
    pad_to = ShapePolicy.of(options["pad_to"]).pad_to
    saved = older_state(flags, list(pad_to) if isinstance(pad_to, tuple) else pad_to)
    resumed = MicroBatchSampler(LENGTHS, **SIZES, **options)
    resumed.load_state_dict(saved)
    resumed.set_epoch(1)
    assert list(resumed) == plans[1][0][2:]
    assert resumed.resume_note == ""


def test_the_config_decides_the_mode_once_with_the_lint_rules_precedence() -> None:
    def mode(*overrides: str) -> str:
        return sampler_mode(load_config(EXAMPLE, overrides))

    assert mode() == "random"
    assert mode("data.length_grouped=true") == "length_grouped"
    assert mode("data.length_grouped=true", "data.anchor_grouped=true") == "anchor_grouped"
    assert mode("data.bucket_synchronized=true") == "bucket_synchronized"
    both = ("data.bucket_synchronized=true", "data.length_grouped=true")
    assert mode(*both) == "length_grouped_bucket_synchronized"
    assert mode("training.packing=true", *both) == "packed"
    assert mode("training.packing=true", "data.anchor_grouped=true") == "packed"


def test_the_trainers_sampler_and_the_accounting_count_the_same_plan() -> None:
    # Both options on: explain-buckets used to count bucket rows of the random order, while the
    # trainer cut them from the length-grouped one.
    config = load_config(EXAMPLE, ("data.bucket_synchronized=true", "data.length_grouped=true"))
    lengths = [(37 * i) % 2048 + 1 for i in range(300)]
    shapes = ShapePolicy.from_config(config)
    ranks = config.deployment.world_size
    sampler = sampler_from_config(config, lengths, num_replicas=ranks, rank=0, shapes=shapes)
    plan = sampler.epoch_plan(0)
    accounted = plan_micro_batches(
        lengths,
        micro_batch_size=config.training.micro_batch_size,
        sampler=sampler_mode(config),
        seed=config.training.seed,
        num_replicas=ranks,
        pad_to=shapes.pad_to,
        mega_batch_multiplier=config.data.mega_batch_multiplier,
    )
    assert sorted(map(sorted, accounted)) == sorted(sorted(b) for rank in plan for b in rank if b)


def test_a_mode_change_is_refused_unless_the_field_that_selects_it_is_allowed() -> None:
    options = {**ANCHORS, "pad_to": POLICY}
    # Saved by the older version: anchor-grouped, with the length grouping it replaced.
    saved = older_state({"anchor_grouped": True, "length_grouped": True}, list(POLICY.pad_to))
    # With the counts the saved anchor-grouped plan can be rebuilt, so the resume is exact.
    length_grouped = {"mode": "length_grouped", "pad_to": POLICY, "anchor_counts": COUNTS}
    with pytest.raises(SamplerStateMismatch, match=r"--allow-changed") as refused:
        MicroBatchSampler(LENGTHS, **SIZES, **length_grouped).load_state_dict(saved)
    assert "data.anchor_grouped" in refused.value.fields
    # Turning anchor grouping off is the change the user made; allowing it is enough.
    resumed = MicroBatchSampler(LENGTHS, **SIZES, **length_grouped)
    resumed.load_state_dict(saved, allow_changed=["data.anchor_grouped"])
    assert "exact" in resumed.resume_note and "(0 repeated, 0 skipped)" in resumed.resume_note
    trained = [i for row in resumed.epoch_plan(resumed.epoch) for batch in row for i in batch]
    before = MicroBatchSampler(LENGTHS, **SIZES, **options).epoch_plan(1)
    consumed = [i for row in before for batch in row[:2] for i in batch]
    assert sorted(trained + consumed) == list(range(len(LENGTHS)))


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(SAMPLER_MODES),
    lengths=st.lists(st.integers(1, 1024), min_size=1, max_size=80),
    seed=st.integers(0, 2**31),
)
def test_every_mode_trains_every_sample_once(mode: str, lengths: list[int], seed: int) -> None:
    options: dict = {"mode": mode, "pad_to": POLICY, "seed": seed}
    if mode == "anchor_grouped":
        options["anchor_counts"] = [n % 23 for n in lengths]
    if mode == "packed":
        options["pad_to"] = ShapePolicy(pad_to=(256, 1024), packing=True)
    sampler = MicroBatchSampler(
        lengths, micro_batch_size=2, grad_accum_steps=2, num_replicas=2, **options
    )
    plan = sampler.epoch_plan(0)
    assert sorted(i for rank in plan for batch in rank for i in batch) == list(range(len(lengths)))
    assert len({len(rank) for rank in plan}) == 1


def test_an_unknown_mode_names_the_modes() -> None:
    with pytest.raises(ValueError, match="length_grouped_bucket_synchronized"):
        MicroBatchSampler([1], micro_batch_size=1, grad_accum_steps=1, mode="sorted")  # type: ignore[arg-type]


def test_packed_rows_that_pad_to_a_smaller_bucket_keep_their_older_plan() -> None:
    # Rows the policy pads below the capacity go last in their window: the digests of the plan
    # before that question went through ShapePolicy.pad_length, with and without buckets.
    lengths = [(53 * i) % 700 + 40 for i in range(120)]
    sizes = {"micro_batch_size": 2, "grad_accum_steps": 2, "num_replicas": 2, "seed": 3}

    def plans(pad_to: int | tuple[int, ...]) -> str:
        sampler = MicroBatchSampler(
            lengths,
            **sizes,
            mega_batch_multiplier=1,
            pad_to=ShapePolicy(pad_to=pad_to, packing=True),
        )
        return digest([sampler.epoch_plan(epoch) for epoch in (0, 1)])

    assert plans((256, 512, 1024)) == "1df92685a845673e"
    assert plans(1024) == "b99992bdfbc1b16e"


def test_turning_packing_on_resumes_the_unpacked_plans_untrained_samples() -> None:
    # The saved plan is rebuilt in its own mode, whatever the new shape policy packs.
    lengths = [(29 * i) % 500 + 10 for i in range(80)]
    sizes = {"micro_batch_size": 2, "grad_accum_steps": 1, "seed": 4}
    unpacked = MicroBatchSampler(lengths, **sizes, pad_to=1024)
    state = unpacked.state_dict(consumed=7)
    trained = {i for batch in unpacked.epoch_plan(0)[0][:7] for i in batch}
    packed = MicroBatchSampler(lengths, **sizes, pad_to=ShapePolicy(pad_to=1024, packing=True))
    packed.load_state_dict(state, allow_changed=["training.packing"])
    assert "(0 repeated, 0 skipped)" in packed.resume_note
    rest = [i for batch in packed for i in batch]
    assert sorted(rest) == sorted(set(range(len(lengths))) - trained)
