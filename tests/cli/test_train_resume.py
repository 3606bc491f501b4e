"""`specdraft train` killed with SIGKILL between checkpoints and resumed with `--resume latest`
ends with the same weights, bit for bit, as an uninterrupted run; a resume with other settings
is refused and names the field."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_support import DIST_ENV, tiny_run, write_config

MAX_STEPS = 10
SAVE_INTERVAL = 3
FINAL = f"step-{MAX_STEPS:07d}"
FIRST = f"step-{SAVE_INTERVAL:07d}"


def train_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specdraft.cli", "train", str(config), "--no-progress", *extra]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"  # the same kernels in every run, whatever else runs
    return env


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(config, *extra),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )


def checkpoint(run: Path, name: str) -> Path:
    return run / "checkpoints" / name


@pytest.fixture(scope="module", params=[None, 512], ids=["full-vocab", "draft-vocab"])
def runs(request, tiny_target_path, tmp_path_factory):
    """An uninterrupted run, and a run killed after its first checkpoint then resumed (with the
    target's whole vocabulary, and with a 512-token draft vocabulary)."""
    root = tmp_path_factory.mktemp("resume")
    settings = {
        "model": {"draft_vocab_size": request.param},
        # Five optimizer steps per epoch: the resumed part crosses an epoch boundary.
        "data": {"max_samples": 20},
        "training": {
            "micro_batch_size": 2,
            "grad_accum_steps": 2,
            "num_epochs": 2,
            "max_steps": MAX_STEPS,
            "save_interval": SAVE_INTERVAL,
            "warmup_ratio": 0.2,
            "lr_scheduler": "cosine",
        },
    }
    whole = write_config(
        root / "whole.toml", tiny_run(tiny_target_path, root / "whole", **settings)
    )
    killed = write_config(
        root / "killed.toml", tiny_run(tiny_target_path, root / "killed", **settings)
    )
    done = train(whole)
    assert done.returncode == 0, done.stderr[-3000:]

    process = subprocess.Popen(
        train_command(killed),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    marker = checkpoint(root / "killed", FIRST) / "trainer_state.json"
    while not marker.is_file():
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no first checkpoint within 240 s"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    # Killed between checkpoints: the run had not finished.
    assert not checkpoint(root / "killed", FINAL).exists()
    resumed = train(killed, "--resume", "latest")
    return root, whole, killed, resumed


@pytest.mark.slow
def test_a_run_killed_between_checkpoints_resumes_to_the_same_weights(runs):
    root, _, _, resumed = runs
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    final = "model.safetensors"
    whole = checkpoint(root / "whole", FINAL) / final
    again = checkpoint(root / "killed", FINAL) / final
    assert again.read_bytes() == whole.read_bytes()
    # The optimizer state went through the resume too: the first checkpoint is not the end.
    assert checkpoint(root / "killed", FIRST).is_dir()
    assert (checkpoint(root / "whole", FIRST) / final).read_bytes() != whole.read_bytes()


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_other_settings_naming_the_fields(runs):
    _, _, killed, _ = runs
    other = ["--set", "training.num_anchors=16", "--set", "model.target_layer_ids=[0, 1]"]
    done = train(killed, "--resume", "latest", *other)
    assert done.returncode != 0
    assert "num_anchors: checkpoint has 8, config has 16" in done.stderr
    assert "target_layer_ids: checkpoint has [0, 2], config has [0, 1]" in done.stderr
    assert "start a new run" in done.stderr
