"""Resume checks what it resumes: a changed data order is refused naming the
field unless allowed by name, a changed learning rate is applied, metrics are not repeated, and
`--resume latest` with nothing to resume says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_support import fit_run, merge, one_rank, single_thread, tiny_run, write_config

from specdraft.config import validate_config
from specdraft.trainer.train.checkpoint import CheckpointMismatch
from specdraft.trainer.train.metrics import read_metrics


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


# 8 samples, micro-batch 2, no accumulation: 4 steps per epoch; checkpoints at steps 2 and 4.
SETTINGS = {"training": {"max_steps": 4, "save_interval": 2}}


def build(settings: dict, **kwargs):
    from specdraft.trainer.train.assembly import build_trainer

    with one_rank() as ctx:
        trainer = build_trainer(validate_config(settings), ctx, progress=False, **kwargs)
        return trainer


fit = fit_run


@pytest.fixture(scope="module")
def finished_run(tiny_target_path, tmp_path_factory):
    """A four-step run with checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("checks")
    settings = tiny_run(tiny_target_path, root / "run", **SETTINGS)
    with single_thread():
        fit(settings)
    return settings


@pytest.fixture
def crashed_run(finished_run, tmp_path):
    """A copy of the run as if killed after step 4 was logged but before it was checkpointed."""
    out = tmp_path / "run"
    shutil.copytree(finished_run["output_dir"], out)
    shutil.rmtree(out / "checkpoints" / "step-0000004")
    return merge(finished_run, {"output_dir": str(out)})


@pytest.mark.parametrize(
    ("change", "field", "saved", "now"),
    [
        ({"micro_batch_size": 4}, "training.micro_batch_size", 2, 4),
        ({"grad_accum_steps": 2}, "training.grad_accum_steps", 1, 2),
        ({"seed": 7}, "training.seed", 42, 7),
    ],
)
def test_a_changed_data_order_is_refused_naming_the_field(crashed_run, change, field, saved, now):
    with pytest.raises(CheckpointMismatch) as caught:
        build(merge(crashed_run, {"training": change}), resume="latest")
    message = str(caught.value)
    assert f"{field}: checkpoint has {saved}, config has {now}" in message
    assert "would repeat some samples and skip others" in message
    assert f"--allow-changed {field}" in message


def test_an_allowed_change_resumes_at_the_same_share_of_the_epoch(crashed_run):
    settings = merge(crashed_run, {"training": {"micro_batch_size": 1}})
    trainer = build(settings, resume="latest", allow_changed=("training.micro_batch_size",))
    # Step 2 of micro-batches of 2 consumed 4 samples: the resumed epoch is the other 4, one
    # per micro-batch, from its first window on (4 windows left; max_steps = 4 ends it at 4).
    assert (trainer.step, trainer.epoch, trainer.window) == (2, 0, 0)
    assert trainer.source.windows_in_epoch(0) == 4
    assert trainer.total_steps() == 4


def test_a_changed_learning_rate_is_applied_from_the_resumed_step(crashed_run):
    same = build(crashed_run, resume="latest")
    lower = build(merge(crashed_run, {"training": {"learning_rate": 1e-3}}), resume="latest")
    old_lr = same.optimizer.param_groups[0]["lr"]
    new_lr = lower.optimizer.param_groups[0]["lr"]
    assert old_lr > 0
    # The schedule keeps its shape at step 2; its peak is the new one (3e-3 -> 1e-3).
    assert new_lr == pytest.approx(old_lr / 3)
    assert lower.scheduler.base_lrs == [1e-3]
    assert lower.scheduler.get_last_lr() == [new_lr]


def test_metrics_are_not_repeated_after_a_resume(crashed_run):
    metrics = Path(crashed_run["output_dir"]) / "metrics.jsonl"
    assert [row["step"] for row in read_metrics(metrics)] == [1, 2, 3, 4]
    fit(crashed_run, resume="latest")
    assert [row["step"] for row in read_metrics(metrics)] == [1, 2, 3, 4]


def test_resume_latest_with_nothing_to_resume_exits_2_saying_so(tiny_target_path, tmp_path):
    from specdraft.cli.main import cli

    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, tmp_path / "out"))
    done = CliRunner().invoke(cli, ["train", str(config), "--resume", "latest"])
    assert done.exit_code == 2
    assert "--resume latest: there is nothing to resume" in done.output
    assert str(tmp_path / "out" / "checkpoints") in done.output
    assert "drop --resume to start a new run" in done.output
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_allow_changed_names_only_data_order_fields(tiny_target_path, tmp_path):
    from specdraft.cli.main import cli

    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, tmp_path / "out"))
    bad = ["--resume", "latest", "--allow-changed", "training.seed,model.block_size"]
    done = CliRunner().invoke(cli, ["train", str(config), *bad])
    assert done.exit_code == 2
    assert "'model.block_size' cannot be allowed to change" in done.output
    assert "training.micro_batch_size" in done.output  # the list of fields that can


def test_resume_from_latest_in_the_config_starts_fresh_and_says_so(
    tiny_target_path, tmp_path, caplog
):
    # A config that always says 'latest' (a preemptible job's) must start its first launch.
    settings = tiny_run(tiny_target_path, tmp_path / "out", training={"resume_from": "latest"})
    with caplog.at_level("INFO", logger="specdraft.trainer.train.resume"):
        trainer = build(settings)
    assert trainer.step == 0
    assert "no checkpoint in" in caplog.text and "starting a new run" in caplog.text
