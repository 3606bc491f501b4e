"""Checkpoints: atomic folders with draft weights, sharded model and optimizer, RNG, data order.

Layout of `<output_dir>/checkpoints/step-000120/`:
  model.safetensors   full draft weights (fp32 master copy), written by rank 0
  config.json         the draft's HF config (when the model has one)
  dcp/                torch.distributed.checkpoint shards of model + optimizer (any world size)
  rng/rank<r>.pt      every rank's RNG states
  trainer_state.json  step, epoch, data position, scheduler, the run fingerprint

A checkpoint is written under `.tmp-step-000120` and renamed once complete, so a crash mid-save
never leaves a folder that looks finished. On CPU, a full state dict with `offload_to_cpu` fails
under FSDP1 and hangs the next collective, so full weights are gathered without CPU offload there,
and everything resumable goes through torch.distributed.checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..runtime import DistContext

STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"

# Fields whose change makes a checkpoint meaningless for this run; resume refuses and names them.
FINGERPRINT_FIELDS = (
    "algorithm",
    "block_size",
    "num_anchors",
    "target_layer_ids",
    "num_draft_layers",
    "mask_token_id",
    "max_length",
    "data",
)


class CheckpointMismatch(RuntimeError):
    """The checkpoint was made by a run with different model or data settings."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What resuming needs besides the restored model and optimizer."""

    path: Path
    state: dict[str, Any]


def checkpoint_root(output_dir: str | Path) -> Path:
    """The folder holding a run's checkpoints."""
    return Path(output_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    """Folder name of the checkpoint at optimizer step `step`."""
    return f"{STEP_PREFIX}{step:07d}"


def find_latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if p.name.startswith(STEP_PREFIX) and p.is_dir()]
    done = [p for p in done if (p / "trainer_state.json").is_file()]
    return max(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]), default=None)


def resolve_resume(resume_from: str | None, output_dir: str | Path) -> Path | None:
    """Turn training.resume_from ('latest', a folder, or None) into a checkpoint folder."""
    if resume_from is None:
        return None
    if resume_from == "latest":
        return find_latest(output_dir)
    path = Path(resume_from)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"training.resume_from = {resume_from!r} is not a complete checkpoint folder "
            "(no trainer_state.json); use 'latest' or a checkpoints/step-* folder"
        )
    return path


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose run fingerprint differs, naming every differing field."""
    diffs = [
        f"{field}: checkpoint has {saved.get(field)!r}, config has {current.get(field)!r}"
        for field in FINGERPRINT_FIELDS
        if saved.get(field) != current.get(field)
    ]
    if diffs:
        raise CheckpointMismatch(
            f"cannot resume from {path}: it was made with different settings\n  "
            + "\n  ".join(diffs)
            + "\nresume with the original settings, or start a new run (new output_dir)"
        )


def _rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def full_model_state(model: nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    """Gather the unsharded draft weights (a collective: every rank must call it)."""
    options = StateDictOptions(
        full_state_dict=True,
        # CPU offload of a full state dict breaks FSDP1 on CPU (see module docstring).
        cpu_offload=ctx.device.type == "cuda",
    )
    return get_model_state_dict(model, options=options)


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    ctx: DistContext,
    draft_config: Any | None = None,
) -> Path:
    """Write the checkpoint of optimizer step `step` atomically; return its folder."""
    root = checkpoint_root(output_dir)
    final = root / step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{step_dir_name(step)}"
    if ctx.is_main:
        if tmp.exists():  # leftover of a crash during an earlier save of this step
            shutil.rmtree(tmp)
        (tmp / "rng").mkdir(parents=True)
    _barrier()

    weights = full_model_state(model, ctx)
    if ctx.is_main:
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(cpu, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if draft_config is not None and hasattr(draft_config, "to_json_string"):
            (tmp / "config.json").write_text(draft_config.to_json_string())
    del weights

    dcp.save(
        {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
        },
        checkpoint_id=str(tmp / "dcp"),
    )
    torch.save(_rng_state(), tmp / "rng" / f"rank{ctx.rank}.pt")
    _barrier()
    if ctx.is_main:
        payload = dict(state, step=step, world_size=ctx.world_size)
        (tmp / "trainer_state.json").write_text(json.dumps(payload, indent=2, sort_keys=True))
        if final.exists():
            trash = root / f"{TMP_PREFIX}old-{step_dir_name(step)}"
            final.rename(trash)
            shutil.rmtree(trash)
        tmp.rename(final)
    _barrier()
    return final


def load_checkpoint(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ctx: DistContext,
    fingerprint: dict[str, Any],
) -> LoadedCheckpoint:
    """Restore model, optimizer and RNG from `path` after checking its fingerprint."""
    state = json.loads((path / "trainer_state.json").read_text())
    check_fingerprint(state.get("fingerprint", {}), fingerprint, path)
    model_state = get_model_state_dict(model)
    optim_state = get_optimizer_state_dict(model, optimizer)
    payload = {"model": model_state, "optim": optim_state}
    dcp.load(payload, checkpoint_id=str(path / "dcp"))
    set_model_state_dict(model, payload["model"])
    set_optimizer_state_dict(model, optimizer, payload["optim"])
    rng_file = path / "rng" / f"rank{ctx.rank}.pt"
    # A different world size has no RNG file for the new ranks; they keep their fresh state.
    if rng_file.is_file() and state.get("world_size") == ctx.world_size:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    _barrier()
    return LoadedCheckpoint(path, state)
