"""Pad lengths: which length a micro-batch pads to, and the run's pad policy from the config."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.collate import resolve_static_length, static_pad_length
from specdraft.config import ShapePolicy, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
BUCKETS = (512, 1024, 1536, 2048)


@pytest.mark.parametrize(
    ("longest", "expected"),
    [(1, 512), (511, 512), (512, 512), (513, 1024), (1024, 1024), (1025, 1536), (2048, 2048)],
)
def test_buckets_pick_the_smallest_that_fits_at_every_edge(longest: int, expected: int) -> None:
    assert resolve_static_length(longest, BUCKETS) == expected


def test_above_the_last_bucket_names_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"2049 tokens.*largest shape bucket 2048"):
        resolve_static_length(2049, BUCKETS)


def test_fixed_length_fits_up_to_itself_and_not_beyond() -> None:
    assert resolve_static_length(2048, 2048) == 2048
    assert resolve_static_length(7, 2048) == 2048
    with pytest.raises(ValueError, match=r"2049 tokens.*static length 2048"):
        resolve_static_length(2049, 2048)


def test_none_pads_to_the_longest_sample() -> None:
    assert resolve_static_length(777, None) == 777


@pytest.mark.parametrize("bad", [(), (1024, 512), (512, 512), (0, 512), -5])
def test_malformed_pad_policies_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        resolve_static_length(100, bad)  # type: ignore[arg-type]


@given(
    st.lists(st.integers(1, 64), min_size=1, max_size=6, unique=True).map(
        lambda cells: tuple(sorted(c * 128 for c in cells))
    ),
    st.integers(0, 64 * 128),
)
def test_resolution_is_the_smallest_bucket_not_below_longest(
    buckets: tuple[int, ...], longest: int
) -> None:
    fitting = [b for b in buckets if b >= longest]
    if not fitting:
        with pytest.raises(ValueError, match=str(buckets[-1])):
            resolve_static_length(longest, buckets)
    else:
        assert resolve_static_length(longest, buckets) == min(fitting)


def test_static_pad_length_forms() -> None:
    assert static_pad_length(False, 2048, None) is None
    assert static_pad_length(True, 2048, None) == 2048
    assert static_pad_length(True, 2048, []) == 2048
    assert static_pad_length(True, 2048, [512, 1024]) == (512, 1024, 2048)
    assert static_pad_length(True, 2048, [512, 2048]) == (512, 2048)


def test_static_pad_length_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="static_shapes"):
        static_pad_length(False, 2048, [512])
    with pytest.raises(ValueError, match=r"\[4096\].*max_length = 2048"):
        static_pad_length(True, 2048, [512, 4096])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), BUCKETS),
        (("training.static_shape_buckets=[512, 1024]",), (512, 1024, 2048)),
        (("training.static_shape_buckets=[]",), 2048),
        (
            (
                "training.static_shapes=false",
                "training.static_shape_buckets=[]",
                "training.compile_blocks=false",
            ),
            None,
        ),
    ],
)
def test_shape_policy_from_config_matches_static_pad_length(
    overrides: tuple[str, ...], expected: object
) -> None:
    config = load_config(EXAMPLE, overrides)
    policy = ShapePolicy.from_config(config).pad_to
    assert policy == expected
    assert policy == static_pad_length(
        config.training.static_shapes,
        config.data.max_length,
        config.training.static_shape_buckets,
    )
