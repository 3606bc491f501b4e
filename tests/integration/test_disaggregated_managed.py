"""One managed-local disaggregated run on CPU (embedded capture server, embedded store, producer,
2 trainer ranks) against the offline path on the same data and seed.

The offline path is `deployment.mode = "local"`: each rank runs the target in-process on its
padded micro-batches. Both paths plan the same samples per window with the same sampler, pad
with the same policy and draw the same anchors (a function of seed, sample id and loss mask),
so they differ only in where the target features come from: the capture server runs each
prompt alone at its own length, the local path the padded batch. Causal attention makes the
real tokens' features equal up to float rounding, hence a relative tolerance of 1e-4 on the
losses (measured: about 1e-6).
"""

from __future__ import annotations

from collections import Counter

import pytest
from disagg_runs import (
    BUCKETS,
    COUNTERS,
    MAX_INFLIGHT,
    SAMPLES_PER_STEP,
    STEPS,
    ledger_state,
    planned_samples,
    session_data,
    shared_run,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LOSS_RTOL = 1e-4


@pytest.fixture(scope="module")
def online(tmp_path_factory):
    return shared_run(tmp_path_factory, "online")


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    return shared_run(tmp_path_factory, "offline", ("deployment.mode=local",))


def test_the_managed_run_trains_every_step_and_stops_its_services(online):
    from specdraft.trainer.disagg.wire.windows import read_controller_address
    from specdraft.trainer.runtime.http_client import HttpFailure, call_json

    assert online.summary["final_step"] == STEPS
    assert sorted(online.by_step()) == list(range(1, STEPS + 1))
    logs = {p.name for p in (online.run_dir / "logs").glob("*.log")}
    assert {"capture0.log", "producer.log"} <= logs
    # Stopped at the end: the producer's controller no longer answers.
    url = read_controller_address(online.run_dir)
    assert url is not None
    with pytest.raises(HttpFailure):
        call_json("GET", f"{url}/health", timeout=2.0)


def test_the_loss_matches_the_offline_path_step_by_step(online, offline):
    got, want = online.by_step(), offline.by_step()
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=LOSS_RTOL), step
        # Same samples and same anchors: the loss weights agree to rounding.
        assert got[step]["loss_weight"] == pytest.approx(want[step]["loss_weight"], rel=1e-6)
        assert got[step]["accuracy"] == pytest.approx(want[step]["accuracy"], abs=1e-3)


def test_both_batch_sources_pad_to_the_same_buckets(online, offline):
    """The static buckets reach both call sites: rank 0's micro-batches have the same padded
    lengths online and offline, and each is the smallest bucket that fits its samples."""
    from specdraft.collate import resolve_static_length

    got, want = online.by_step(), offline.by_step()
    for step in want:
        assert got[step]["data/pad_lengths"] == want[step]["data/pad_lengths"], step
    seen = {n for row in got.values() for n in row["data/pad_lengths"]}
    assert seen <= set(BUCKETS)
    assert len(seen) > 1, f"the run padded only to {seen}: the test data no longer mixes lengths"
    # From the ledger, the lengths of the samples rank 0 trained in each micro-batch.
    state = ledger_state(online.run_dir)
    for index in range(STEPS):
        rank0 = state.steps[index].published[0]
        longest = [max(ref["seq_len"] for ref in micro) for micro in rank0]
        expected = [resolve_static_length(n, BUCKETS) for n in longest]
        assert got[index + 1]["data/pad_lengths"] == expected, index


def test_every_planned_sample_trains_exactly_once(online, tmp_path_factory):
    """Ledger audit: the acknowledged windows hold each planned sample once and nothing else,
    and every object was removed from the store once its window was trained."""
    from specdraft.trainer.disagg.producer.ledger import trained_sample_counts

    state = ledger_state(online.run_dir)
    assert all(state.is_trained(step) for step in range(STEPS))
    counts = trained_sample_counts(state)
    assert counts == {0: planned_samples(online.run_dir, session_data(tmp_path_factory))}
    assert sum(counts[0].values()) == STEPS * SAMPLES_PER_STEP
    assert set(counts[0].values()) == {1}
    assert not state.live
    leftovers = [p for p in (online.run_dir / "feature-store").rglob("*") if p.is_file()]
    assert leftovers == []


def test_the_runtime_counters_are_logged_every_step(online):
    rows = [online.by_step()[step] for step in range(1, STEPS + 1)]
    for row in rows:
        missing = [name for name in COUNTERS if name not in row]
        assert not missing, f"step {row['step']} lacks {missing}"
        assert row["perf/train_compute_ms"] > 0 and row["perf/data_wait_ms"] >= 0
        # The data wait is the wait for the producer plus the read from the store.
        parts = row["perf/window_wait_ms"] + row["perf/store_read_ms"]
        assert parts <= row["perf/data_wait_ms"] + 1e-3
        assert row["perf/samples_per_s"] > 0
        assert 0 <= row["producer/inflight"] <= MAX_INFLIGHT
        assert row["producer/max_outstanding"] <= row["producer/high_watermark"]
        assert row["store/bytes_resident"] >= 0
    # Captures happened before the first step was logged, and keep being counted.
    assert rows[0]["producer/capture_latency_ms"] > 0
    captures = [row["producer/captures"] for row in rows]
    assert captures == sorted(captures) and captures[-1] >= STEPS * SAMPLES_PER_STEP
    assert rows[-1]["producer/trained_steps"] == STEPS
    assert Counter(row["producer/capture_failures"] for row in rows) == Counter({0.0: STEPS})
