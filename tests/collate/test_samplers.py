"""Micro-batch plans: exactly once per epoch, identical on every rank, bucket-synchronised steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import MicroBatchSampler, resolve_static_length
from specdraft.collate.samplers import SamplerStateMismatch

BUCKETS = (128, 256, 512, 1024)
MODES = {
    "random": {},
    "length_grouped": {"mode": "length_grouped", "mega_batch_multiplier": 3},
    "bucket_synchronized": {"mode": "bucket_synchronized", "pad_to": BUCKETS},
    "both": {"mode": "length_grouped_bucket_synchronized", "pad_to": BUCKETS},
}

sizes = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(1, 1024), min_size=0, max_size=120),
        "micro_batch_size": st.integers(1, 4),
        "grad_accum_steps": st.integers(1, 4),
        "num_replicas": st.integers(1, 5),
        "seed": st.integers(0, 2**31),
        "epoch": st.integers(0, 3),
    }
)


def make(case: dict, mode: str, rank: int = 0) -> MicroBatchSampler:
    return MicroBatchSampler(
        case["lengths"],
        micro_batch_size=case["micro_batch_size"],
        grad_accum_steps=case["grad_accum_steps"],
        num_replicas=case["num_replicas"],
        rank=rank,
        seed=case["seed"],
        **MODES[mode],
    )


@pytest.mark.parametrize("mode", list(MODES))
@settings(max_examples=60, deadline=None)
@given(case=sizes)
def test_every_sample_once_per_epoch_and_equal_counts(mode: str, case: dict) -> None:
    sampler = make(case, mode)
    plan = sampler.epoch_plan(case["epoch"])
    seen = sorted(i for rank in plan for batch in rank for i in batch)
    assert seen == list(range(len(case["lengths"])))
    assert len(plan) == case["num_replicas"]
    counts = {len(rank) for rank in plan}
    assert len(counts) == 1, "ranks must run the same number of micro-batches"
    assert counts.pop() % case["grad_accum_steps"] == 0
    assert all(len(batch) <= case["micro_batch_size"] for rank in plan for batch in rank)


@pytest.mark.parametrize("mode", list(MODES))
@settings(max_examples=30, deadline=None)
@given(case=sizes)
def test_plan_is_identical_whichever_rank_computes_it(mode: str, case: dict) -> None:
    plans = [
        make(case, mode, rank).epoch_plan(case["epoch"]) for rank in range(case["num_replicas"])
    ]
    assert all(plan == plans[0] for plan in plans)
    for rank in range(case["num_replicas"]):
        sampler = make(case, mode, rank)
        sampler.set_epoch(case["epoch"])
        assert list(sampler) == plans[0][rank]
        assert len(sampler) == len(plans[0][rank])


@pytest.mark.parametrize("mode", ["bucket_synchronized", "both"])
@settings(max_examples=80, deadline=None)
@given(case=sizes)
def test_every_micro_step_resolves_to_one_bucket_on_all_ranks(mode: str, case: dict) -> None:
    plan = make(case, mode).epoch_plan(case["epoch"])
    lengths = case["lengths"]
    for step in range(len(plan[0])):
        buckets = {
            resolve_static_length(max(lengths[i] for i in rank[step]), BUCKETS)
            for rank in plan
            if rank[step]
        }
        assert len(buckets) <= 1, f"micro-step {step} mixes buckets {sorted(buckets)}"


@pytest.mark.parametrize("mode", ["random", "length_grouped"])
@settings(max_examples=40, deadline=None)
@given(case=sizes)
def test_only_the_unavoidable_empty_micro_batches(mode: str, case: dict) -> None:
    plan = make(case, mode).epoch_plan(case["epoch"])
    n, size = len(case["lengths"]), case["micro_batch_size"]
    window = case["num_replicas"] * case["grad_accum_steps"]
    needed = -(-n // size)  # micro-batches of at most `size` samples
    empties = sum(1 for rank in plan for batch in rank if not batch)
    assert empties == -(-needed // window) * window - needed
    # All but the last non-empty micro-batch are full.
    partial = [b for rank in plan for b in rank if 0 < len(b) < size]
    assert len(partial) <= 1


@settings(max_examples=30, deadline=None)
@given(case=sizes)
def test_bucket_synchronized_length_does_not_change_between_epochs(case: dict) -> None:
    sampler = make(case, "bucket_synchronized")
    assert len({len(sampler.epoch_plan(epoch)[0]) for epoch in range(4)}) == 1


def test_epochs_and_seeds_change_the_order() -> None:
    case = {"micro_batch_size": 2, "grad_accum_steps": 1, "num_replicas": 1}
    lengths = list(range(1, 201))
    base = MicroBatchSampler(lengths, seed=1, **case)
    assert base.epoch_plan(0) != base.epoch_plan(1)
    assert base.epoch_plan(0) != MicroBatchSampler(lengths, seed=2, **case).epoch_plan(0)
    assert base.epoch_plan(0) == MicroBatchSampler(lengths, seed=1, **case).epoch_plan(0)


def test_length_grouping_sorts_inside_mega_batches_only() -> None:
    lengths = [((i * 37) % 101) + 1 for i in range(60)]
    sampler = MicroBatchSampler(
        lengths,
        micro_batch_size=2,
        grad_accum_steps=1,
        mode="length_grouped",
        mega_batch_multiplier=5,
    )
    order = [i for batch in sampler.epoch_plan(0)[0] for i in batch]
    megas = [order[i : i + 10] for i in range(0, 60, 10)]
    for mega in megas:
        assert [lengths[i] for i in mega] == sorted((lengths[i] for i in mega), reverse=True)
    # The mega-batches themselves are shuffled, not one global sort.
    assert [lengths[i] for i in order] != sorted(lengths, reverse=True)


def test_ranks_of_one_micro_step_get_neighbouring_length_grouped_batches() -> None:
    lengths = list(range(1, 401))
    plans = MicroBatchSampler(
        lengths,
        micro_batch_size=2,
        grad_accum_steps=2,
        num_replicas=4,
        mode="length_grouped",
        mega_batch_multiplier=200,  # one mega-batch: the whole epoch sorted
    ).epoch_plan(0)
    for step in range(len(plans[0])):
        longest = [max(lengths[i] for i in rank[step]) for rank in plans]
        assert max(longest) - min(longest) <= 7  # 8 consecutive lengths over 4 ranks


def test_resume_continues_exactly_where_it_stopped() -> None:
    args = {"micro_batch_size": 2, "grad_accum_steps": 2, "num_replicas": 2, "rank": 1, "seed": 3}
    lengths = [50 + i for i in range(40)]
    first = MicroBatchSampler(lengths, **args)
    first.set_epoch(1)
    iterator = iter(first)
    taken = [next(iterator) for _ in range(3)]
    state = first.state_dict()

    resumed = MicroBatchSampler(lengths, **args)
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    assert taken + list(resumed) == first.epoch_plan(1)[1]


def test_state_after_a_finished_epoch_points_at_the_next_one() -> None:
    sampler = MicroBatchSampler(list(range(1, 11)), micro_batch_size=2, grad_accum_steps=1)
    list(sampler)
    assert sampler.state_dict()["epoch"] == 1
    assert sampler.state_dict()["position"] == 0
    assert sampler.state_dict(consumed=2)["position"] == 2


def test_resume_with_other_sizes_is_refused() -> None:
    lengths = list(range(1, 21))
    state = MicroBatchSampler(lengths, micro_batch_size=2, grad_accum_steps=1).state_dict()
    other = MicroBatchSampler(lengths, micro_batch_size=4, grad_accum_steps=1)
    with pytest.raises(ValueError, match="micro_batch_size: checkpoint 2, now 4"):
        other.load_state_dict(state)


def test_a_refused_resume_names_the_config_field_and_the_override() -> None:
    lengths = list(range(100, 140))
    args = {"micro_batch_size": 2, "grad_accum_steps": 1, "mode": "bucket_synchronized"}
    state = MicroBatchSampler(lengths, pad_to=(128, 256), **args).state_dict()
    other = MicroBatchSampler(lengths, pad_to=(256,), **args)
    with pytest.raises(SamplerStateMismatch) as caught:
        other.load_state_dict(state)
    assert caught.value.fields == ["training.static_shape_buckets"]
    assert "training.static_shape_buckets: checkpoint [128, 256], now [256]" in str(caught.value)
    assert "--allow-changed training.static_shape_buckets" in str(caught.value)


def test_an_allowed_change_continues_after_the_samples_consumed() -> None:
    lengths = list(range(1, 41))
    first = MicroBatchSampler(lengths, micro_batch_size=2, grad_accum_steps=1, num_replicas=2)
    state = first.state_dict(consumed=5)  # 5 micro-batches of 2 on each of 2 ranks: 20 samples
    resumed = MicroBatchSampler(lengths, micro_batch_size=4, grad_accum_steps=2, seed=1)
    resumed.load_state_dict(
        state,
        allow_changed=[
            "training.micro_batch_size",
            "training.grad_accum_steps",
            "deployment.world_size",
            "training.seed",
        ],
    )
    # The resumed epoch is exactly the 20 samples the saved plan had not trained.
    plan = first.epoch_plan(0)
    trained = {i for row in plan for batch in row[:5] for i in batch}
    assert (resumed.epoch, resumed.position) == (0, 0)
    rest = [i for batch in resumed for i in batch]
    assert sorted(rest) == sorted(set(range(40)) - trained) and len(rest) == 20
    assert "exact" in resumed.resume_note and "(0 repeated, 0 skipped)" in resumed.resume_note


def test_bucket_synchronization_needs_buckets_that_fit() -> None:
    with pytest.raises(ValueError, match="tuple of shape buckets"):
        MicroBatchSampler([5], micro_batch_size=1, grad_accum_steps=1, mode="bucket_synchronized")
    with pytest.raises(ValueError, match=r"2000 tokens.*1024"):
        MicroBatchSampler(
            [5, 2000],
            micro_batch_size=1,
            grad_accum_steps=1,
            mode="bucket_synchronized",
            pad_to=BUCKETS,
        )


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"rank 2 is outside 0\.\.1"):
        MicroBatchSampler([1], micro_batch_size=1, grad_accum_steps=1, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="micro_batch_size = 0"):
        MicroBatchSampler([1], micro_batch_size=0, grad_accum_steps=1)


def test_sampler_from_config_follows_the_run_config() -> None:
    from pathlib import Path

    from specdraft.collate import sampler_from_config
    from specdraft.config import ShapePolicy, load_config

    example = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
    config = load_config(
        example,
        ("data.bucket_synchronized=true", "training.micro_batch_size=3", "training.seed=7"),
    )
    lengths = [(37 * i) % 2048 + 1 for i in range(200)]
    shapes = ShapePolicy.from_config(config)
    samplers = [
        sampler_from_config(config, lengths, num_replicas=2, rank=r, shapes=shapes)
        for r in range(2)
    ]
    plans = [list(s) for s in samplers]
    assert sorted(i for plan in plans for batch in plan for i in batch) == list(range(200))
    assert max(len(batch) for plan in plans for batch in plan) == 3
    assert len(plans[0]) % config.training.grad_accum_steps == 0
    # Bucket-synchronised with the config's buckets: both ranks pad to one bucket per micro-step.
    for a, b in zip(*plans, strict=True):
        if a and b:
            pad = [
                resolve_static_length(max(lengths[i] for i in x), (512, 1024, 1536, 2048))
                for x in (a, b)
            ]
            assert pad[0] == pad[1]
    reseeded = load_config(
        example, ("data.bucket_synchronized=true", "training.micro_batch_size=3")
    )
    resampled = sampler_from_config(
        reseeded, lengths, num_replicas=2, rank=0, shapes=ShapePolicy.from_config(reseeded)
    )
    assert list(resampled) != plans[0]
