"""A run resumed on another number of ranks (`--allow-changed deployment.world_size`) trains
every sample of the epoch exactly once, says so in its log (0 repeated, 0 skipped), and
`specdraft audit RUN_DIR` confirms it from the record of the samples each step trained; the
audit also catches a record with a sample trained twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from train_support import DIST_ENV, one_rank, single_thread, tiny_run, write_config

from specdraft.cli.main import cli
from specdraft.config import validate_config


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.mark.slow
def test_a_resume_on_two_ranks_trains_each_sample_once_and_the_audit_says_so(
    tiny_target_path, tmp_path
):
    # Anchor-grouped: the order whose windows depend on the rank count (the other orders are
    # checked against every change in tests/collate/test_sampler_elastic_resume.py).
    from specdraft.trainer.train.assembly import build_trainer

    run = tmp_path / "run"
    data = {"max_samples": 40, "anchor_grouped": True}
    training = {"grad_accum_steps": 2, "num_epochs": 2, "save_interval": 3, "max_steps": 3}
    settings = tiny_run(tiny_target_path, run, data=data, training=training)
    # One rank, three steps (12 of the 40 samples of epoch 0), then a checkpoint.
    with single_thread(), one_rank() as ctx:
        trainer = build_trainer(validate_config(settings), ctx, progress=False)
        trainer.fit()
        trainer.writer.close()
    config = write_config(tmp_path / "run.toml", settings)
    resumed = subprocess.run(
        [
            *(sys.executable, "-m", "specdraft.cli", "train", str(config), "--no-progress"),
            *("--nproc-per-node", "2", "--resume", "latest"),
            *("--allow-changed", "deployment.world_size", "--set", "training.max_steps=100"),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "exact, the resumed epoch 0 trains the 28 samples" in resumed.stderr
    assert "(0 repeated, 0 skipped)" in resumed.stderr

    done = CliRunner().invoke(cli, ["audit", str(run)])
    assert done.exit_code == 0, done.output
    assert "epoch 0: 40 of 40 samples trained once, 0 more than once, 0 never" in done.output
    assert "epoch 1: 40 of 40 samples trained once" in done.output
    assert "every sample trained exactly once per epoch" in done.output


def test_the_audit_catches_a_sample_trained_twice_and_one_never(tmp_path):
    rows = [
        {"step": 1, "epoch": 0, "of": 4, "ids": [0, 1]},
        {"step": 2, "epoch": 0, "of": 4, "ids": [1, 2]},
        {"step": 3, "epoch": 1, "of": 4, "ids": [3, 2]},
    ]
    (tmp_path / "trained-samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = CliRunner().invoke(cli, ["audit", str(tmp_path)])
    assert done.exit_code == 1, done.output
    assert "epoch 0: 2 of 4 samples trained once, 1 more than once (e.g. [1]), 1 never" in (
        done.output
    )
    assert "epoch 1 (in progress): 2 of 4 samples trained so far" in done.output
    assert "NOT exactly once" in done.output


def test_the_audit_of_a_folder_without_a_record_exits_2(tmp_path):
    done = CliRunner().invoke(cli, ["audit", str(tmp_path)])
    assert done.exit_code == 2
    assert "no record of trained samples" in done.output
