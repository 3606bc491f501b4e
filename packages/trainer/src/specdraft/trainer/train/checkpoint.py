"""Checkpoints: atomic folders with draft weights, sharded model and optimizer, RNG, data order.

Layout of `<output_dir>/checkpoints/step-000120/`:
  model.safetensors   full draft weights (fp32 master copy), written by rank 0
  config.json         the draft's HF config (when the model has one)
  dcp/                torch.distributed.checkpoint shards of model + optimizer (any world size)
  rng/rank<r>.safetensors  every rank's RNG states (tensors + JSON metadata, no pickle)
  trainer_state.json  step, epoch, data position, sampler state, scheduler, the run fingerprint
  manifest.json       sha256 of every other file, verified before a resume reads anything

A checkpoint is written under `.tmp-step-000120` and renamed once complete, so a crash mid-save
never leaves a folder that looks finished. On CPU, a full state dict with `offload_to_cpu` fails
under FSDP1 and hangs the next collective, so full weights are gathered without CPU offload there,
and everything resumable goes through torch.distributed.checkpoint.

Loading never unpickles: RNG states are tensors plus JSON, DCP metadata goes through a restricted
unpickler and optimizer hyper-parameters through `torch.load(weights_only=True)` (see
`safe_dcp.py`), so resuming from a checkpoint someone sent you cannot run their code.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from transformers import PretrainedConfig

from specdraft.config.resume_contract import (
    DATA_ORDER_FIELDS,
    FIELDS_BY_NAME,
    IDENTITY_FIELDS,
    with_defaults,
)

from ..integrity import (
    CorruptFile,
    field_mismatches,
    files_under,
    manifest_problems,
    read_manifest,
    sha256_file,
    unlisted_files,
    write_manifest,
)
from ..runtime import DistContext, barrier
from ..runtime.atomic import fsync_dir, fsync_file
from .safe_dcp import SafeFileSystemReader, SafeLoadPlanner, read_dcp_metadata
from .save_errors import (
    CheckpointSaveFailed,
    agree_on_failure,
    folder_bytes,
    save_failed_message,
)

STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"

# What a resume must agree on is one table, `specdraft.config.resume_contract`: the fields whose
# change makes a checkpoint meaningless (refused, named), and the data-order fields a user may
# allow to change by name (`--allow-changed`; the data position is then carried over).
FINGERPRINT_FIELDS = IDENTITY_FIELDS
# Fields whose values alone do not say what they are (a sha256): a refusal adds the meaning.
_EXPLAINED = {name: FIELDS_BY_NAME[name].meaning for name in ("model.init_from",)}

RNG_FORMAT = "specdraft-rng-1"


class CheckpointMismatch(RuntimeError):
    """The checkpoint was made by a run with different model or data settings."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What resuming needs besides the restored model and optimizer."""

    path: Path
    state: dict[str, Any]
    # Data-order changes the user allowed (`--allow-changed`), one "field: a -> b" line each.
    changes: list[str] = field(default_factory=list)


def checkpoint_root(output_dir: str | Path) -> Path:
    """The folder holding a run's checkpoints."""
    return Path(output_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    """Folder name of the checkpoint at optimizer step `step`."""
    return f"{STEP_PREFIX}{step:07d}"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """A run's published checkpoints (step folders with a trainer_state.json), oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(STEP_PREFIX) and p.is_dir()]
    done = [p for p in done if (p / "trainer_state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def find_latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


class NothingToResume(FileNotFoundError):
    """`--resume latest` was asked for, but the run folder holds no complete checkpoint."""


def nothing_to_resume_message(output_dir: str | Path) -> str:
    """Why `--resume latest` cannot resume, and what to do instead."""
    return (
        f"--resume latest: there is nothing to resume, {checkpoint_root(output_dir)} holds no "
        "complete checkpoint (a run writes one every training.save_interval steps); drop "
        "--resume to start a new run, or pass --resume <checkpoints/step-* folder>"
    )


def resolve_resume(
    resume_from: str | None, output_dir: str | Path, *, required: bool = False
) -> Path | None:
    """Turn training.resume_from ('latest', a folder, or None) into a checkpoint folder.

    'latest' with no checkpoint is None (a config that always says 'latest' starts its first
    launch fresh) unless `required` (the user typed `--resume latest`): then it is an error.
    """
    if resume_from is None:
        return None
    if resume_from == "latest":
        latest = find_latest(output_dir)
        if latest is None and required:
            raise NothingToResume(nothing_to_resume_message(output_dir))
        return latest
    path = Path(resume_from)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"training.resume_from = {resume_from!r} is not a complete checkpoint folder "
            "(no trainer_state.json); use 'latest' or a checkpoints/step-* folder"
        )
    return path


def check_fingerprint(
    saved: dict[str, Any],
    current: dict[str, Any],
    path: Path,
    *,
    allow_changed: tuple[str, ...] = (),
) -> list[str]:
    """Refuse a checkpoint whose run fingerprint differs, naming every differing field.

    Data-order fields may differ when named in `allow_changed`; those changes are returned (one
    line each) for the run to log. Fields a checkpoint predates read as their default.
    """
    saved = with_defaults(saved)

    def lines(names: Iterable[str]) -> list[str]:
        return field_mismatches(
            saved, current, names, found_label="checkpoint has", expected_label="config has"
        )

    def line(name: str) -> str:
        return lines([name])[0]

    # The config's side leaves a field at its default out as well (run_fingerprint), and an
    # identity field with a default other than None ("data.labels": "tokens") reads as it.
    diffs = field_mismatches(
        saved,
        with_defaults(current),
        FINGERPRINT_FIELDS,
        found_label="checkpoint has",
        expected_label="config has",
        notes=_EXPLAINED,
    )
    order = [f for f in DATA_ORDER_FIELDS if f in current and saved.get(f) != current.get(f)]
    refused = [f for f in order if f not in allow_changed]
    if diffs:
        raise CheckpointMismatch(
            f"cannot resume from {path}: it was made with different settings\n  "
            + "\n  ".join(diffs + lines(refused))
            + "\nresume with the original settings, or start a new run (new output_dir)"
        )
    if refused:
        raise CheckpointMismatch(
            f"cannot resume from {path}: the data order changed, so the resumed run would repeat "
            "some samples and skip others\n  "
            + "\n  ".join(f"{line(f)} ({DATA_ORDER_FIELDS[f]})" for f in refused)
            + "\nresume with the original settings, start a new run (new output_dir), or accept "
            f"the change with --allow-changed {','.join(refused)}"
        )
    return lines(order)


def rng_file(folder: Path, rank: int) -> Path:
    """Where rank `rank`'s RNG states live in a checkpoint folder."""
    return folder / "rng" / f"rank{rank}.safetensors"


def save_rng_state(path: Path) -> None:
    """Write this process's torch, CUDA, numpy and Python RNG states as tensors + JSON."""
    version, mt_state, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    tensors = {
        "torch": torch.get_rng_state(),
        # Mersenne-Twister words are below 2**32: int64 holds them exactly.
        "python": torch.tensor(mt_state, dtype=torch.int64),
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{index}"] = state
    meta = {
        "format": RNG_FORMAT,
        "python_version": version,
        "python_gauss_next": gauss_next,
        "numpy_name": name,
        "numpy_pos": int(pos),
        "numpy_has_gauss": int(has_gauss),
        "numpy_cached_gaussian": float(cached_gaussian),
    }
    save_file(tensors, str(path), metadata={"rng": json.dumps(meta)})


def load_rng_state(path: Path) -> None:
    """Restore the RNG states `save_rng_state` wrote; a malformed file is an error naming it."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = json.loads((handle.metadata() or {})["rng"])
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        if meta.get("format") != RNG_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {RNG_FORMAT!r}")
        mt_state = tuple(int(v) for v in tensors["python"].tolist())
        gauss = meta["python_gauss_next"]
        python_state = (
            int(meta["python_version"]),
            mt_state,
            None if gauss is None else float(gauss),
        )
        numpy_state = (
            str(meta["numpy_name"]),
            tensors["numpy"].numpy().astype(np.uint32),
            int(meta["numpy_pos"]),
            int(meta["numpy_has_gauss"]),
            float(meta["numpy_cached_gaussian"]),
        )
        torch_state = tensors["torch"]
        if torch_state.dtype != torch.uint8:
            raise ValueError(f"torch state has dtype {torch_state.dtype}, expected uint8")
    except Exception as exc:  # any malformed field: name the file, never half-restore
        raise CorruptFile(f"{path}: not a readable specdraft RNG state ({exc})") from None
    torch.set_rng_state(torch_state)
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    cuda = sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k[5:]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])


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
    draft_config: PretrainedConfig | None = None,
) -> Path:
    """Write the checkpoint of optimizer step `step` atomically; return its folder.

    A write that fails on any rank (a full disk, an I/O error) raises `CheckpointSaveFailed` on
    every rank, after the partial folder is removed; the ranks agree after each phase, so none
    waits in a collective for a rank that failed.
    """
    root = checkpoint_root(output_dir)
    final = root / step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{step_dir_name(step)}"

    def phase(work: Any) -> Any:
        error: BaseException | None = None
        result = None
        try:
            result = work()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            error = exc  # any rank's failure is every rank's: see agree_on_failure
        needed = checkpoint_bytes_needed(root, model, ctx) if error is not None else 0
        failed = agree_on_failure(error, tmp, ctx, needed)
        if failed is not None:
            if ctx.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            needed = needed or checkpoint_bytes_needed(root, model, ctx)
            raise CheckpointSaveFailed(step, save_failed_message(step, failed, tmp, needed))
        return result

    def start() -> None:
        if ctx.is_main:
            if tmp.exists():  # leftover of a crash during an earlier save of this step
                shutil.rmtree(tmp)
            (tmp / "rng").mkdir(parents=True)

    def weights() -> None:
        full = full_model_state(model, ctx)  # a collective, on every rank
        if ctx.is_main:
            cpu = {k: v.detach().to("cpu").contiguous() for k, v in full.items()}
            write_checkpoint_file(tmp / "model.safetensors", cpu)
            if draft_config is not None:
                (tmp / "config.json").write_text(draft_config.to_json_string())

    def shards() -> None:
        # DCP gathers every rank's write result: a failed write raises on every rank alike.
        dcp.save(
            {
                "model": get_model_state_dict(model),
                "optim": get_optimizer_state_dict(model, optimizer),
            },
            checkpoint_id=str(tmp / "dcp"),
        )
        save_rng_state(rng_file(tmp, ctx.rank))

    def publish(digests: dict[str, str]) -> None:
        if ctx.is_main:
            payload = dict(state, step=step, world_size=ctx.world_size)
            (tmp / "trainer_state.json").write_text(json.dumps(payload, indent=2, sort_keys=True))
            # Last, over every rank's files: the manifest is published by the same rename.
            write_manifest(tmp, digests)
            fsync_file(tmp / "trainer_state.json")
            fsync_dir(tmp)
            if final.exists():
                trash = root / f"{TMP_PREFIX}old-{step_dir_name(step)}"
                final.rename(trash)
                shutil.rmtree(trash)
            tmp.rename(final)
            fsync_dir(root)

    phase(start)
    phase(weights)
    phase(shards)
    # A phase of its own: its listing must come after every rank's writes (the phase before
    # ends in a collective). Listed during them, another rank's safetensors temp file could be
    # renamed away before this rank opens it to fsync (ENOENT).
    phase(lambda: sync_folder_files(tmp, ctx))
    digests = _hash_shared(tmp, ctx)
    phase(lambda: publish(digests))
    return final


def write_checkpoint_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write one safetensors file of a checkpoint (the seam a full-disk test breaks)."""
    save_file(tensors, str(path), metadata={"format": "pt"})


def sync_folder_files(folder: Path, ctx: DistContext) -> None:
    """fsync this rank's share of the files of a checkpoint folder and its sub-folders."""
    names = files_under(folder)
    for name in names[ctx.rank :: ctx.world_size]:
        fsync_file(folder / name)
    if ctx.is_main:
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            fsync_dir(sub)


def checkpoint_bytes_needed(root: Path, model: nn.Module, ctx: DistContext) -> int:
    """What one checkpoint takes: the newest one's size, else 16 bytes per parameter (fp32
    weights twice, two AdamW moments)."""
    latest = find_latest(root.parent)
    if latest is not None:
        return folder_bytes(latest)
    local = sum(p.numel() for p in model.parameters())
    return 16 * local * max(1, ctx.world_size)


def _hash_shared(folder: Path, ctx: DistContext) -> dict[str, str]:
    """sha256 of every file in `folder`, each rank hashing a share (a collective)."""
    names = files_under(folder)
    digests = {name: sha256_file(folder / name) for name in names[ctx.rank :: ctx.world_size]}
    if dist.is_initialized() and ctx.world_size > 1:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, digests)
        digests = {name: digest for part in gathered for name, digest in part.items()}
    return digests


def verify_checkpoint(path: Path, ctx: DistContext) -> None:
    """Check every file of a checkpoint against its manifest (the ranks split the hashing).

    Every rank raises the same error, naming each corrupted file, so none waits in a collective.
    """
    try:
        names = sorted(read_manifest(path))
        mine = names[ctx.rank :: ctx.world_size]
        problems = manifest_problems(path, mine)
        if ctx.is_main:
            # Files present but never listed: only rank 0 lists the folder.
            problems = unlisted_files(path) + problems
    except CorruptFile as exc:
        problems = [str(exc)]
    if dist.is_initialized() and ctx.world_size > 1:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, problems)
        problems = sorted({p for part in gathered for p in part})
    if problems:
        raise CorruptFile(
            f"cannot resume from {path}: it does not match the checksums written with it\n  "
            + "\n  ".join(problems)
            + "\nresume from an earlier checkpoint (--resume <checkpoints/step-* folder>) or copy "
            "this one again"
        )


def load_checkpoint(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ctx: DistContext,
    fingerprint: dict[str, Any],
    allow_changed: tuple[str, ...] = (),
    verified: bool = False,
) -> LoadedCheckpoint:
    """Verify `path` (unless the caller just did), check its fingerprint, then restore model,
    optimizer and RNG from it."""
    if not verified:
        verify_checkpoint(path, ctx)
    state = json.loads((path / "trainer_state.json").read_text())
    changes = check_fingerprint(
        state.get("fingerprint", {}), fingerprint, path, allow_changed=allow_changed
    )
    # Checked here first so an unsafe file is refused with its own error (dcp.load would wrap it
    # in a CheckpointException); dcp.load then reads it again through the same safe reader.
    read_dcp_metadata(path / "dcp" / ".metadata")
    model_state = get_model_state_dict(model)
    optim_state = get_optimizer_state_dict(model, optimizer)
    payload = {"model": model_state, "optim": optim_state}
    dcp.load(
        payload,
        storage_reader=SafeFileSystemReader(str(path / "dcp")),
        planner=SafeLoadPlanner(),
    )
    set_model_state_dict(model, payload["model"])
    set_optimizer_state_dict(model, optimizer, payload["optim"])
    rng = rng_file(path, ctx.rank)
    if rng.is_file():
        load_rng_state(rng)
    elif state.get("world_size") == ctx.world_size:
        legacy = rng.with_suffix(".pt")
        hint = (
            f" ({legacy.name} is an older pickle format that specdraft does not load)"
            if legacy.exists()
            else ""
        )
        raise CorruptFile(
            f"cannot resume from {path}: {rng} is missing{hint}; every rank's RNG state is "
            "needed for an exact resume: resume from an earlier checkpoint, or copy this one again"
        )
    # else: a new world size (allowed with --allow-changed deployment.world_size): the new ranks
    # have no saved RNG state and keep their fresh one.
    barrier()
    return LoadedCheckpoint(path, state, changes)
