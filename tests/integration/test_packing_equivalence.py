"""Sequence packing across accumulation and backends: one process accumulating 4 micro-batches,
FSDP1 x2 and FSDP2 x2 accumulating 2 each give the same packed loss curve.

The packed plan is a flat list of documents per micro-batch, dealt to ranks and windows like an
unpacked one, so every optimizer window holds the same documents in the same rows whatever the
world size; anchors are drawn per row from (seed, sample id, position). The loss is the exact
token-weighted mean of the window, so the curves agree up to float summation order (as in
test_distributed_equivalence.py, whose tolerances these are).
"""

from __future__ import annotations

import math

import pytest
from backend_runs import run_probe, write_config, write_conversations

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

LOSS_RTOL = 1e-5
GRAD_NORM_RTOL = 1e-4
PACKED = {"packing": True, "num_draft_layers": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process (accumulation 4) and two ranks (accumulation 2) on FSDP1 and FSDP2."""
    folder = tmp_path_factory.mktemp("packing-equivalence")
    data = write_conversations(folder / "data" / "conversations.jsonl")
    config = write_config(folder, data, **PACKED)
    (one,) = run_probe(1, config, [[f"output_dir={folder / 'one'}"]])
    sets = [
        [f"training.backend={backend}", "training.grad_accum_steps=2", f"output_dir={folder / b}"]
        for backend, b in (("fsdp1", "fsdp1"), ("fsdp2", "fsdp2"))
    ]
    fsdp1, fsdp2 = run_probe(2, config, sets)
    return {"one": one, "fsdp1": fsdp1, "fsdp2": fsdp2}


def test_the_packed_run_packs_several_conversations_per_row(runs):
    one = runs["one"]
    assert "error" not in one, one
    # Throughput counts conversations: all 32 once, and a full step's 8 rows (2 x 4) hold more
    # than 8 of them (the last step takes what is left).
    assert sum(one["samples"]) == 32
    assert one["samples"][0] > 8, one["samples"]
    # Every micro-batch pads to a planned length; anchors per conversation are logged.
    assert {n for step in one["pad_lengths"] for n in step} <= {128, 256}
    assert all(a is not None and a > 0 for a in one["anchors_per_conversation"])


@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_two_ranks_follow_the_one_process_packed_loss_curve(runs, backend):
    reference, run = runs["one"], runs[backend]
    assert "error" not in run, run
    assert run["steps"] == reference["steps"] >= 3
    assert run["samples"] == reference["samples"]
    pairs = (
        ("loss_weight", 1e-6),
        ("loss", LOSS_RTOL),
        ("grad_norm", GRAD_NORM_RTOL),
        ("anchors_per_conversation", 1e-9),
    )
    for key, rtol in pairs:
        for step, (a, b) in enumerate(zip(run[key], reference[key], strict=True), start=1):
            assert math.isclose(a, b, rel_tol=rtol), f"{backend} x2 {key} at step {step}: {a}, {b}"
