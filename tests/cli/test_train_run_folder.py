"""One run per folder: a second `specdraft train` on a folder in use is refused naming the
holder (a dead holder's lock is no obstacle), a fresh run into a folder that holds a run is
refused unless --resume latest or --overwrite (which moves the old files aside, deleting
nothing), and bad data paths or a target whose config disagrees with its weights are refused
with exit 2 before any rank loads the target."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_support import DIST_ENV, single_thread, tiny_run, write_config

from specdraft.cli.main import cli
from specdraft.trainer.train.run_folder import RunFolderError, hold_run_folder


@pytest.fixture(autouse=True)
def _clean():
    saved = {key: os.environ.pop(key, None) for key in DIST_ENV}
    with single_thread():
        yield
    os.environ.update({k: v for k, v in saved.items() if v is not None})


def train(*args: str):
    return CliRunner().invoke(cli, ["train", *args, "--no-progress"])


def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_holder(tiny_target_path, tmp_path):
    run = tmp_path / "run"
    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, run))
    with hold_run_folder(run):
        done = train(str(config))
    assert done.exit_code == 2, done.output
    assert f"output_dir {run} is in use by another specdraft train run" in done.output
    assert f"pid {os.getpid()} on {socket.gethostname()}" in done.output
    assert "Traceback" not in done.output
    assert not (run / "metrics.jsonl").exists()


HOLDER = textwrap.dedent(
    """
    import sys, time
    from specdraft.trainer.train.run_folder import hold_run_folder
    with hold_run_folder(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


@pytest.mark.subprocess
def test_the_lock_of_a_killed_run_is_released_by_the_kernel(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunFolderError, match=f"pid {holder.pid} on"), hold_run_folder(tmp_path):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with hold_run_folder(tmp_path) as lock:  # the stale file does not block
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def used_folder(run: Path) -> None:
    (run / "checkpoints" / "step-0000002").mkdir(parents=True)
    (run / "checkpoints" / "step-0000002" / "trainer_state.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')


def test_a_fresh_run_into_a_used_folder_is_refused(tiny_target_path, tmp_path):
    run = tmp_path / "run"
    used_folder(run)
    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, run))
    done = train(str(config))
    assert done.exit_code == 2, done.output
    assert "already holds a run (1 checkpoint(s) up to step-0000002, metrics.jsonl)" in done.output
    assert "--resume latest" in done.output and "--overwrite" in done.output
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'


def test_overwrite_moves_the_old_run_aside_and_says_where(tiny_target_path, tmp_path):
    run = tmp_path / "run"
    used_folder(run)
    settings = tiny_run(tiny_target_path, run, training={"max_steps": 1})
    config = write_config(tmp_path / "run.toml", settings)
    done = train(str(config), "--overwrite")
    assert done.exit_code == 0, done.output
    (moved,) = run.glob("replaced-*")
    assert f"--overwrite: the previous run's files are now in {moved}" in done.output
    assert (moved / "metrics.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'
    assert (moved / "checkpoints" / "step-0000002" / "trainer_state.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001"]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_data_path_that_is_a_folder_is_refused_before_the_target_loads(
    tiny_target_path, tmp_path
):
    folder = tmp_path / "conversations"
    folder.mkdir()
    settings = tiny_run(tiny_target_path, tmp_path / "run", data={"train_paths": [str(folder)]})
    done = train(str(write_config(tmp_path / "run.toml", settings)))
    assert done.exit_code == 2, done.output
    assert f"data.train_paths: '{folder}' is a folder" in done.output
    assert "Traceback" not in done.output
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_a_target_whose_config_disagrees_with_its_weights_is_refused(tiny_target_path, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(tiny_target_path, target)
    config = json.loads((target / "config.json").read_text())
    config["hidden_size"] = config["hidden_size"] * 2  # a config.json of another model
    (target / "config.json").write_text(json.dumps(config))
    settings = tiny_run(target, tmp_path / "run")
    done = train(str(write_config(tmp_path / "run.toml", settings)))
    assert done.exit_code == 2, done.output
    assert "embed_tokens.weight" in done.output and "has shape" in done.output
    assert "copy the target's config.json and weights together" in done.output
    assert "Traceback" not in done.output
