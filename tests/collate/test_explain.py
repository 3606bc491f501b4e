"""The explain-buckets report: policies side by side, per-bucket stats, warnings, suggestion."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdraft.collate import resolve_static_length, suggest_buckets
from specdraft.collate.explain import build_report
from specdraft.collate.explain_text import render_text
from specdraft.collate.histogram import render_histogram, save_plot
from specdraft.collate.length_source import LengthSource, read_lengths_file
from specdraft.config import ShapePolicy, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
# One sample per micro-batch: the cost of every policy can be written down without the sampler.
SINGLE = ("training.micro_batch_size=1",)


def report_for(lengths: list[int], *overrides: str, suggest_k: int | None = None) -> dict:
    config = load_config(EXAMPLE, [*SINGLE, *overrides])
    source = LengthSource("lengths_file", "lengths.txt", lengths)
    return build_report(
        config,
        source,
        shapes=ShapePolicy.from_config(config),
        config_path=str(EXAMPLE),
        suggest_k=suggest_k,
    )


def policy(report: dict, name: str) -> dict:
    return next(p for p in report["policies"] if p["name"] == name)


def spread(n: int) -> list[int]:
    """n lengths spread over 1..2048 (a deterministic sawtooth)."""
    return [1 + (i * 997) % 2048 for i in range(n)]


def test_three_policies_side_by_side() -> None:
    lengths = spread(200)
    report = report_for(lengths, "training.static_shape_buckets=[512, 1024, 1536]")
    buckets = (512, 1024, 1536, 2048)
    expected = {
        "pad-to-longest": sum(lengths),
        "static_shapes": len(lengths) * 2048,
        "buckets": sum(resolve_static_length(n, buckets) for n in lengths),
    }
    assert [p["name"] for p in report["policies"]] == list(expected)
    for name, positions in expected.items():
        p = policy(report, name)
        assert p["computed_positions"] == positions
        assert p["positions_per_real_token"] == pytest.approx(positions / sum(lengths))
        assert p["ratio_to_longest"] == pytest.approx(positions / sum(lengths))
    assert [p["configured"] for p in report["policies"]] == [False, False, True]
    num_anchors = load_config(EXAMPLE).training.num_anchors
    assert report["pad_policy"] == {
        "kind": "buckets",
        "pad_to": list(buckets),
        "description": "buckets 512, 1024, 1536, 2048",
        "max_length_appended": True,
        # The second dimension: no anchor buckets, so every length computes num_anchors blocks.
        "anchors": f"fixed {num_anchors} anchors",
        "anchor_widths": [num_anchors],
        "num_anchors_appended": False,
        "grid": [[length, num_anchors] for length in buckets],
    }


def test_per_bucket_table_counts_every_micro_batch() -> None:
    lengths = spread(300)
    report = report_for(lengths)
    rows = report["buckets"]
    assert [r["length"] for r in rows] == [512, 1024, 1536, 2048]
    for row in rows:
        members = [
            n for n in lengths if resolve_static_length(n, (512, 1024, 1536, 2048)) == row["length"]
        ]
        assert row["micro_batches"] == len(members)
        assert row["mean_real_tokens"] == pytest.approx(sum(members) / len(members))
        assert row["padding_share"] == pytest.approx(
            1 - sum(members) / (len(members) * row["length"])
        )


def test_unused_and_rare_buckets_are_warned_about() -> None:
    # 100 samples: none fits 512, exactly one (1%) pads to 1024.
    lengths = [1000] + [2000] * 99
    report = report_for(lengths)
    codes = {(w["code"], w["message"].split(":")[0]) for w in report["warnings"]}
    assert ("unused-bucket", "bucket 512 is used by no micro-batch") in codes
    assert any(code == "rare-bucket" and "bucket 1024" in text for code, text in codes)
    assert not any("bucket 2048" in text for _, text in codes)


def test_buckets_far_from_the_optimum_are_warned_about_and_good_ones_are_not() -> None:
    lengths = [100] * 50 + [700] * 50 + [1900] * 50
    bad = report_for(lengths, "training.static_shape_buckets=[1024, 1536, 1792]")
    assert any(w["code"] == "worse-than-suggestion" for w in bad["warnings"])
    good = report_for(lengths, "training.static_shape_buckets=[128, 768, 1920]")
    assert not any(w["code"] == "worse-than-suggestion" for w in good["warnings"])


def test_suggestion_is_the_optimal_k_buckets_with_its_ratios() -> None:
    lengths = spread(150)
    report = report_for(lengths, suggest_k=3)
    expected = suggest_buckets(lengths, micro_batch_size=1, max_length=2048, k=3, seed=42)
    suggestion = report["suggestion"]
    assert suggestion["buckets"] == list(expected)
    positions = sum(resolve_static_length(n, expected) for n in lengths)
    assert suggestion["computed_positions"] == positions
    assert suggestion["ratio_to_longest"] == pytest.approx(positions / sum(lengths))
    configured = policy(report, "buckets")["computed_positions"]
    assert suggestion["ratio_to_configured"] == pytest.approx(positions / configured)


def test_compile_plan_only_when_blocks_are_compiled() -> None:
    on = report_for([10, 20])["compile_plan"]
    assert on["graphs_per_block"] == 2 * 4
    assert on["recompile_limit"] == 2 * 4 + 4
    assert report_for([10, 20], "training.compile_blocks=false")["compile_plan"] is None


def test_histogram_counts_every_sample_and_marks_every_edge() -> None:
    lengths = spread(123)
    report = report_for(lengths, suggest_k=2)
    histogram = report["histogram"]
    assert sum(b["count"] for b in histogram["bins"]) == len(lengths)
    ends = {b["end"] for b in histogram["bins"]}
    assert set(histogram["edges"]) <= ends
    assert set(histogram["suggested_edges"]) <= ends
    assert len(histogram["bins"]) <= 32
    for b in histogram["bins"]:
        assert b["count"] == sum(b["start"] <= n <= b["end"] for n in lengths)


def test_long_max_length_keeps_the_histogram_short_and_every_edge_marked() -> None:
    lengths = [1 + (i * 4099) % 8192 for i in range(300)]
    report = report_for(lengths, "data.max_length=8192", "training.static_shape_buckets=[1408]")
    histogram = report["histogram"]
    assert len(histogram["bins"]) <= 32
    assert sum(b["count"] for b in histogram["bins"]) == len(lengths)
    text = "\n".join(render_histogram(histogram))
    for edge in (1408, 8192):
        assert f"--- bucket {edge}" in text


def test_text_report_shows_the_policies_warnings_and_suggestion() -> None:
    text = render_text(report_for([1000] + [2000] * 99, suggest_k=2))
    for needle in (
        "pad-to-longest",
        "static_shapes",
        "buckets (configured)",
        "compile plan",
        "[unused-bucket]",
        "suggested buckets (k=2",
        "--- bucket 1024",
    ):
        assert needle in text


def test_longest_explains_one_micro_batch() -> None:
    config = load_config(EXAMPLE)
    report = build_report(
        config,
        LengthSource("longest", "--longest 600", [600]),
        shapes=ShapePolicy.from_config(config),
    )
    assert report["longest"] == {"longest": 600, "pads_to": 1024}
    assert [p["pads_to"] for p in report["policies"]] == [600, 2048, 1024]
    assert report["histogram"] is None and report["warnings"] == []


def test_lengths_file_reads_one_count_per_line_and_truncates(tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("# corpus\n12\n\n3000  # too long\n7\n")
    source = read_lengths_file(path, 2048)
    assert source.lengths == [12, 2048, 7]
    assert source.truncated == 1


@pytest.mark.parametrize("content", ["12\nabc\n", "12\n0\n", "12\n-4\n"])
def test_bad_lengths_file_names_the_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"{path}:2: .* is not a positive integer"):
        read_lengths_file(path, 2048)


def test_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the [plot] extra
    out = tmp_path / "lengths.png"
    save_plot(report_for(spread(50), suggest_k=2), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_sampler_mode_of_the_config_is_named_in_the_text() -> None:
    # Both grouping options on: the text used to have no words for the length-grouped bucket
    # rows and failed with a KeyError.
    lengths = spread(200)
    both = ("data.bucket_synchronized=true", "data.length_grouped=true")
    text = render_text(report_for(lengths, *both))
    assert "bucket-synchronised ranks, rows cut from the length-grouped order" in text
    assert "bucket-synchronised ranks (seed" in render_text(
        report_for(lengths, "data.bucket_synchronized=true")
    )
