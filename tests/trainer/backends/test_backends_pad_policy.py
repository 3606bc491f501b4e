"""The run's shape policy reaches every loader: the batch builder behind both train sources (local
and disaggregated windows), the warm-up (one batch per length x anchor-width cell), the anchor
width each micro-batch computes, evaluation and prepare-features.

End to end, tests/integration/test_distributed_equivalence.py checks the padded lengths of real
training steps, test_distributed_compile.py that evaluation never recompiles a warmed graph, and
test_disaggregated_managed.py that the window source pads like the local one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from specdraft.collate import ANCHOR_WIDTH
from specdraft.config import ShapePolicy, validate_config
from specdraft.trainer.runtime import DistContext
from specdraft.trainer.train.evaluation import EvalRecord, evaluate_acceptance
from specdraft.trainer.train.sources import BatchBuilder, BatchShape

WIDTH, HIDDEN, MICRO = 6, 2, 3
NUM_ANCHORS = 64

POLICIES = {
    "pad to longest": {"static_shapes": False},
    "fixed length": {"static_shapes": True},
    "buckets": {"static_shapes": True, "static_shape_buckets": [128, 256]},
    "buckets + anchor buckets": {
        "static_shapes": True,
        "static_shape_buckets": [128, 256],
        "static_anchor_buckets": [8, 32],
    },
}


def config(policy: str):
    return validate_config(
        {
            "model": {
                "target": "/nonexistent/target",
                "algorithm": "dspark",
                "target_layer_ids": [0, 1, 2],
                "mask_token_id": 100,
            },
            "data": {"train_paths": ["t.jsonl"], "max_length": 384},
            "training": {
                "micro_batch_size": MICRO,
                "num_anchors": NUM_ANCHORS,
                **POLICIES[policy],
            },
        }
    )


def static_lengths(pad_to) -> list[int]:
    """Every length a policy pads to (none for pad-to-longest)."""
    if pad_to is None:
        return []
    return [pad_to] if isinstance(pad_to, int) else list(pad_to)


def expected_length(pad_to, longest: int) -> int:
    """The length a batch whose longest sample has `longest` tokens must pad to."""
    if pad_to is None:
        return longest
    return min(n for n in static_lengths(pad_to) if n >= longest)


def builder(shapes: ShapePolicy) -> BatchBuilder:
    shape = BatchShape(
        micro_batch_size=MICRO,
        feature_width=WIDTH,
        hidden_size=HIDDEN,
        with_last_hidden=True,
        feature_dtype=torch.float32,
        static=shapes.static,
    )
    return BatchBuilder(shapes=shapes, shape=shape)


def row(length: int, sample_id: int, supervised: int | None = None) -> dict:
    """A sample of `length` tokens whose last `supervised` tokens carry loss (all by default)."""
    supervised = length if supervised is None else supervised
    loss_mask = torch.zeros(length, dtype=torch.long)
    loss_mask[length - supervised :] = 1
    return {
        "input_ids": torch.arange(1, length + 1),
        "loss_mask": loss_mask,
        "hidden_states": torch.ones(length, WIDTH),
        "target_last_hidden_states": torch.ones(length, HIDDEN),
        "sample_id": torch.tensor(sample_id),
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_the_warm_up_builds_one_full_batch_per_grid_cell(policy):
    shapes = ShapePolicy.from_config(config(policy))
    batches = builder(shapes).warmup_batches()
    cells = [(b["input_ids"].shape[1], b[ANCHOR_WIDTH]) for b in batches]
    widths = POLICIES[policy].get("static_anchor_buckets", [])
    expected = [
        (length, width)
        for length in static_lengths(shapes.pad_to)
        for width in [*widths, NUM_ANCHORS]
    ]
    assert cells == expected == list(shapes.grid)
    for batch in batches:
        assert batch["input_ids"].shape[0] == MICRO
        assert batch["hidden_states"].shape[2] == WIDTH
        assert not batch["loss_mask"].any()  # no loss weight: warming up trains nothing


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("lengths", [[40], [40, 130], [300, 20]])
def test_train_batches_pad_to_the_policy_and_static_rows_are_inert(policy, lengths):
    shapes = ShapePolicy.from_config(config(policy))
    pad_to = shapes.pad_to
    batch = builder(shapes).collate_rows([row(n, i) for i, n in enumerate(lengths)])
    assert batch["input_ids"].shape[1] == expected_length(pad_to, max(lengths))
    assert batch["num_real"] == len(lengths)
    if pad_to is not None:
        # Static shapes fix the batch dimension too, with zero-weight rows.
        assert batch["input_ids"].shape[0] == MICRO
        assert not batch["loss_mask"][len(lengths) :].any()
    assert batch["loss_mask"].sum() == sum(lengths)


@pytest.mark.parametrize("policy", ["fixed length", "buckets"])
def test_an_empty_micro_batch_is_a_dummy_at_the_smallest_length(policy):
    shapes = ShapePolicy.from_config(config(policy))
    pad_to = shapes.pad_to
    batch = builder(shapes).empty()
    assert batch["input_ids"].shape == (MICRO, min(static_lengths(pad_to)))
    assert batch["num_real"] == 0 and not batch["loss_mask"].any()
    # No anchor at all: the smallest static width.
    assert batch[ANCHOR_WIDTH] == shapes.anchor_widths[0]


@pytest.mark.parametrize(
    ("policy", "supervised", "width"),
    [
        # Pad-to-longest computes exactly the largest per-sample count: 9 supervised -> 8.
        ("pad to longest", [9, 3], 8),
        ("pad to longest", [0, 0], 1),  # nothing to learn: one masked block, never zero
        ("pad to longest", [100, 5], NUM_ANCHORS),  # capped at num_anchors
        # Static without anchor buckets keeps num_anchors.
        ("buckets", [9, 3], NUM_ANCHORS),
        # Anchor buckets [8, 32, 64]: the smallest that holds the fullest sample.
        ("buckets + anchor buckets", [9, 3], 8),
        ("buckets + anchor buckets", [10, 3], 32),
        ("buckets + anchor buckets", [34, 3], 64),
        ("buckets + anchor buckets", [0, 0], 8),
    ],
)
def test_the_anchor_width_is_chosen_on_the_host_from_the_loss_masks(policy, supervised, width):
    shapes = ShapePolicy.from_config(config(policy))
    rows = [row(120, i, supervised=s) for i, s in enumerate(supervised)]
    batch = builder(shapes).collate_rows(rows)
    assert batch[ANCHOR_WIDTH] == width
    assert isinstance(batch[ANCHOR_WIDTH], int)  # a host value: no device sync to read it
    assert builder(shapes).to_device(batch)[ANCHOR_WIDTH] == width


@pytest.mark.parametrize("policy", POLICIES)
def test_evaluation_pads_each_record_with_the_policy(policy):
    shapes = ShapePolicy.from_config(config(policy))
    pad_to = shapes.pad_to
    seen = []

    def predict(ids, feats, anchors, keep):
        seen.append((ids.shape[1], feats.shape[1]))
        return torch.zeros(1, anchors.shape[1], 3, dtype=torch.long)

    totals = [50, 200, 300]
    records = [EvalRecord(torch.arange(n), n // 2, torch.ones(n, WIDTH)) for n in totals]
    ctx = DistContext(0, 1, 0, torch.device("cpu"))
    evaluate_acceptance(records, predict, block_size=4, num_anchors=256, shapes=shapes, ctx=ctx)
    assert all(ids == feats for ids, feats in seen)
    # One call per record (num_anchors covers every anchor), in record order.
    assert [ids for ids, _ in seen] == [expected_length(pad_to, n) for n in totals]


class FakeRows(list):
    """Just enough of a datasets.Dataset for prepare_features."""

    def select(self, indices):
        return FakeRows(self[i] for i in indices)


class RecordingTarget:
    """Stands in for the target: records the width of every batch it is given."""

    widths: ClassVar[list[int]] = []

    def __init__(self, *args, **kwargs) -> None:
        # The real extractor's target model, as far as prepare-features looks at it.
        self.model = SimpleNamespace(device=torch.device("cpu"))
        RecordingTarget.widths = []

    def __call__(self, ids, mask):
        RecordingTarget.widths.append(ids.shape[1])
        batch, length = ids.shape
        return torch.zeros(batch, length, 3 * HIDDEN), torch.zeros(batch, length, HIDDEN)


@pytest.mark.parametrize("policy", POLICIES)
def test_prepare_features_runs_the_target_on_the_runs_pad_lengths(policy, tmp_path, monkeypatch):
    import specdraft.trainer.data as data_module
    import specdraft.trainer.models as models_module
    from specdraft.trainer.data import DataReport
    from specdraft.trainer.features.prepare import prepare_features

    lengths = [50, 60, 70, 200, 210, 220, 300, 310]
    rows = FakeRows(
        {"input_ids": list(range(n)), "loss_mask": [1] * n, "sample_id": i}
        for i, n in enumerate(lengths)
    )
    report = DataReport(source="fake")
    monkeypatch.setattr(data_module, "build_dataset", lambda *a, **k: (rows, report))
    monkeypatch.setattr(models_module, "TargetFeatureExtractor", RecordingTarget)
    cfg = config(policy)

    prepare_features(cfg, tmp_path / "features", batch_size=4, progress=False)

    pad_to = ShapePolicy.from_config(cfg).pad_to
    assert len(RecordingTarget.widths) == 2
    for width, batch in zip(RecordingTarget.widths, (lengths[:4], lengths[4:]), strict=True):
        assert width == expected_length(pad_to, max(batch))
