"""explain-buckets with data.anchor_grouped: the configured plan is the anchor-grouped one, the
other order is shown next to it, and a run that would gain from grouping is told so."""

from __future__ import annotations

from pathlib import Path

from specdraft.collate import MicroBatchSampler
from specdraft.collate.explain import build_report
from specdraft.collate.explain_text import render_text
from specdraft.collate.length_source import LengthSource
from specdraft.config import ShapePolicy, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
# Two samples per micro-batch, one length, anchor buckets 64 / 256 / 512 (num_anchors).
BASE = (
    "training.micro_batch_size=2",
    "training.static_shape_buckets=[]",
    "training.static_anchor_buckets=[64,256]",
)
N = 400
LENGTHS = [2048] * N
# Every other sample is barely supervised: random pairs mostly need the wide bucket.
COUNTS = [40 if i % 2 else 900 for i in range(N)]


def report_for(*overrides: str, counts: list[int] | None = COUNTS) -> tuple[dict, object]:
    config = load_config(EXAMPLE, [*BASE, *overrides])
    source = LengthSource("corpus", "corpus", LENGTHS, anchor_counts=counts)
    shapes = ShapePolicy.from_config(config)
    return build_report(config, source, shapes=shapes), config


def blocks(config, grouped: bool) -> int:
    """Anchor blocks of one epoch of the run's own sampler, counted by hand."""
    sampler = MicroBatchSampler(
        LENGTHS,
        micro_batch_size=2,
        grad_accum_steps=config.training.grad_accum_steps,
        seed=config.training.seed,
        pad_to=ShapePolicy.from_config(config),
        mega_batch_multiplier=config.data.mega_batch_multiplier,
        mode="anchor_grouped" if grouped else "random",
        anchor_counts=COUNTS if grouped else None,
    )
    total = 0
    for batch in (b for rank in sampler.epoch_plan(0) for b in rank if b):
        need = max(min(512, COUNTS[i]) for i in batch)
        total += len(batch) * (64 if need <= 64 else 256 if need <= 256 else 512)
    return total


def test_the_configured_plan_is_anchor_grouped_and_the_random_order_is_shown() -> None:
    report, config = report_for("data.anchor_grouped=true")
    assert report["sampler"] == "anchor_grouped"
    anchors = report["anchors"]
    assert anchors["anchor_grouped"] is True
    policies = {p["name"]: p for p in anchors["policies"]}
    assert policies["anchor buckets"]["configured"]
    assert policies["anchor buckets"]["computed_blocks"] == blocks(config, grouped=True)
    other = policies["anchor buckets (not anchor-grouped)"]
    assert other["computed_blocks"] == blocks(config, grouped=False)
    assert policies["anchor buckets"]["computed_blocks"] < other["computed_blocks"]
    # The fixed width does not depend on the order, so it is not repeated.
    assert "static (num_anchors) (not anchor-grouped)" not in policies
    assert not [w for w in report["warnings"] if w["code"] == "anchor-grouping"]
    text = render_text(report)
    assert "anchor-grouped order (by shape bucket, then anchor count)" in text
    assert "anchor buckets (not anchor-grouped)" in text


def test_a_run_that_would_gain_from_grouping_is_told_by_how_much() -> None:
    report, config = report_for()
    assert report["sampler"] == "random"
    policies = {p["name"]: p for p in report["anchors"]["policies"]}
    mine = policies["anchor buckets"]["computed_blocks"]
    grouped = policies["anchor buckets + anchor_grouped"]["computed_blocks"]
    assert (mine, grouped) == (blocks(config, grouped=False), blocks(config, grouped=True))
    hint = [w for w in report["warnings"] if w["code"] == "anchor-grouping"]
    assert len(hint) == 1
    assert f"{1 - grouped / mine:.1%} fewer anchor blocks" in hint[0]["message"]
    assert "data.anchor_grouped = true" in hint[0]["message"]


def test_without_loss_masks_the_grouping_is_named_and_the_base_order_counted() -> None:
    report, _ = report_for("data.anchor_grouped=true", counts=None)
    assert report["sampler"] == "random"
    assert report["anchors"] is None
    [warning] = [w for w in report["warnings"] if w["code"] == "anchor-grouping-unknown"]
    assert "needs the loss masks" in warning["message"]
