"""A disaggregated run whose trainers restart from a checkpoint older than their last
acknowledgement: each sample still trains exactly once, and the run ends on the weights of an
uninterrupted run.

The crash is staged, so it is exact: a copy of the session's uninterrupted run (4 steps,
checkpoints after steps 2 and 4, every step acknowledged) loses its step-4 checkpoint, as if the
trainers had died after acknowledging step 4 but before saving it. The launch resumes from step
2 with a new producer (replaying the copied ledger): the producer rolls back the acknowledged
steps 3 and 4, captures their samples again and delivers them again. (The copy stands in for a
first launch of its own: the same ledger and checkpoints, one launch of every service fewer.)
"""

from __future__ import annotations

import shutil

import pytest
import torch
from disagg_runs import (
    STEPS,
    ledger_state,
    planned_samples,
    session_data,
    shared_run,
    train,
)
from safetensors.torch import load_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_a_trainer_restarted_from_an_older_checkpoint_trains_each_sample_once(
    tmp_path, tmp_path_factory
):
    from specdraft.trainer.disagg.producer.ledger import read_ledger, trained_sample_counts
    from specdraft.trainer.disagg.producer.producer import ledger_path

    data = session_data(tmp_path_factory)
    whole = shared_run(tmp_path_factory, "online")
    run_dir = tmp_path / "run"
    shutil.copytree(whole.run_dir, run_dir)
    checkpoints = run_dir / "checkpoints"
    assert {p.name for p in checkpoints.iterdir()} >= {"step-0000002", f"step-{STEPS:07d}"}
    shutil.rmtree(checkpoints / f"step-{STEPS:07d}")
    # What the checks below read of the relaunch must come from the relaunch.
    for copied in ("metrics.jsonl", "summary.json"):
        (run_dir / copied).unlink()

    second = train(run_dir, data, resume="latest")
    assert second.summary["final_step"] == STEPS

    records = read_ledger(ledger_path(run_dir))
    resumes = [r for r in records if r["ev"] == "resume"]
    # First launch: a fresh start (nothing to roll back); second: back to the checkpoint.
    assert [(r["step"], r["rolled"]) for r in resumes] == [(0, []), (2, [2, 3])]
    state = ledger_state(run_dir)
    assert trained_sample_counts(state) == {0: planned_samples(run_dir, data)}
    # Steps 3 and 4 (indices 2 and 3) were captured twice: under a new attempt after the rollback.
    recaptured = {r["sample_id"] for r in records if r["ev"] == "capture" and r["attempt"] > 0}
    rolled = {
        sid
        for index in (2, 3)
        for rank in state.steps[index].published
        for micro in rank
        for sid in micro_ids(micro)
    }
    assert recaptured == rolled

    # The same weights as the run that was never interrupted (same data, seed and schedule).
    want = load_file(str(whole.run_dir / "checkpoints" / f"step-{STEPS:07d}" / "model.safetensors"))
    got = load_file(str(run_dir / "checkpoints" / f"step-{STEPS:07d}" / "model.safetensors"))
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    # And the re-trained steps logged the same losses.
    for step in range(3, STEPS + 1):
        assert second.by_step()[step]["loss"] == pytest.approx(
            whole.by_step()[step]["loss"], rel=1e-5
        )


def micro_ids(micro: list[dict]) -> list[int]:
    """Sample ids of one published micro-batch."""
    return [ref["sample_id"] for ref in micro]
