"""Small local training runs for the backend tests: data, a tiny config, and the fit probe.

The data is a generated ShareGPT file whose replies are either short or long, so micro-batches
pad to different lengths under each pad policy (real ShareGPT conversations nearly all fill a
small max_length, which would make every pad policy look the same).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Several processes, each importing torch and transformers, on two shared cores; a cold grid
# compile is minutes of that, and several times more on a machine other runs share. Below
# pytest's 600 s per test, so a hang fails with the probe's output.
PROBE_TIMEOUT_S = 540


def write_conversations(path: Path, count: int = 32, seed: int = 0) -> Path:
    """`count` ShareGPT rows, short (< 128 tokens) and long (> 128 tokens) alternating."""
    rng = random.Random(seed)
    text = (
        "a draft model guesses the next tokens of a block while the target checks them and "
        "keeps the longest prefix it agrees with before the next step starts"
    )
    words = text.split(" ")
    rows = []
    for index in range(count):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        length = rng.randint(10, 40) if index % 2 == 0 else rng.randint(110, 180)
        answer = " ".join(rng.choice(words) for _ in range(length))
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"c{index}", "conversations": turns})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_config(
    folder: Path,
    data: Path,
    *,
    max_length: int = 256,
    eval_samples: int = 0,
    num_draft_layers: int = 2,
    **training: Any,
) -> Path:
    """A tiny DFlash2 config on the tiny target: `num_draft_layers` draft layers, buckets
    (128, max_length), 4 steps; `eval_samples` held-out prompts from the same file turn
    evaluation on."""
    from specdraft.trainer.assets import build_tiny_target, tiny_assets_info

    settings: dict[str, Any] = {
        "micro_batch_size": 2,
        "grad_accum_steps": 4,
        "num_anchors": 16,
        "max_steps": 4,
        "log_interval": 1,
        "save_interval": 100,
        "learning_rate": 3e-3,
        "warmup_ratio": 0.0,
        "lr_scheduler": "constant",
        "static_shapes": True,
        "static_shape_buckets": [128],
        **training,
    }
    lines = [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    text = f"""
run_id = "backend-test"
output_dir = "{folder / "run"}"
[model]
target = "{build_tiny_target()}"
algorithm = "dflash2"
block_size = 8
num_draft_layers = {num_draft_layers}
target_layer_ids = [0, 2]
mask_token_id = {tiny_assets_info().mask_token_id}
dtype = "float32"
[model.dflash2]
selector_gold_policy = "insert"
selector_rank = 32
selector_top_k = 8
[data]
train_paths = ["{data}"]
max_length = {max_length}
cache_dir = "{data.parent / "cache"}"
{f'eval_paths = ["{data}"]' if eval_samples else ""}
{f"max_eval_samples = {eval_samples}" if eval_samples else ""}
[training]
{chr(10).join(lines)}
[tracking]
progress_bar = false
"""
    path = folder / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def run_probe(
    nproc: int,
    config: Path,
    override_sets: list[list[str]],
    tweaks: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Fit each override set of `config` in one group of `nproc` ranks; rank 0's reports."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import fit_probe; fit_probe.main()"
    argv = [sys.executable, "-c", code, str(nproc), str(config), json.dumps(override_sets)]
    argv.append(json.dumps(tweaks or {}))
    # Its own session, so a timeout kills the ranks too (killing only the probe left them
    # running, spinning on two cores for the rest of the test session).
    probe = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        start_new_session=True,
    )
    try:
        stdout, stderr = probe.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_pythons(session=probe.pid)
        stdout, stderr = probe.communicate()
        raise AssertionError(
            f"fit probe timed out after {PROBE_TIMEOUT_S} s:\n{stderr[-6000:]}"
        ) from None
    if probe.returncode != 0:
        raise AssertionError(f"fit probe failed ({probe.returncode}):\n{stderr[-6000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def kill_pythons(session: int) -> None:
    """SIGKILL the Python processes of a session (the probe, the agent's ranks), not its compilers.

    A C++ build killed while it links leaves a truncated .so in the Inductor cache, which every
    later compile of that kernel loads and fails on ("file too short"); a compiler left alone
    finishes in seconds and exits.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        # After the parenthesised command name: state, ppid, pgrp, session, ...
        if int(fields[3]) == session and Path(exe).name.startswith("python"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
