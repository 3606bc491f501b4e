"""The checks `specdraft train` makes before any rank starts: the config against its target
(config.json, then the weights' headers), the data paths, and what this machine can run."""

from __future__ import annotations

import json
from pathlib import Path

from specdraft.config import Config, ShapePolicy


def runtime_check_errors(config: Config) -> list[str]:
    """Config checks that need this machine: the tracking backends' packages; fp8_linear needs
    CUDA, FSDP2 and torchao."""
    from .tracking.registry import tracking_errors

    errors = tracking_errors(config)
    return errors + _fp8_errors(config)


def _fp8_errors(config: Config) -> list[str]:
    if not config.training.fp8_linear:
        return []
    from ..backends import Fp8Unavailable, backend_options_from_config, check_fp8_supported
    from ..runtime.distributed import pick_device

    # fp8 support does not depend on shapes: a pad-only policy keeps this check torch-light.
    options = backend_options_from_config(config, pick_device(0), shapes=ShapePolicy())
    try:
        check_fp8_supported(options)
    except Fp8Unavailable as exc:
        return [f"training.fp8_linear = true: {exc}"]
    return []


def target_check_errors(config: Config) -> list[str]:
    """Config checks that need the target (layer ids in range, mask token id, widths)."""
    from specdraft.config.codes import get as code_info
    from specdraft.config.draft_folder import init_from_missing
    from specdraft.config.init_from_rules import init_from_problems
    from specdraft.config.rules import target_problems
    from specdraft.config.target_info import TargetUnreadable, read_target_info

    try:
        info = read_target_info(config.model.target)
    except TargetUnreadable as exc:
        return [
            f"model.target = {config.model.target!r}: cannot read the target ({exc}); "
            "point it at a local HF model folder"
        ]
    errors = []
    for problem in target_problems(config, info) + init_from_problems(config, info):
        if code_info(problem.code).severity == "error":
            key = ".".join(str(p) for p in problem.key)
            errors.append(f"{problem.code} {key}: {problem.message}")
    if config.model.init_from is not None and not Path(config.model.init_from).is_dir():
        errors.append(f"model.init_from: {init_from_missing(config.model.init_from)}")
    return errors


def data_path_errors(config: Config) -> list[str]:
    """The data paths a run cannot read (a folder, a missing file), before the target loads."""
    if config.data.format == "features" or config.deployment.mode == "disaggregated":
        return []  # feature folders are checked by their reader; a producer reads its own data
    from ..data.sources import check_source

    errors = []
    for field, specs in (
        ("data.train_paths", config.data.train_paths),
        ("data.eval_paths", config.data.eval_paths),
    ):
        for spec in specs or ():
            if not spec.startswith("pkg:") and Path(spec).expanduser().is_dir():
                errors.append(
                    f"{field}: {spec!r} is a folder; name the .json / .jsonl conversation files "
                    "in it (or, for offline feature shards, set data.format = 'features')"
                )
                continue
            try:
                check_source(spec, field)
            except (ValueError, OSError) as exc:
                errors.append(str(exc))
    return errors


def target_weight_errors(config: Config) -> list[str]:
    """The target's weights against its config.json (embedding and LM head shapes), read from
    the safetensors headers only: a mismatch is refused before any weight loads."""
    if config.deployment.mode == "disaggregated":
        return []  # the trainer ranks read only the target's head; the capture servers load it
    from ..models.target import EMBED_KEYS, HEAD_KEYS, tensor_files

    folder = Path(config.model.target)
    try:
        text = json.loads((folder / "config.json").read_text())
        text = text.get("text_config", text)
        files = tensor_files(folder)
    except (OSError, ValueError) as exc:
        return [f"model.target = {str(folder)!r}: cannot read its weights ({exc})"]
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    errors = []
    for names in (EMBED_KEYS, HEAD_KEYS):
        name = next((n for n in names if n in files), None)
        if name is None:
            continue
        shape = safetensors_shape(files[name], name)
        if shape is not None and shape != [vocab, hidden]:
            errors.append(
                f"model.target = {str(folder)!r}: {name} in {files[name].name} has shape "
                f"{shape}, its config.json says [vocab_size, hidden_size] = [{vocab}, {hidden}]; "
                "the folder mixes two models: copy the target's config.json and weights together"
            )
    return errors


def safetensors_shape(path: Path, name: str) -> list[int] | None:
    """A tensor's shape from a safetensors file's JSON header (no tensor is read)."""
    try:
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        return [int(d) for d in header[name]["shape"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
