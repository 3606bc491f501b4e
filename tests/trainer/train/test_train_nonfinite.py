"""A non-finite loss: before this check a run trained on, exited 0 and checkpointed NaN weights.
Now, by default, the run stops at that step with an error naming the step and the last good
checkpoint and writes nothing from it; with training.nonfinite_loss = 'skip' the step's update
is dropped, counted, and the run finishes with finite weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_support import one_rank, single_thread, tiny_run

from specdraft.config import validate_config
from specdraft.trainer.train.checkpoint import checkpoint_root, step_dir_name
from specdraft.trainer.train.trainer import NonFiniteLossError

BAD_STEP = 2  # 1-based: the second optimizer step sees poisoned target features


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def poison_second_window(trainer) -> None:
    """Make the second optimizer window's target features NaN (corrupt features or overflow)."""
    windows = trainer.source.windows

    def poisoned(epoch, start_window):
        for index, window in enumerate(windows(epoch, start_window), start=start_window):
            if index == BAD_STEP - 1:
                window = [{**b, "hidden_states": b["hidden_states"] * math.nan} for b in window]
            yield window

    trainer.source.windows = poisoned


def run(tiny_target_path, output_dir: Path, **training):
    """Three steps, a checkpoint after each, with the second step poisoned."""
    from specdraft.trainer.train.assembly import build_trainer

    config = validate_config(
        tiny_run(
            tiny_target_path,
            output_dir,
            training={"max_steps": 3, "save_interval": 1, **training},
        )
    )
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        poison_second_window(trainer)
        try:
            return trainer.fit()
        finally:
            trainer.writer.close()


def saved_weights(folder: Path) -> list[torch.Tensor]:
    """The draft weights a checkpoint folder holds (its full fp32 copy)."""
    return list(load_file(str(folder / "model.safetensors")).values())


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_last_checkpoint(
    tiny_target_path, tmp_path
):
    with pytest.raises(NonFiniteLossError) as info:
        run(tiny_target_path, tmp_path / "stop")
    root = checkpoint_root(tmp_path / "stop")
    last_good = root / step_dir_name(BAD_STEP - 1)
    message = str(info.value)
    assert f"step {BAD_STEP}:" in message and "not finite" in message
    assert str(last_good) in message and "nonfinite_loss = 'skip'" in message
    assert info.value.step == BAD_STEP and info.value.last_good == last_good
    # Nothing was saved from the bad step or after it, and the last checkpoint is finite.
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == [
        step_dir_name(BAD_STEP - 1)
    ]
    weights = saved_weights(last_good)
    assert weights and all(torch.isfinite(t).all() for t in weights)


def test_skip_drops_the_step_counts_it_and_finishes_finite(tiny_target_path, tmp_path):
    result = run(tiny_target_path, tmp_path / "skip", nonfinite_loss="skip")
    assert result.final_step == 3
    assert math.isnan(result.history[BAD_STEP - 1].loss)
    assert [math.isfinite(r.loss) for r in result.history] == [True, False, True]
    assert result.history[-1].metrics["train/skipped_steps"] == 1
    final = checkpoint_root(tmp_path / "skip") / step_dir_name(3)
    weights = saved_weights(final)
    assert weights and all(torch.isfinite(t).all() for t in weights)
    lines = (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["train/skipped_steps"] == 1
