"""A packed run saved at step 2 and resumed from that checkpoint ends on the same weights, bit for
bit, as the run that went on, across an epoch boundary.

The packed plan is a flat list of documents per micro-batch, so the sampler's saved position
(epoch, micro-step) restores it like an unpacked one; its fingerprint records packing. Two
`specdraft train` runs: the whole run (it writes the step-2 checkpoint) and a resume from a copy
of that checkpoint in another run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from backend_runs import write_conversations
from train_support import DIST_ENV, tiny_run, write_config

pytestmark = [pytest.mark.slow]

MAX_STEPS = 6
SAVE_AT = 2


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"  # the same kernels in both runs
    argv = [sys.executable, "-m", "specdraft.cli", "train", str(config), "--no-progress", *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400)


def step(run: Path, number: int) -> Path:
    return run / "checkpoints" / f"step-{number:07d}"


def test_a_packed_run_resumed_from_a_checkpoint_ends_on_the_same_weights(tmp_path):
    from specdraft.trainer.assets import build_tiny_target

    # 16 conversations, short and long: packed into 2 rows per micro-batch, 3 steps an epoch.
    data = write_conversations(tmp_path / "data" / "conversations.jsonl", count=16)
    settings = {
        "data": {"train_paths": [str(data)], "max_length": 256, "cache_dir": str(tmp_path / "c")},
        "training": {
            "packing": True,
            "num_epochs": 2,
            "max_steps": MAX_STEPS,
            "save_interval": SAVE_AT,
            "warmup_ratio": 0.2,
            "lr_scheduler": "cosine",
        },
    }
    target = build_tiny_target()
    whole = write_config(tmp_path / "whole.toml", tiny_run(target, tmp_path / "whole", **settings))
    resumed = write_config(
        tmp_path / "again.toml", tiny_run(target, tmp_path / "again", **settings)
    )

    done = train(whole)
    assert done.returncode == 0, done.stderr[-3000:]
    # The saved sampler state is a packed one, and the run fingerprint records packing.
    state = json.loads((step(tmp_path / "whole", SAVE_AT) / "trainer_state.json").read_text())
    assert state["fingerprint"]["training.packing"] is True
    assert state["epoch"] == 0
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["final_step"] == MAX_STEPS

    shutil.copytree(step(tmp_path / "whole", SAVE_AT), step(tmp_path / "again", SAVE_AT))
    again = train(resumed, "--resume", "latest")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr

    final = "model.safetensors"
    want = (step(tmp_path / "whole", MAX_STEPS) / final).read_bytes()
    assert (step(tmp_path / "again", MAX_STEPS) / final).read_bytes() == want
    # The resumed part crossed into epoch 2 (otherwise the boundary was not tested).
    last = json.loads((step(tmp_path / "whole", MAX_STEPS) / "trainer_state.json").read_text())
    assert last["epoch"] == 1

    # Resuming the packed checkpoint without packing is refused, naming the field.
    refused = train(resumed, "--resume", "latest", "--set", "training.packing=false")
    assert refused.returncode != 0
    assert "training.packing" in refused.stderr
