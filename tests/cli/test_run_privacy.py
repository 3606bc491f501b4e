"""What a run writes is its owner's alone (run folder and store 0700, files 0600), without
touching the mode of a folder the user already had: output_dir may be `.` or $HOME."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from disagg_runtime import make_prompts, runtime_config, write_config_toml, write_prompts_jsonl
from train_support import DIST_ENV, one_rank, single_thread, tiny_run, write_config

from specdraft.cli.main import cli


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _shared_with_others(root: Path, *, skip_root: bool) -> list[str]:
    """Every folder and file under `root` that group or other users can read, enter or write."""
    paths = [root, *root.rglob("*")]
    if skip_root:
        paths = paths[1:]
    return [f"{p} {_mode(p):o}" for p in paths if not p.is_symlink() and _mode(p) & 0o077]


@pytest.fixture
def open_umask():
    """The usual 0o022 umask (files 0644) for the test; the caller's is restored after."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.mark.parametrize("existing", [False, True], ids=["new-run-folder", "existing-0755-folder"])
def test_a_local_run_writes_its_folder_checkpoints_and_metrics_privately(
    tiny_target_path, tmp_path, open_umask, existing
):
    run = tmp_path / "projects" / "run"
    if existing:
        run.mkdir(parents=True)
        run.chmod(0o755)
    config = write_config(
        tmp_path / "run.toml",
        tiny_run(
            tiny_target_path,
            run,
            data={"max_samples": 4},
            training={"max_steps": 2, "save_interval": 1},
        ),
    )
    saved = {key: os.environ.pop(key, None) for key in DIST_ENV}
    try:
        done = CliRunner().invoke(cli, ["train", str(config), "--no-progress"])
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    assert done.exit_code == 0, done.output

    checkpoints = sorted((run / "checkpoints").glob("step-*"))
    assert [c.name for c in checkpoints] == ["step-0000001", "step-0000002"]
    assert (run / "metrics.jsonl").is_file() and (run / "summary.json").is_file()
    # The user's folder keeps the mode they gave it; one the run made is 0700.
    assert _mode(run) == (0o755 if existing else 0o700)
    if not existing:
        assert _mode(run.parent) == 0o700  # a missing parent is the run's too
    assert _shared_with_others(run, skip_root=existing) == []
    assert _mode(run / "metrics.jsonl") == 0o600
    assert _mode(checkpoints[-1] / "model.safetensors") == 0o600
    # The private umask was the run's only: this process (a library caller) keeps its own.
    assert os.umask(0o022) == 0o022


def test_a_library_caller_gets_a_private_run_folder_but_keeps_its_umask(
    tiny_target_path, tmp_path, open_umask
):
    from specdraft.config import validate_config
    from specdraft.trainer.train.assembly import build_trainer

    run = tmp_path / "lib-run"
    config = validate_config(
        tiny_run(tiny_target_path, run, data={"max_samples": 4}, training={"max_steps": 1})
    )
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        trainer.writer.close()
    assert _mode(run) == 0o700
    assert os.umask(0o022) == 0o022


@pytest.mark.subprocess
def test_the_producer_keeps_an_existing_run_folders_mode_and_writes_privately(
    tiny_target_path, tmp_path, open_umask
):
    """The producer's entry point on output_dir = an existing 0755 folder (as `.` would be):
    that folder is left alone; its disagg/ folder, secret, ledger and address file are private."""
    run = tmp_path / "home"
    run.mkdir()
    run.chmod(0o755)
    cfg = runtime_config(tiny_target_path, run, world_size=1)
    config = write_config_toml(cfg, tmp_path / "run.toml")
    prompts = write_prompts_jsonl(make_prompts(8), tmp_path / "prompts.jsonl")
    env = {k: v for k, v in os.environ.items() if k not in (*DIST_ENV, "SPECDRAFT_RUN_SECRET")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [
        sys.executable,
        "-m",
        "specdraft.trainer.disagg.producer",
        "--config",
        str(config),
        "--run-dir",
        str(run),
        "--prompts",
        str(prompts),
        # Nothing listens there: the captures fail, but the files are written before that.
        "--capture-url",
        "http://127.0.0.1:9",
        "--port",
        "0",
    ]
    producer = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    address = run / "disagg" / "controller.json"
    try:
        deadline = time.monotonic() + 90
        while not address.exists() and producer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if producer.poll() is None:
            producer.send_signal(signal.SIGTERM)
        _, err = producer.communicate(timeout=60)
    assert address.exists(), err[-3000:]

    assert _mode(run) == 0o755
    assert _mode(run / "disagg") == 0o700
    assert _mode(run / "disagg" / "secret") == 0o600
    assert _mode(address) == 0o600
    assert _shared_with_others(run, skip_root=True) == []
    written = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
    # The ledger is a plain open() file: private only through the entry point's umask.
    assert any("ledger" in name for name in written), sorted(written)


def test_the_runs_own_disagg_folder_is_tightened_if_it_was_left_open(tmp_path, monkeypatch):
    from specdraft.trainer.runtime.private import run_folder
    from specdraft.trainer.runtime.run_secret import ensure_run_secret

    monkeypatch.delenv("SPECDRAFT_RUN_SECRET", raising=False)
    run = tmp_path / "run"
    (run / "disagg").mkdir(parents=True)
    run.chmod(0o755)
    (run / "disagg").chmod(0o755)
    run_folder(run)
    ensure_run_secret(run)
    assert _mode(run) == 0o755
    assert _mode(run / "disagg") == 0o700
    assert _mode(run / "disagg" / "secret") == 0o600
