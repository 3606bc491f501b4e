"""Checkpoint retention and recovery: `training.keep_last_checkpoints` (with milestones every
`keep_every_n_steps`) prunes after each save but never the checkpoint the run resumed from;
`--resume latest` skips a corrupt newest checkpoint naming it and why; and every refusal a user
can fix (no checkpoint verifies, other settings) is one error with exit 2, no traceback."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_support import DIST_ENV, fit_run, merge, one_rank, single_thread, tiny_run, write_config

from specdraft.config import validate_config


@pytest.fixture(autouse=True)
def _one_thread():
    saved = {key: os.environ.pop(key, None) for key in DIST_ENV}
    with single_thread():
        yield
    os.environ.update({k: v for k, v in saved.items() if v is not None})


fit = fit_run


def steps(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())


# 8 samples, micro-batch 2: four steps per epoch, two epochs; a checkpoint every step.
EVERY_STEP = {"training": {"max_steps": 4, "save_interval": 1, "num_epochs": 2}}


def test_keep_last_prunes_old_checkpoints_but_keeps_milestones(tiny_target_path, tmp_path):
    retention = {"training": {"keep_last_checkpoints": 2, "keep_every_n_steps": 2}}
    fit(merge(tiny_run(tiny_target_path, tmp_path / "run", **EVERY_STEP), retention))
    # The newest two (3, 4) and the milestones (2, 4); step 1 is gone, no trash left behind.
    assert steps(tmp_path / "run") == [2, 3, 4]


def test_the_checkpoint_a_run_resumed_from_is_never_pruned(tiny_target_path, tmp_path):
    settings = merge(
        tiny_run(tiny_target_path, tmp_path / "run", **EVERY_STEP),
        {"training": {"keep_last_checkpoints": 1}},
    )
    fit(settings)
    assert steps(tmp_path / "run") == [4]
    fit(merge(settings, {"training": {"max_steps": 6}}), resume="latest")
    assert steps(tmp_path / "run") == [4, 6]  # 5 was pruned, 4 (resumed from) stays


@pytest.fixture(scope="module")
def two_checkpoints(tiny_target_path, tmp_path_factory):
    """A finished four-step run with checkpoints at steps 2 and 4 (copied per test)."""
    root = tmp_path_factory.mktemp("recovery")
    settings = tiny_run(
        tiny_target_path, root / "run", training={"max_steps": 4, "save_interval": 2}
    )
    with single_thread():
        fit(settings)
    return settings


@pytest.fixture
def copied(two_checkpoints, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(two_checkpoints["output_dir"], out)
    return merge(two_checkpoints, {"output_dir": str(out)}), out


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_latest_skips_a_corrupt_newest_checkpoint_naming_it(copied, caplog):
    from specdraft.trainer.train.assembly import build_trainer

    settings, out = copied
    newest = out / "checkpoints" / "step-0000004"
    flip_a_byte(newest / "model.safetensors")
    with caplog.at_level(logging.WARNING), one_rank() as ctx:
        trainer = build_trainer(validate_config(settings), ctx, progress=False, resume="latest")
        trainer.writer.close()
    assert trainer.step == 2
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"skipping {newest}, it does not verify" in text
    assert "model.safetensors: content differs from its checksum" in text
    assert "the newest checkpoint that verifies (1 newer skipped)" in text


def train_cli(config: Path, *args: str):
    from specdraft.cli.main import cli

    return CliRunner().invoke(cli, ["train", str(config), "--no-progress", *args])


def test_no_checkpoint_that_verifies_is_one_error_with_exit_2(copied, tmp_path):
    settings, out = copied
    for step in ("step-0000002", "step-0000004"):
        flip_a_byte(out / "checkpoints" / step / "model.safetensors")
    done = train_cli(write_config(tmp_path / "run.toml", settings), "--resume", "latest")
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.output
    error = [line for line in done.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1
    assert "no checkpoint in" in error[0] and "step-0000002:" in error[0]
    assert "step-0000004:" in error[0]


def test_a_resume_with_other_settings_exits_2_without_a_traceback(copied, tmp_path):
    settings, _ = copied
    changed = merge(settings, {"training": {"num_anchors": 16}})
    done = train_cli(write_config(tmp_path / "run.toml", changed), "--resume", "latest")
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.output
    assert "num_anchors: checkpoint has 8, config has 16" in done.output
