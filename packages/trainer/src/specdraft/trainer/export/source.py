"""The draft of a training checkpoint, verified against its manifest: what every format exports."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# What export and eval read from a checkpoint; each must match the checkpoint's manifest.
DRAFT_FILES = ("config.json", "model.safetensors", "trainer_state.json")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ExportError(ValueError):
    """The checkpoint cannot be exported (missing files, unknown architecture)."""


class ExportRefused(ExportError):
    """The user asked for something export will not do (an occupied --out, a head an engine
    cannot build): a usage error, reported with exit code 2."""


def draft_class_for(architecture: str) -> type:
    """The draft model class named by a config's `architectures` entry."""
    from ..models import family_of_architecture

    try:
        return family_of_architecture(architecture).model_class
    except ValueError as exc:
        raise ExportError(str(exc)) from None


def verify_draft_files(folder: Path, *, action: str) -> None:
    """Check the files a draft is read from against the checkpoint's manifest.json."""
    from ..integrity import CorruptFile, verify_files

    # trainer_state.json is read for the run's dtype; only when present (it is optional here).
    names = [
        name for name in DRAFT_FILES if name != "trainer_state.json" or (folder / name).exists()
    ]
    try:
        verify_files(folder, names, action=action)
    except CorruptFile as exc:
        raise ExportError(str(exc)) from None


def load_checkpoint_draft(checkpoint: str | Path, *, action: str = "load") -> torch.nn.Module:
    """The draft of a checkpoint folder (config.json + model.safetensors), in fp32, verified."""
    folder = Path(checkpoint)
    config_file, weights_file = folder / "config.json", folder / "model.safetensors"
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise ExportError(
                f"{folder} is not a specdraft checkpoint: {needed.name} is missing (checkpoints "
                "live in <output_dir>/checkpoints/step-*)"
            )
    verify_draft_files(folder, action=action)
    raw = json.loads(config_file.read_text())
    architecture = (raw.get("architectures") or [None])[0]
    model_class = draft_class_for(str(architecture))
    config = model_class.config_class.from_pretrained(str(folder))
    model = model_class(config).to(torch.float32)
    state = load_file(str(weights_file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ExportError(
            f"{weights_file} does not fit {architecture}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model


def checkpoint_dtype(checkpoint: str | Path) -> str:
    """The model.dtype the run asked for, recorded in the checkpoint's trainer state."""
    state_file = Path(checkpoint) / "trainer_state.json"
    if state_file.is_file():
        return json.loads(state_file.read_text()).get("model_dtype", "bfloat16")
    return "bfloat16"
