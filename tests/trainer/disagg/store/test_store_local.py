"""Feature-store keys, the embedded (local) store, and tensor I/O through the store."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import DisaggregatedConfig
from specdraft.trainer.disagg.store import (
    LocalFeatureStore,
    StoreError,
    StoreKeyMissing,
    local_store_root,
    open_store,
    read_sample,
    tensors_to_store,
)
from specdraft.trainer.disagg.store.tensors import tensor_from_bytes
from specdraft.trainer.disagg.wire import (
    TENSOR_NAMES,
    CaptureRequest,
    TensorMeta,
    capture_spec,
    parse_sample_key,
    sample_key,
)
from specdraft.trainer.runtime.atomic import is_temp_name

runs = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)
ids = st.integers(min_value=0, max_value=10**12)


@given(runs, ids, ids, st.sampled_from(TENSOR_NAMES))
def test_sample_key_has_the_documented_form_and_parses_back(run, sample, attempt, name):
    key = sample_key(run, sample, attempt, name)
    assert key == f"{run}/{sample}/g{attempt}/{name}"
    assert parse_sample_key(key) == (run, sample, attempt, name)


@pytest.mark.parametrize(
    ("run", "sample", "attempt", "name", "message"),
    [
        ("a/b", 1, 0, "input_ids", "run id"),
        ("", 1, 0, "input_ids", "run id"),
        ("run", -1, 0, "input_ids", "sample_id"),
        ("run", 1, -2, "input_ids", "attempt"),
        ("run", True, 0, "input_ids", "sample_id"),
        ("run", 1, 0, "logits", "tensor name"),
    ],
)
def test_sample_key_rejects_what_cannot_key_an_object(run, sample, attempt, name, message):
    with pytest.raises(ValueError, match=message):
        sample_key(run, sample, attempt, name)


def test_local_store_round_trip_and_missing_keys(tmp_path):
    store = LocalFeatureStore(tmp_path / "fs")
    key = sample_key("run", 3, 1, "hidden_states")
    assert not store.exists(key)
    with pytest.raises(StoreKeyMissing, match="run/3/g1/hidden_states") as info:
        store.get(key)
    assert isinstance(info.value, KeyError)  # callers may catch it as a KeyError
    store.put(key, b"abc")
    store.put(key, memoryview(b"replaced"))
    assert store.exists(key) and store.get(key) == b"replaced"
    store.remove(key)
    store.remove(key)  # idempotent: the producer may remove an attempt that never landed
    assert not store.exists(key)
    # Empty attempt and sample folders are pruned, so long runs leave no directory litter.
    assert list((tmp_path / "fs").iterdir()) == [tmp_path / "fs" / "run"]
    assert list((tmp_path / "fs" / "run").iterdir()) == []


@pytest.mark.parametrize(
    "key", ["../escape", "run/../../x", "/abs/x", "run//x", "run/.a.123.0123abcd.tmp"]
)
def test_local_store_keeps_keys_inside_its_folder(tmp_path, key):
    store = LocalFeatureStore(tmp_path / "fs")
    with pytest.raises(ValueError, match="not a valid feature-store key"):
        store.put(key, b"x")


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "remove"]),
            st.integers(0, 3),
            st.binary(min_size=0, max_size=64),
        ),
        max_size=25,
    )
)
def test_local_store_behaves_like_a_dict_and_counts_resident_bytes(ops):
    with tempfile.TemporaryDirectory() as folder:
        store = LocalFeatureStore(Path(folder))
        model: dict[str, bytes] = {}
        for op, sample, data in ops:
            key = sample_key("r", sample, 0, "input_ids")
            if op == "put":
                store.put(key, data)
                model[key] = data
            else:
                store.remove(key)
                model.pop(key, None)
            assert store.bytes_resident() == sum(len(v) for v in model.values())
        for sample in range(4):
            key = sample_key("r", sample, 0, "input_ids")
            assert store.exists(key) == (key in model)
            if key in model:
                assert store.get(key) == model[key]


def test_local_store_readers_never_see_a_partial_object(tmp_path):
    """A reader racing a writer gets a whole old or whole new object, never a torn one."""
    store = LocalFeatureStore(tmp_path / "fs")
    key = sample_key("run", 0, 0, "hidden_states")
    size = 2 << 20
    store.put(key, bytes([0]) * size)
    stop = threading.Event()
    torn: list[str] = []

    def read() -> None:
        reads = 0
        while not stop.is_set() or reads < 20:
            data = store.get(key)
            reads += 1
            if len(data) != size or data.count(data[:1]) != size:
                torn.append(f"{len(data)} bytes, first {data[:1]!r}")
                return

    reader = threading.Thread(target=read)
    reader.start()
    for value in range(1, 40):
        store.put(key, bytes([value]) * size)
    stop.set()
    reader.join(timeout=60)
    assert not torn, torn
    # No temporary file is left behind, and none is mistaken for an object.
    leftovers = [p.name for p in (tmp_path / "fs").rglob("*") if is_temp_name(p.name)]
    assert leftovers == []


def test_open_store_gives_the_local_store_under_the_run_folder(tmp_path):
    store = open_store(DisaggregatedConfig(), tmp_path, role="trainer")
    assert isinstance(store, LocalFeatureStore)
    assert store.root == local_store_root(tmp_path)
    with pytest.raises(ValueError, match="store role"):
        open_store(DisaggregatedConfig(), tmp_path, role="janitor")


def _sample(seq_len: int, width: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.arange(seq_len, dtype=torch.int64) * 7,
        "loss_mask": (torch.arange(seq_len) % 2).to(torch.int64),
        "hidden_states": torch.randn(seq_len, 2 * width).to(dtype),
        "target_last_hidden_states": torch.randn(seq_len, width).to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("algorithm", ["dflash2", "dspark"])
def test_tensors_round_trip_through_the_store_bit_exactly(tmp_path, dtype, algorithm):
    store = LocalFeatureStore(tmp_path)
    spec = capture_spec([1, 3], 8, algorithm=algorithm)
    tensors = _sample(5, 8, dtype)
    request = CaptureRequest(
        "run", 9, 2, tensors["input_ids"].tolist(), tensors["loss_mask"].tolist()
    )
    reply = tensors_to_store(store, request, spec, tensors)
    assert sorted(reply.keys()) == sorted(sample_key("run", 9, 2, n) for n in spec.tensor_names())
    sample = read_sample(store, reply)
    assert set(sample) == {*spec.tensor_names(), "sample_id"}
    assert int(sample["sample_id"]) == 9
    for name in spec.tensor_names():
        assert sample[name].dtype == tensors[name].dtype
        assert torch.equal(sample[name], tensors[name]), name


class _FailingStore(LocalFeatureStore):
    def put(self, key, data):
        if key.endswith("hidden_states"):
            raise StoreError("disk full")
        super().put(key, data)


def test_a_failed_write_leaves_nothing_resident(tmp_path):
    store = _FailingStore(tmp_path)
    tensors = _sample(4, 8, torch.float32)
    request = CaptureRequest(
        "run", 1, 0, tensors["input_ids"].tolist(), tensors["loss_mask"].tolist()
    )
    with pytest.raises(StoreError, match="disk full"):
        tensors_to_store(store, request, capture_spec([0, 1], 8, algorithm="dflash2"), tensors)
    assert store.bytes_resident() == 0


def test_removing_a_key_sweeps_what_a_killed_writer_left_but_not_a_live_write(tmp_path):
    """A capture server killed between its temporary file and the rename must not leak that
    file (nor keep its folder from being pruned); a write still in flight is left alone."""
    store = LocalFeatureStore(tmp_path)
    store.put("run/2/1/loss_mask", b"x")
    path = store.root / "run" / "2" / "1" / "loss_mask"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    leftover = path.with_name(f".loss_mask.{int(dead.stdout)}.0123abcd.tmp")
    in_flight = path.with_name(f".loss_mask.{os.getpid()}.4567cdef.tmp")
    other_key = path.with_name(f".input_ids.{int(dead.stdout)}.89abcdef.tmp")
    for temp in (leftover, in_flight, other_key):
        temp.write_bytes(b"partial")
    store.remove("run/2/1/loss_mask")
    assert not path.exists() and not leftover.exists()
    assert in_flight.exists() and other_key.exists()
    in_flight.unlink()
    store.remove("run/2/1/input_ids")
    assert not (store.root / "run" / "2").exists(), "the emptied folders are pruned"


def test_the_producer_sweeps_a_killed_writers_files_that_no_remove_would_reach(tmp_path):
    """A capture server killed before its first rename leaves a temporary file under a key
    that never existed and that nobody removes (the sample is captured again under a new
    attempt). The next launch's producer deletes it and prunes its folders; a live write, an
    object and another role's open are left alone."""
    root = local_store_root(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = root / "run" / "3" / "1" / f".hidden_states.{int(dead.stdout)}.0123abcd.tmp"
    live = root / "run" / "4" / "1" / f".input_ids.{os.getpid()}.4567cdef.tmp"
    for temp in (orphan, live):
        temp.parent.mkdir(parents=True)
        temp.write_bytes(b"partial")
    LocalFeatureStore(root).put("run/5/1/loss_mask", b"kept")
    open_store(DisaggregatedConfig(), tmp_path, role="trainer")
    assert orphan.exists(), "only the producer sweeps"
    store = open_store(DisaggregatedConfig(), tmp_path, role="producer")
    assert not orphan.exists() and not (root / "run" / "3").exists()
    assert live.exists()
    assert store.get("run/5/1/loss_mask") == b"kept"
    assert store.sweep_dead_writes() == 0


def test_a_damaged_object_is_reported_not_misread(tmp_path):
    meta = TensorMeta("hidden_states", "run/1/g0/hidden_states", (4, 8), "bfloat16")
    with pytest.raises(StoreError, match=r"holds 10 bytes.*needs 64"):
        tensor_from_bytes(os.urandom(10), meta)
