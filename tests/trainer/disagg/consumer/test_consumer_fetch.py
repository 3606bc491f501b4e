"""Reading a window from the store: a store with a batched read (Mooncake's `get_many`) gives
the trainer exactly the rows that object-by-object reads give, in one call per window."""

from __future__ import annotations

import pytest
import torch

from specdraft.trainer.disagg.consumer.fetch import SampleMissing, fetch_micro_batches
from specdraft.trainer.disagg.store import tensors_to_store
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec


class BatchedStore(LocalFeatureStore):
    """The local store with a batched read, as MooncakeFeatureStore has one."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.batches: list[list[str]] = []

    def get_many(self, keys, sizes):
        self.batches.append(list(keys))
        out = [memoryview(self.get(key)) for key in keys]
        assert [len(v) for v in out] == list(sizes)
        return out


def _window(store, lengths_per_micro):
    spec = capture_spec([0, 2], 8, algorithm="dspark")
    generator = torch.Generator().manual_seed(0)
    window, sid = [], 100
    for lengths in lengths_per_micro:
        micro = []
        for length in lengths:
            ids = torch.randint(0, 50, (length,), generator=generator).tolist()
            request = CaptureRequest("run", sid, 0, ids, [0] + [1] * (length - 1))
            tensors = {
                "input_ids": torch.tensor(ids),
                "loss_mask": torch.tensor(request.loss_mask),
                "hidden_states": torch.randn(length, 16, generator=generator),
                "target_last_hidden_states": torch.randn(length, 8, generator=generator),
            }
            micro.append(tensors_to_store(store, request, spec, tensors))
            sid += 1
        window.append(micro)
    return window


def test_a_batched_read_gives_the_same_rows_in_one_call(tmp_path):
    store = BatchedStore(tmp_path)
    window = _window(store, [[5, 9], [3], [7, 2]])
    batched = fetch_micro_batches(store, window)
    plain = fetch_micro_batches(LocalFeatureStore(tmp_path), window)
    assert len(store.batches) == 1 and len(store.batches[0]) == 5 * 4
    assert [[row["sample_id"].item() for row in micro] for micro in batched] == [
        [ref.sample_id for ref in micro] for micro in window
    ]
    for got_micro, want_micro in zip(batched, plain, strict=True):
        for got, want in zip(got_micro, want_micro, strict=True):
            assert got.keys() == want.keys()
            for name in want:
                assert torch.equal(got[name], want[name]), name


def test_a_missing_object_names_its_sample(tmp_path):
    store = BatchedStore(tmp_path)
    window = _window(store, [[4, 6]])
    lost = window[0][1]
    store.remove(lost.tensors[2].key)
    with pytest.raises(SampleMissing, match=f"sample {lost.sample_id} "):
        fetch_micro_batches(store, window)
