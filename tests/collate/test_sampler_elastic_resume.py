"""A resume that changes the rank count (or accumulation, micro-batch size, seed) trains every
sample of the epoch exactly once, for every plan: random, length-grouped, anchor-grouped,
bucket-synchronised and packed. The resumed epoch's plan is what the saved plan had left; a
second changed resume inside that epoch rebuilds the chain. With other data it cannot be exact,
and the note says so."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate.samplers import MicroBatchSampler

ALL_FIELDS = (
    "deployment.world_size",
    "training.grad_accum_steps",
    "training.micro_batch_size",
    "training.seed",
)

MODES = {
    "random": {},
    "length_grouped": {"mega_batch_multiplier": 3},
    "anchor_grouped": {"mega_batch_multiplier": 3},
    "bucket_synchronized": {"pad_to": (128, 256)},
    "length_grouped_bucket_synchronized": {"pad_to": (128, 256), "mega_batch_multiplier": 3},
    "packed": {"row_capacity": 256, "pad_to": 256, "mega_batch_multiplier": 2},
}


def samplers(lengths, counts, mode, *, ranks, accum, size, seed):
    options = {"mode": mode, **MODES[mode]}
    if mode == "anchor_grouped":
        options["anchor_counts"] = counts
    return [
        MicroBatchSampler(
            lengths,
            micro_batch_size=size,
            grad_accum_steps=accum,
            num_replicas=ranks,
            rank=rank,
            seed=seed,
            **options,
        )
        for rank in range(ranks)
    ]


def trained(plan, start: int, stop: int) -> list[int]:
    """Samples of micro-steps [start, stop) over every rank."""
    return [i for row in plan for batch in row[start:stop] for i in batch]


sizes = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    mode=st.sampled_from(sorted(MODES)),
    first=sizes,
    second=sizes,
    third=sizes,
    data=st.data(),
)
def test_every_sample_is_trained_once_per_epoch_across_changed_resumes(
    n, mode, first, second, third, data
):
    lengths = [data.draw(st.integers(1, 256)) for _ in range(n)]
    counts = [data.draw(st.integers(0, 20)) for _ in range(n)]
    seen: Counter[int] = Counter()
    state = None
    for sizes_now in (first, second, third):
        ranks, accum, size, seed = sizes_now
        group = samplers(lengths, counts, mode, ranks=ranks, accum=accum, size=size, seed=seed)
        if state is not None:
            if state["epoch"] > 0:
                break  # the epoch is done
            for sampler in group:
                sampler.load_state_dict(state, allow_changed=ALL_FIELDS)
            assert "0 repeated, 0 skipped" in group[0].resume_note or not group[0].resume_note
        plan = group[0].epoch_plan(0)
        assert all(s.epoch_plan(0) == plan for s in group)  # every rank computes the same plan
        windows = len(plan[0]) // accum
        start = group[0].position
        assert start % accum == 0
        stop = start + accum * data.draw(st.integers(0, max(0, windows - start // accum)))
        seen.update(trained(plan, start, stop))
        state = group[0].state_dict(consumed=stop)
    else:
        seen.update(trained(plan, stop, len(plan[0])))  # the last run trains the rest
    assert seen == Counter(range(n))


def test_a_resume_on_other_data_is_not_exact_and_says_so():
    lengths = [10] * 12
    saved = samplers(lengths, None, "random", ranks=1, accum=1, size=2, seed=0)[0]
    state = saved.state_dict(consumed=2)
    other = samplers(lengths + [10] * 4, None, "random", ranks=2, accum=1, size=2, seed=0)[0]
    other.load_state_dict(state, allow_changed=("data", "deployment.world_size"))
    assert "not exact (the data changed" in other.resume_note
