"""What sliding-window layers save: the visible-key counts follow the draft mask's rule (brute
force), and explain-buckets shows them per bucket only when a layer slides."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from specdraft.collate.explain import build_report
from specdraft.collate.explain_text import render_text
from specdraft.collate.length_source import LengthSource
from specdraft.collate.window_savings import bucket_attention, mean_visible_context
from specdraft.config import ShapePolicy, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"


def brute_mean(n: int, block: int, window: int | None) -> float:
    """The mask rule, one key at a time: query p = a + k sees context j < a with p - j < window."""
    seen = 0
    for a in range(n):
        for k in range(block):
            seen += sum(1 for j in range(a) if window is None or (a + k) - j < window)
    return seen / (n * block)


@given(
    n=st.integers(1, 60),
    block=st.integers(1, 8),
    extra=st.integers(0, 70),
    full=st.booleans(),
)
def test_the_mean_visible_keys_follow_the_mask_rule(n, block, extra, full):
    window = None if full else block + extra  # the config requires window >= block_size
    assert abs(mean_visible_context(n, block, window) - brute_mean(n, block, window)) < 1e-9


def test_a_window_saves_nothing_below_it_and_more_the_longer_the_sample():
    buckets = bucket_attention(
        [100, 500, 900, 2000, 4000], [512, 1024, 4096], windows=[512], block_size=16,
        num_queries=64,
    )  # fmt: skip
    by_length = {b.length: b for b in buckets}
    assert [b.samples for b in buckets] == [2, 1, 2]
    assert by_length[512].saved_share < 0.01  # samples shorter than the window
    assert 0 < by_length[1024].saved_share < by_length[4096].saved_share < 1
    # Dense SDPA scores the whole padded row whatever the window.
    assert by_length[4096].dense_keys == 4096 + 64


def report(lengths: list[int], *overrides: str) -> dict:
    config = load_config(EXAMPLE, ["training.micro_batch_size=1", *overrides])
    source = LengthSource("lengths_file", "lengths.txt", lengths)
    return build_report(config, source, shapes=ShapePolicy.from_config(config))


def test_explain_buckets_shows_the_saving_only_when_a_layer_slides():
    lengths = [1 + (i * 997) % 2048 for i in range(300)]
    plain = report(lengths, "training.static_shape_buckets=[512, 1024]")
    assert plain["attention"] is None
    assert "attention per draft query" not in render_text(plain)
    slid = report(lengths, "training.static_shape_buckets=[512, 1024]", "model.sliding_window=512")
    attention = slid["attention"]
    assert [b["length"] for b in attention["buckets"]] == [512, 1024, 2048]
    assert sum(b["samples"] for b in attention["buckets"]) == len(lengths)
    assert 0 < attention["saved_share"] < 1
    text = render_text(slid)
    assert "attention per draft query" in text and "save neither time nor memory" in text
    # A full layer beside a sliding one saves half as much per query as two sliding ones.
    layers = 3
    mixed = ["sliding_attention"] + ["full_attention"] * (layers - 1)
    shape = (f"model.num_draft_layers={layers}", "model.sliding_window=512")
    one = report(lengths, *shape, f"model.layer_types={mixed!r}")
    every = report(lengths, *shape)
    for b_one, b_all in zip(
        one["attention"]["buckets"], every["attention"]["buckets"], strict=True
    ):
        removed_one = b_one["full_keys_per_query"] - b_one["windowed_keys_per_query"]
        removed_all = b_all["full_keys_per_query"] - b_all["windowed_keys_per_query"]
        assert abs(removed_one * layers - removed_all) < 1e-6
