"""Shared bits of the disaggregated-runtime tests: a tiny random target and configs for it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch
from tiny_targets import save_random_qwen3

from specdraft.config import Config

HIDDEN = 64
NUM_LAYERS = 4
VOCAB = 256


def build_random_target(folder: Path, *, seed: int = 0) -> Path:
    """Save a random Qwen3ForCausalLM (hidden 64, 4 layers) as a local HF folder."""
    save_random_qwen3(
        folder,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_layers=NUM_LAYERS,
        head_dim=16,
        max_positions=512,
        seed=seed,
    )
    return folder


def reference_features(
    target: Path, input_ids: list[int], layer_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features straight from transformers: hidden_states[k+1] per layer, and the last state."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([input_ids]), output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[k + 1][0] for k in layer_ids], dim=-1)
    return hidden, out.hidden_states[-1][0]


def make_config(
    target: Path,
    output_dir: Path,
    *,
    algorithm: str = "dflash2",
    layer_ids: tuple[int, ...] = (0, 2),
    dtype: str = "float32",
    disaggregated: dict[str, Any] | None = None,
) -> Config:
    """A valid config for the tiny target with the disaggregated runtime."""
    model: dict[str, Any] = {
        "target": str(target),
        "algorithm": algorithm,
        "target_layer_ids": list(layer_ids),
        "mask_token_id": 5,
        "dtype": dtype,
        "block_size": 4,
        "dflash2": {"selector_gold_policy": "exclude"},
    }
    return Config.model_validate(
        {
            "run_id": "testrun",
            "output_dir": str(output_dir),
            "model": model,
            "data": {"train_paths": ["unused.jsonl"], "max_length": 128},
            "training": {"loss_decay_gamma": 4.0},
            "deployment": {"mode": "disaggregated", "disaggregated": disaggregated or {}},
        }
    )


def unshare_problem() -> str | None:
    """Why `unshare -n` (a private network namespace for Mooncake) cannot run here, or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed (util-linux, iproute2)"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"unshare -n is not permitted here: {probe.stderr.strip()}"
    return None
