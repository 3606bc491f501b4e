"""Sequence packing in the trainer's batch sources: the batch builder packs documents into at most
micro_batch_size rows and pads the rest; every batch the trainer runs (real, empty dummy, warm-up
dummies) has the same keys and dtypes, so compiled blocks see one graph set; the in-process target
runs per document, so no document's features ever see another's.

End to end (accumulation, backends, compile, resume, disaggregated): tests/integration/
test_packing_runs.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import ANCHOR_WIDTH
from specdraft.config import ShapePolicy
from specdraft.trainer.train.sources import (
    PACKING_KEYS,
    BatchBuilder,
    BatchShape,
    LocalBatchSource,
    document_features,
    feature_chunks,
)

WIDTH, HIDDEN, MICRO, CAPACITY, NUM_ANCHORS = 6, 2, 2, 64, 8


def policy(packing: bool = True, buckets: tuple[int, ...] | None = None) -> ShapePolicy:
    return ShapePolicy.from_parts(
        static_shapes=True,
        max_length=CAPACITY,
        buckets=buckets,
        num_anchors=NUM_ANCHORS,
        packing=packing,
    )


def builder(shapes: ShapePolicy, with_last_hidden: bool = True) -> BatchBuilder:
    shape = BatchShape(
        micro_batch_size=MICRO,
        feature_width=WIDTH,
        hidden_size=HIDDEN,
        with_last_hidden=with_last_hidden,
        feature_dtype=torch.float32,
        static=True,
    )
    return BatchBuilder(shapes=shapes, shape=shape)


def document(sample_id: int, length: int, *, features: bool = True) -> dict:
    gen = torch.Generator().manual_seed(sample_id)
    doc = {
        "input_ids": torch.randint(1, 90, (length,), generator=gen),
        "loss_mask": torch.ones(length, dtype=torch.long),
        "sample_id": sample_id,
    }
    if features:
        doc["hidden_states"] = torch.randn(length, WIDTH, generator=gen)
        doc["target_last_hidden_states"] = torch.randn(length, HIDDEN, generator=gen)
    return doc


def signature(batch: dict) -> dict:
    """What a compiled graph guards on: keys, and each tensor's dtype and rank."""
    return {
        key: (value.dtype, value.dim()) if isinstance(value, torch.Tensor) else type(value)
        for key, value in batch.items()
    }


def test_a_packed_micro_batch_fills_at_most_micro_batch_size_rows_and_counts_documents():
    # 40 + 20 | 30 + 30 (next-fit): two rows of 64, then nothing more.
    docs = [document(i, n) for i, n in enumerate([40, 20, 30, 30])]
    batch = builder(policy()).collate_rows(docs)
    assert batch["input_ids"].shape == (MICRO, CAPACITY)
    assert batch["num_real"] == batch["num_documents"] == 4
    assert batch["document_ids"][0, :61].tolist() == [0] * 40 + [1] * 20 + [-1]
    assert batch["position_ids"][1, 28:32].tolist() == [28, 29, 0, 1]
    assert batch["document_sample_ids"][1, 29:31].tolist() == [2, 3]


def test_padding_rows_belong_to_no_document():
    # One row of 50 tokens: the second row is padding, with document id -1 everywhere.
    batch = builder(policy()).collate_rows([document(7, 50)])
    assert batch["input_ids"].shape[0] == MICRO
    assert batch["num_real"] == 1
    assert (batch["document_ids"][1] == -1).all()
    assert (batch["loss_mask"][1] == 0).all()
    assert (batch["position_ids"][1] == 0).all()


def test_more_rows_than_micro_batch_size_is_refused():
    docs = [document(i, 40) for i in range(3)]  # three rows of 40: no two share a row
    with pytest.raises(ValueError, match=r"needs 3 rows, more than training\.micro_batch_size = 2"):
        builder(policy()).collate_rows(docs)


@pytest.mark.parametrize("buckets", [None, (32,)])
def test_dummies_and_warm_up_batches_carry_the_packed_keys_of_real_batches(buckets):
    shapes = policy(buckets=buckets)
    build = builder(shapes)
    real = build.to_device(build.collate_rows([document(1, 20), document(2, 30)]))
    want = signature(real)
    for dummy in [build.empty(), *build.warmup_batches()]:
        assert signature(dummy) == want
        assert dummy["input_ids"].shape[0] == MICRO
        assert (dummy["document_ids"] == PACKING_KEYS["document_ids"]).all()
        assert dummy["num_real"] == dummy["num_documents"] == 0
    cells = {(b["input_ids"].shape[1], b[ANCHOR_WIDTH]) for b in build.warmup_batches()}
    assert cells == set(shapes.grid)


def test_unpacked_batches_carry_no_packed_key():
    build = builder(policy(packing=False))
    batches = [build.collate_rows([document(1, 20)]), build.empty(), *build.warmup_batches()]
    for batch in batches:
        assert not set(PACKING_KEYS) & set(batch)
        assert "num_documents" not in batch


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=30),
    budget=st.integers(1, 256),
)
def test_feature_chunks_cover_every_document_once_within_the_budget(lengths, budget):
    chunks = feature_chunks(lengths, budget)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
    for chunk in chunks:
        longest = max(lengths[i] for i in chunk)
        assert lengths[chunk[0]] == longest
        assert len(chunk) == 1 or len(chunk) * longest <= budget


class CountingTarget:
    """The tiny target's features, remembering the batch shapes it ran on."""

    def __init__(self, extractor):
        self.extractor = extractor
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, ids, mask):
        self.shapes.append(tuple(ids.shape))
        return self.extractor(ids, mask)


@pytest.fixture(scope="module")
def target(tiny_qwen3_target):
    from specdraft.trainer.models import TargetFeatureExtractor

    return TargetFeatureExtractor(
        tiny_qwen3_target.model, list(tiny_qwen3_target.layer_ids), dtype=torch.float32
    )


def test_the_in_process_target_never_lets_a_document_see_another(target):
    """Local mode: the features of a document packed with others equal the document alone, and
    changing its row neighbours changes nothing in them."""
    torch.manual_seed(0)
    lengths = [30, 12, 20, 7]
    docs = [document(i, n, features=False) for i, n in enumerate(lengths)]
    counting = CountingTarget(target)
    packed = document_features(
        docs, counting, budget=64, device=torch.device("cpu"), with_last_hidden=True
    )
    # A budget of 64 tokens: the target never ran more than that at once, padded to the longest.
    assert all(rows * length <= 64 or rows == 1 for rows, length in counting.shapes)
    for doc, got in zip(docs, packed, strict=True):
        ids = doc["input_ids"][None]
        alone, last = target(ids, torch.ones_like(ids))
        assert got["hidden_states"].shape == (len(doc["input_ids"]), alone.shape[-1])
        torch.testing.assert_close(got["hidden_states"], alone[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["target_last_hidden_states"], last[0], rtol=1e-5, atol=1e-5)
    # Other neighbours, same document 0: its features are bit-identical (same chunk shape).
    others = [docs[0], *(document(10 + i, n, features=False) for i, n in enumerate(lengths[1:]))]
    again = document_features(
        others, target, budget=64, device=torch.device("cpu"), with_last_hidden=True
    )
    assert torch.equal(again[0]["hidden_states"], packed[0]["hidden_states"])


def test_the_local_source_features_each_document_then_packs(target):
    docs = [document(i, n, features=False) for i, n in enumerate([30, 12, 20])]
    shapes = policy()
    source = LocalBatchSource(
        docs,
        sampler=None,  # batch() reads only the dataset
        builder=builder(shapes, with_last_hidden=False),
        grad_accum_steps=1,
        rank=0,
        features=target,
    )
    batch = source.batch([0, 1, 2])
    assert batch["num_real"] == 3
    assert batch["hidden_states"].shape == (MICRO, CAPACITY, target_width(target))
    # All three share row 0 (62 tokens); document 1 starts at position 30 and its features are
    # its own, not a row's.
    ids = docs[1]["input_ids"][None]
    alone, _ = target(ids, torch.ones_like(ids))
    torch.testing.assert_close(batch["hidden_states"][0, 30:42], alone[0], rtol=1e-5, atol=1e-5)
    assert (batch["hidden_states"][0, 62:] == 0).all()
    assert (batch["hidden_states"][1] == 0).all()


def target_width(target) -> int:
    ids = torch.ones(1, 2, dtype=torch.long)
    return int(target(ids, ids)[0].shape[-1])


def test_offline_features_are_packed_as_they_are():
    """Offline shards (and captured features) are per conversation: the builder concatenates
    them into rows and never runs a target."""

    def no_target(ids, mask):
        raise AssertionError("the target ran on documents that had features")

    docs = [document(i, n) for i, n in enumerate([30, 12])]
    source = LocalBatchSource(
        docs,
        sampler=None,
        builder=builder(policy()),
        grad_accum_steps=1,
        rank=0,
        features=no_target,
    )
    batch = source.batch([0, 1])
    assert torch.equal(batch["hidden_states"][0, :30], docs[0]["hidden_states"])
    assert torch.equal(batch["hidden_states"][0, 30:42], docs[1]["hidden_states"])
    assert torch.equal(
        batch["target_last_hidden_states"][0, 30:42], docs[1]["target_last_hidden_states"]
    )
